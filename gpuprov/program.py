"""The `gpuprov` console script: the same task collection as `invoke` in a checkout, with gpuprov's exit codes.

Invoke's own program exits 1 on a bad command line and crashes on some bad config files; this one checks
every config file and INVOKE_GPUPROV_* variable before Invoke reads them and turns a bad command line into
one `error:` line and exit 2 (with --json or -j, the JSON error document on stdout as well). `TASK -h` prints the
task's help, its options with the names of their values (`--group NAME`). Output into a pipe that closed early
(`| head`) ends quietly with exit 141, as git's and coreutils' do: they die of SIGPIPE, which a shell reports as
128 + 13 = 141, so `set -o pipefail` scripts see the same code from gpuprov as from them (Python ignores SIGPIPE
and would print a BrokenPipeError traceback instead).
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import select
import sys
from collections.abc import Iterable
from pathlib import Path

from invoke import Program
from invoke.exceptions import Exit, ParseError

from gpuprov import __version__
from gpuprov.core.config import ConfigError, check_sources, config_file
from gpuprov.core.errors import InputError
from gpuprov.tasks import namespace
from gpuprov.tasks._common import SHORT_FLAGS, SWITCHES, metavar, report_error

PIPE_CLOSED = 141   # 128 + SIGPIPE: what a shell reports for git or coreutils writing into a closed pipe


class GpuprovProgram(Program):
    """Reads `invoke.yaml` from the working directory, as `invoke` does beside tasks.py."""

    def create_config(self) -> None:
        # /etc/invoke.yaml and ~/.invoke.yaml are read in update_config, once they are checked
        self.config = self.config_class(lazy=True)

    def update_config(self, merge: bool = True) -> None:
        runtime = self.args.config.value or os.environ.get("INVOKE_RUNTIME_CONFIG")
        files = [config_file("/etc/invoke"), config_file("~/.invoke"), config_file(Path.cwd() / "invoke"),
                 Path(runtime) if runtime else None]
        check_before_invoke([path for path in files if path is not None], self.argv)
        self.config.load_base_conf_files()
        self.config.set_project_location(os.getcwd())
        self.config.load_project(merge=False)
        super().update_config(merge)

    def parse_core(self, argv: list[str] | None) -> None:
        plainly(self, lambda: super(GpuprovProgram, self).parse_core(argv))

    def parse_tasks(self) -> None:
        if not help_before_positional(self):
            plainly(self, super().parse_tasks)

    def parse_cleanup(self) -> None:
        plainly(self, super().parse_cleanup)

    def execute(self) -> None:
        quiet_pipe(super().execute)

    def print_task_help(self, name: str) -> None:
        task_help(self, name)

    def print_columns(self, tuples) -> None:
        print_columns(self, tuples)


def quiet_pipe(step) -> None:
    """Run `step` and flush stdout; when stdout's reader went away (`| head`), point stdout at /dev/null (Python's
    flush at exit would fail again) and exit PIPE_CLOSED, with no traceback. Another broken pipe (a subprocess's)
    is raised."""
    try:
        try:
            step()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_closed():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise Exit(code=PIPE_CLOSED) from None


def stdout_closed() -> bool:
    """Whether nobody reads stdout any more: a pipe or socket whose other end closed (poll says POLLERR/POLLHUP)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError):   # stdout closed or replaced by something without a descriptor
        return False


def task_help(program: Program, name: str) -> None:
    """`TASK -h` (or --help TASK): Invoke's layout, with each option's short flag (SHORT_FLAGS) and the name of
    its value (metavar: `-g NAME, --group NAME`), the options sorted by their long name."""
    print(f"Usage: {program.binary} [--core-opts] {name} [--options] [other tasks here ...]\n")
    print("Docstring:")
    docstring = inspect.getdoc(program.collection[name])
    for line in (docstring or "none").splitlines():
        print(program.leading_indent + line if line.strip() else "")
    print("")
    print("Options:")
    rows = option_rows(program.parser.contexts[name])
    if rows:
        program.print_columns(rows)
    else:
        print(program.leading_indent + "none\n")


def print_columns(program: Program, tuples) -> None:
    """Invoke's two columns (flags, help) of --help and --list, wrapped at spaces only: Invoke's wrapper also
    breaks at hyphens and through long words (`burn-` / `in`, `--no-` / `textfile`)."""
    import textwrap

    from invoke.terminals import pty_size

    name_width = max(len(name) for name, _ in tuples)
    indent, padding = program.leading_indent, program.col_padding
    width = max(pty_size()[0] - name_width - program.leading_indent_width - padding - 1, 20)
    wrapper = textwrap.TextWrapper(width=width, break_on_hyphens=False, break_long_words=False)
    for name, help_text in tuples:
        spec = f"{indent}{name}{' ' * (name_width - len(name) + padding)}"
        chunks = wrapper.wrap(help_text or "")
        print(spec + chunks[0] if chunks else spec.rstrip())
        for chunk in chunks[1:]:
            print(" " * len(spec) + chunk)
    print("")


def option_rows(context) -> list[tuple[str, str]]:
    """(flags, help) of each option of a task's parser context, sorted by long name."""
    arguments = {id(arg): arg for arg in context.flags.values()}.values()
    rows = []
    for arg in sorted(arguments, key=lambda arg: arg.names[0]):
        long, short = arg.names[0], [name for name in arg.names[1:] if len(name) == 1]
        if arg.kind is bool:
            negated = f"--no-{long}" in context.inverse_flags
            flags = [*(f"-{letter}" for letter in short), f"--[no-]{long}" if negated else f"--{long}"]
        else:
            value = f"[{metavar(long)}]" if arg.optional else metavar(long)
            flags = [*(f"-{letter} {value}" for letter in short), f"--{long} {value}"]
        rows.append((", ".join(flags), arg.help or ""))
    return rows


def help_before_positional(program: Program) -> bool:
    """`TASK -h` (or --help) where TASK takes a positional argument (inventory.show's host): Invoke's parser would
    take `-h` as that argument's value. Set up the task's help instead (parse_cleanup prints it); False otherwise."""
    parser = program._make_parser()
    tokens = list(program.core.unparsed)
    for token, after in zip(tokens, tokens[1:], strict=False):
        if after in ("-h", "--help") and token in parser.contexts and parser.contexts[token].positional_args:
            program.parser = parser
            program.args.help.value = token
            return True
    return False


def plainly(program: Program, step) -> None:
    """Run a parsing step of Invoke's; its errors become one line and exit 2 (a closed stdout: quiet_pipe)."""
    try:
        quiet_pipe(step)
    except ParseError as exc:
        _refuse(program, _parse_message(program, exc))
    except ValueError:  # Invoke casting the value of a flag whose default is a number
        flag, value = _bad_number(program)
        _refuse(program, f"{flag} must be a whole number, not {value!r}")


def _refuse(program: Program, message: str) -> None:
    report_error(InputError(message), json_=wants_json(program.argv))
    raise Exit(code=2)


def _parse_message(program: Program, exc: ParseError) -> str:
    """Invoke's parse error said plainly: the task, the option, what is close, where the options are listed."""
    context, text, binary = exc.context, str(exc), program.binary
    task = context.name if context is not None and context.name else None
    where, see = (f"{task}: ", f"see: {binary} --help {task}") if task else ("", f"see: {binary} --help")
    unknown = re.fullmatch(r"No idea what '(.*)' is!", text, re.DOTALL)
    if unknown and unknown.group(1).startswith("-"):
        option = unknown.group(1)
        flags = (context or program.initial_context).flags
        return f"{where}unknown option {option!r}{_guess(option, flags)}; {see}"
    if unknown and task:
        word = unknown.group(1)
        return (f"{task}: {word!r} is neither an option of {task} nor a task"
                f"{_guess(word, program.collection.task_names)}; {see}")
    if unknown:
        name = unknown.group(1)
        return f"unknown task {name!r}{_guess(name, program.collection.task_names)}; see: {binary} --list"
    needs = re.match(r"Flag (?:'([^']*)'|<Argument: (\w+))", text)
    if needs and text.endswith("needed value and was not given one!"):
        flag = needs.group(1) or "--" + needs.group(2).replace("_", "-")
        return f"{where}{flag} needs a value; {see}"
    if context is not None and task and context.missing_positional_args:
        missing = ", ".join(f"--{arg.name.replace('_', '-')}" for arg in context.missing_positional_args)
        return f"{task}: {missing} is required; {see}"
    return f"{text} ({see})"


def _bad_number(program: Program) -> tuple[str, str]:
    """The number flag whose value is not a number, and that value, from the command line."""
    parser = getattr(program, "parser", None)
    contexts = [program.initial_context, *(parser.contexts.values() if parser is not None else ())]
    flags = {name: arg for context in contexts for name, arg in context.flags.items() if arg.kind is int}
    tokens = program.argv[1:]
    bad = []
    for index, token in enumerate(tokens):
        name, equals, value = token.partition("=")
        if name in flags:
            value = value if equals else (tokens[index + 1] if index + 1 < len(tokens) else "")
            if not re.fullmatch(r"[+-]?[0-9]+", value.strip()):
                bad.append((name, value))
    return bad[0]  # Invoke casts only the number flags found above: one of them is there


def _guess(name: str, choices: Iterable[str]) -> str:
    """` (did you mean X?)` for the choice closest to a name (options compared without their dashes)."""
    bare = {choice.lstrip("-"): choice for choice in choices}
    close = difflib.get_close_matches(name.lstrip("-"), list(bare), n=1)
    return f" (did you mean {bare[close[0]]}?)" if close else ""


def wants_json(argv: list[str]) -> bool:
    """Whether the command line asked for --json or -j (read from the words, as it may not have parsed; -nj too:
    short switches given together), before any `--` (what follows is a command's, images.run's)."""
    words = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    switches = {SHORT_FLAGS[name] for name in SWITCHES}
    for word in words:
        if word == "--json":
            return True
        letters = word[1:] if word.startswith("-") and not word.startswith("--") else ""
        if "j" in letters and set(letters[:letters.index("j")]) <= switches:
            return True
    return False


def check_before_invoke(files: list[Path], argv: list[str]) -> None:
    """Exit 2 with every problem of these config files and of the INVOKE_GPUPROV_* variables, before Invoke
    reads them (Invoke crashes on a file it cannot parse or merge, and on a number it cannot cast)."""
    try:
        check_sources(files, os.environ)
    except ConfigError as exc:
        report_error(exc, json_=wants_json(argv))
        raise Exit(code=2) from None


def check_project(folder: Path, argv: list[str]) -> None:
    """For the plain `invoke` binary: tasks.py calls this as Invoke imports it, which is before Invoke reads
    the project's invoke.yaml beside it (and INVOKE_RUNTIME_CONFIG's file, and the environment), and before
    Invoke parses the task arguments: those parse errors become one line and exit 2 there too."""
    runtime = os.environ.get("INVOKE_RUNTIME_CONFIG")
    files = [config_file(folder / "invoke"), Path(runtime) if runtime else None]
    check_before_invoke([path for path in files if path is not None], argv)
    _plain_task_parsing(Program)


def _plain_task_parsing(program_class: type[Program]) -> None:
    """Make Invoke's own program (already running, its core options parsed) parse task arguments the way
    GpuprovProgram does. Invoke offers no other hook between loading tasks.py and parsing its arguments."""
    if getattr(program_class, "_gpuprov_plain", False):
        return
    parse_tasks, parse_cleanup, execute = program_class.parse_tasks, program_class.parse_cleanup, program_class.execute
    program_class.parse_tasks = lambda self: help_before_positional(self) or plainly(self, lambda: parse_tasks(self))
    program_class.parse_cleanup = lambda self: plainly(self, lambda: parse_cleanup(self))
    program_class.execute = lambda self: quiet_pipe(lambda: execute(self))
    program_class.print_task_help = task_help
    program_class.print_columns = print_columns
    program_class._gpuprov_plain = True


def main() -> None:
    GpuprovProgram(namespace=namespace(), version=__version__, name="gpuprov", binary="gpuprov").run()
