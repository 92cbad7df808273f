"""Shared pieces of the task modules: the host options every host task takes, selection, exit codes.

Every task is wrapped in `exits_cleanly`, which checks the gpuprov settings (invoke.yaml, INVOKE_GPUPROV_*)
before the task does anything and turns a GpuprovError into its message and exit code. A task that touches
hosts is declared with `@host_task(help={...})` and takes, besides its own options,
`host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False` (host_task adds
--shard, --verbose, --quiet and --inventory-plugin). A host job's task checks its options, then `open_fleet(...)`
(selection, executor settings with batches, the reports folder), `run_fleet(fleet, Job(...))`
(gpuprov.core.runtime) and `finish(code)`; a read (facts) uses `gather_outcomes`.

Every task is declared with this module's `task` (never Invoke's own): no automatic short flags, the short flags
of SHORT_FLAGS only (one meaning across every task; `-h` stays Invoke's help), and the value names of METAVARS in
`--help`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
from collections.abc import Callable
from contextvars import ContextVar

from invoke import task as invoke_task
from invoke.exceptions import Exit
from invoke.tasks import Task

from gpuprov.core.config import path_setting, settings
from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.core.json_text import dump_json

# -- the command line's conventions: one short flag per long option across every task, value names for --help ------
SHORT_FLAGS = {   # long option -> its short flag; a long option not here has none. Never a letter of Invoke's own
    "host": "H",  # core flags (-c -d -D -e -f -F -h -l -p -r -R -T -V -w): one letter, one meaning on a line
    "group": "g",
    "all": "a",
    "inventory": "i",
    "parallel": "P",
    "json": "j",
    "dry-run": "n",
    "verbose": "v",
    "quiet": "q",
}
SWITCHES = frozenset({"all", "json", "dry-run", "verbose", "quiet"})   # the short flags above that take no value
METAVARS = {   # long option -> the value's name in --help (argparse's way without an entry: the option upper-cased)
    "host": "PATTERN", "group": "NAME", "name": "NAME", "inventory": "PATH", "inventory-plugin": "NAME",
    "reports": "DIR",
    "parallel": "N", "max-fail": "N|P%", "serial": "N|P%|LIST", "batch-window": "N|P%", "max-fail-percentage": "P",
    "shard": "K/N", "only": "LIST", "checks": "LIST", "reboot": "POLICY", "level": "LEVEL", "via": "ssh|slurm",
    "out": "PATH", "output": "PATH", "report": "PATH", "slurm-conf": "PATH", "to-lock": "PATH|previous",
    "image": "IMAGE", "registry": "HOST:PORT", "container": "NAME", "server": "HOST", "prometheus": "URL",
    "partition": "NAME", "qos": "NAME", "nice": "N", "start-deadline": "DURATION", "wait-jobs": "DURATION",
    "batch": "N|P%", "max-unavailable": "N|P%", "canary": "N", "drain": "KIND", "validate": "LEVEL",
    "confirm-timeout": "SECONDS", "interval": "SECONDS", "max-drained": "P%", "hours": "HOURS",
    "threshold": "PERCENT", "gpu": "MODEL", "os": "OS", "gpus": "N", "cuda": "VERSION", "driver": "VERSION",
    "pytorch": "VERSION", "ngc": "TAG", "nccl": "VERSION", "component": "NAME", "hosts": "N", "profile": "LIST",
    "builder": "sdk|buildx",
}
INVENTORY_PLUGINS = ("gpuprov", "ansible")


class GpuprovTask(Task):
    """An Invoke task with the project's short flags (SHORT_FLAGS) and no automatic ones, whose help dict survives
    being read again (Invoke empties it on the first read: a second Program in one process lost every help line)."""

    def __init__(self, *args, **kwargs):
        kwargs["auto_shortflags"] = False
        super().__init__(*args, **kwargs)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict:
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(opts["names"][0])
        if short is not None:
            opts["names"] = [*opts["names"], short]
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list:
        kept = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept


def task(*args, **kwargs):
    """Invoke's @task (with or without arguments) for a GpuprovTask."""
    return invoke_task(*args, klass=GpuprovTask, **kwargs)


def metavar(long_name: str) -> str:
    """The name of an option's value in --help: METAVARS', else the option upper-cased (--registry REGISTRY)."""
    return METAVARS.get(long_name, long_name.upper().replace("-", "_"))


HOST_HELP = {
    "host": "hosts by Ansible pattern, as --limit: a name, a group, gpu*, ~regex, hgx[0:3], a:b (or), a:&b (and), "
            "a:!b (not); quote it in a shell; repeat or give a comma list",
    "group": "group name from the inventory; repeat or give a comma list",
    "all": "every host in the inventory (not together with --host or --group)",
    "inventory": "inventory file (default: gpuprov.inventory in invoke.yaml)",
    "parallel": "hosts worked on at once (default: gpuprov.parallel)",
    "trust_new_hosts": "record unknown host keys (trust on first use)",
}
OUTPUT_HELP = {
    "verbose": "also print each command run on each host, with its exit status and time (stderr)",
    "quiet": "print only errors and the final summary: no progress lines, no per-host notices",
    "inventory_plugin": "how to read --inventory: gpuprov (default: gpuprov's own reader) or ansible (the output "
                        "of ansible-inventory --list: dynamic inventories and vault too)",
}
BATCH_HELP = {
    "serial": "work in batches, each done before the next starts: a count (4), a share (25%) or a list (1,5,20%; "
              "the last repeats), as Ansible's serial",
    "batch_window": "at most this many hosts (or a share) in flight, a new one as soon as one ends (Salt's -b)",
    "max_fail_percentage": "stop after a batch in which more than this share of the hosts failed (a window: of "
                           "the last hosts to end)",
}


def error_document(exc: GpuprovError) -> dict:
    """The JSON form of an error: its fields (to_dict, credentials masked), the exit code and, for errors
    that hold several problems (a config, an inventory, a lock), each problem."""
    document = {**exc.to_dict(), "exit_code": exc.exit_code}
    problems = getattr(exc, "errors", None)
    if isinstance(problems, list):
        document["errors"] = [str(problem) for problem in problems]
    return document


def report_error(exc: GpuprovError, json_: bool = False) -> None:
    """An error as `error: message` on stderr and, with --json (or -j), as the one JSON document on stdout."""
    print(f"error: {exc}", file=sys.stderr)
    if json_:
        print(dump_json(error_document(exc)))


def exits_cleanly(fn: Callable) -> Callable:
    """Check the gpuprov settings before the task runs, then turn a GpuprovError into its message (stderr,
    and the JSON error document on stdout when the task was called with json_=True) and its exit code
    (1 failure, 2 bad input)."""

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        try:
            settings(c)
            return fn(c, *args, **kwargs)
        except GpuprovError as exc:
            report_error(exc, json_=bool(kwargs.get("json_")))
            raise Exit(code=exc.exit_code) from None

    return wrapper


def host_task(help: dict[str, str] | None = None, *, shards: bool = True, **options) -> Callable[[Callable], object]:
    """@task for a task that touches hosts: the shared options' help (HOST_HELP, OUTPUT_HELP) plus the task's own,
    repeatable --host/--group, --shard K/N (sharded; with shards=False the task takes `shard` itself, to refuse
    it), -v/--verbose, -q/--quiet and --inventory-plugin (with_output), and exit codes from errors
    (exits_cleanly); `options` go to @task."""

    def decorate(fn: Callable):
        return task(iterable=["host", "group"],
                    help={**HOST_HELP, "shard": SHARD_HELP, **OUTPUT_HELP, **(help or {})},
                    **options)(exits_cleanly(with_output(sharded(fn) if shards else fn)))

    return decorate


# -- -v/--verbose, -q/--quiet and --inventory-plugin: every host task takes them (host_task) ---------------------
_OUTPUT: ContextVar = ContextVar("gpuprov_output", default=None)          # None, "verbose" or "quiet"
_PLUGIN: ContextVar = ContextVar("gpuprov_inventory_plugin", default=None)


def _add_keywords(fn: Callable, wrapper: Callable, names: dict[str, object]) -> Callable:
    """`wrapper` with the signature of `fn` plus keyword-only `names` (their defaults), for Invoke to read."""
    signature = inspect.signature(fn)
    wrapper.__signature__ = signature.replace(parameters=[
        *signature.parameters.values(),
        *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default) for name, default in names.items())])
    return wrapper


def with_output(fn: Callable) -> Callable:
    """`fn` with `verbose=False, quiet=False, inventory_plugin=None` keywords (-v, -q, --inventory-plugin NAME),
    checked before the task runs (InputError naming the flags) and read by open_fleet, gather_outcomes and
    select_hosts."""

    @functools.wraps(fn)
    def wrapper(c, *args, verbose=False, quiet=False, inventory_plugin=None, **kwargs):
        if verbose and quiet:
            raise InputError("--verbose and --quiet were both given: say which", step="options")
        output = _OUTPUT.set("verbose" if verbose else "quiet" if quiet else None)
        plugin = _PLUGIN.set(check_inventory_plugin(inventory_plugin))
        try:
            return fn(c, *args, **kwargs)
        finally:
            _OUTPUT.reset(output)
            _PLUGIN.reset(plugin)

    return _add_keywords(fn, wrapper, {"verbose": False, "quiet": False, "inventory_plugin": None})


def check_inventory_plugin(name: str | None) -> str | None:
    """--inventory-plugin NAME as given (None when not given); InputError naming the flag and its choices."""
    if name is not None and name not in INVENTORY_PLUGINS:
        raise InputError(f"--inventory-plugin must be one of {', '.join(INVENTORY_PLUGINS)}, not "
                         f"{literal(repr(name))}", step="options",
                         hint="gpuprov reads the file itself; ansible runs ansible-inventory --list on it")
    return name


def output_mode() -> str | None:
    """The running host task's -v/-q: "verbose", "quiet" or None."""
    return _OUTPUT.get()


def inventory_plugin() -> str | None:
    """The running task's --inventory-plugin NAME (checked), None when not given."""
    return _PLUGIN.get()


def read_inventory(c, path, plugin: str | None = None):
    """gpuprov.inventory.load_inventory(path), with `plugin=` only when --inventory-plugin was given (the default
    reader otherwise), then OpenSSH's client config (gpuprov.ssh_config) for what the inventory leaves unset."""
    from gpuprov.inventory import load_inventory
    from gpuprov.inventory.ssh_config import apply_ssh_config

    chosen = check_inventory_plugin(plugin) if plugin is not None else inventory_plugin()
    inv = load_inventory(path) if chosen is None else load_inventory(path, plugin=chosen)
    return apply_ssh_config(inv, path_setting(c, "ssh_config"))


# -- --shard K/N: every host task takes it (host_task); select_hosts keeps the shard's hosts ----------------------
SHARD_HELP = ("work on the K-th of N shards of the selected hosts (1/4 ... 4/4): the names sorted, dealt "
              "round-robin; each shard runs anywhere, invoke reports.merge joins their validate reports")
_SHARD: ContextVar = ContextVar("gpuprov_shard", default=None)


def sharded(fn: Callable) -> Callable:
    """`fn` with a `shard=None` keyword (--shard K/N), checked before the task runs (InputError naming --shard)
    and applied by select_hosts to the task's selection."""
    from gpuprov.core.shards import parse_shard

    @functools.wraps(fn)
    def wrapper(c, *args, shard=None, **kwargs):
        token = _SHARD.set(parse_shard(shard))
        try:
            return fn(c, *args, **kwargs)
        finally:
            _SHARD.reset(token)

    return _add_keywords(fn, wrapper, {"shard": None})


def current_shard():
    """The running task's --shard K/N (gpuprov.core.shards.Shard), None without it."""
    return _SHARD.get()


def warn_budget(hosts: int, parallel: int) -> None:
    """The controller's budget for `hosts` hosts, `parallel` at once (shards.budget_notices), as warnings on stderr
    before any host is contacted."""
    from gpuprov.core.shards import budget_notices

    for notice in budget_notices(hosts, parallel):
        print(f"warning: {notice}", file=sys.stderr)


def split_names(values: list[str] | None, flag: str) -> list[str]:
    """`--host a,b --host c` -> ["a", "b", "c"]; InputError naming `flag` for an empty name (`--host ''`,
    `--name a,,b`): left out, it would widen the selection (no name given selects everything) in silence."""
    names = []
    for value in values or []:
        for name in str(value).split(","):
            if not name.strip():
                raise InputError(f"{flag} {literal(repr(value))} has an empty name", step="select",
                                 hint=f"give {flag} NAME, or a comma list of names without empty items")
            names.append(name.strip())
    return names


def select_hosts(c, host: list[str] | None, group: list[str] | None, all_: bool, inventory: str | None, *,
                 connects: bool = True):
    """Load the inventory and pick the hosts named by --host/--group, or every host with --all (alone), then the
    shard's with --shard K/N (gpuprov.core.shards.shard_hosts).
    Returns (inventory, hosts); InputError (exit 2) for a conflict, an unknown name, an empty selection or, when
    the task `connects` to them, a sudo password variable that is not set (check_sudo_passwords)."""
    inv, chosen, _shard = select_shard(c, host, group, all_, inventory, connects=connects)
    return inv, chosen


def select_shard(c, host: list[str] | None, group: list[str] | None, all_: bool, inventory: str | None, *,
                 connects: bool = True):
    """select_hosts, and the report's `shard` record (gpuprov.core.shards.shard_record: K, N, the selection's size
    and digest) with --shard K/N, None without: (inventory, hosts, shard)."""
    split_names(host, "--host")   # an empty item is refused: it must not widen the selection (Ansible drops it)
    # the --host values whole: a value with a comma splits at commas only (`a:b,c` is `a:b` and `c`, as in Ansible)
    hosts, groups = [str(value) for value in host or []], split_names(group, "--group")
    if all_ and (hosts or groups):
        raise InputError("--all selects every host: give it alone, or name hosts with --host/--group",
                         step="select hosts")
    if inventory is not None and not str(inventory).strip():
        raise InputError("--inventory needs the path of an inventory file, not ''", step="select hosts")
    inv = read_inventory(c, inventory or path_setting(c, "inventory"))
    chosen = inv.select(hosts=hosts, groups=groups, all_=all_)
    shard, record = _SHARD.get(), None
    if shard is not None:   # --shard K/N
        from gpuprov.core.shards import shard_hosts, shard_record

        record = shard_record(shard, chosen)
        chosen = shard_hosts(chosen, shard)
        if output_mode() != "quiet":
            print(f"shard {shard}: {len(chosen)} of the {record['selected']} hosts selected", file=sys.stderr)
    if connects:
        check_sudo_passwords(chosen)
    return inv, chosen, record


def check_sudo_passwords(hosts) -> None:
    """InputError (exit 2), before any host is contacted, when a host's sudo.password_env names a variable that
    is not set and there is no terminal to ask on: the same bad input is the same exit code from every task,
    rather than each such host failing at connect (a terminal asks once per variable, as before)."""
    import os

    broken = sorted({h.sudo_password_env for h in hosts if h.sudo_password_env
                     and any(c in os.environ.get(h.sudo_password_env, "") for c in "\r\n\0")})
    if broken:
        raise InputError(f"the sudo password in {', '.join(broken)} has a line break or NUL: sudo reads one line",
                         step="sudo", hint="export the password alone, without a trailing newline")
    if sys.stdin is not None and sys.stdin.isatty():
        return
    missing: dict[str, list[str]] = {}
    for h in hosts:
        if h.sudo_password_env and h.sudo_password_env not in os.environ:
            missing.setdefault(h.sudo_password_env, []).append(h.name)
    if missing:
        names = "; ".join(f"{name} (for {', '.join(users)})" for name, users in sorted(missing.items()))
        raise InputError(f"the sudo password variable is not set: {names}", step="sudo",
                         hint="export each one (it is never logged), or run from a terminal to be asked")


def whole_number(flag: str, value: str | int, minimum: int, maximum: int | None = None) -> int:
    """A flag's value as a whole number from minimum to maximum (InputError naming the flag otherwise)."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isascii() or not text.isdigit() or int(text) < minimum:
        raise InputError(f"{flag} must be a whole number >= {minimum}, not {value!r}")
    if maximum is not None and int(text) > maximum:
        raise InputError(f"{flag} must be a whole number from {minimum} to {maximum}, not {value!r}")
    return int(text)


def check_output_files(flag: str, paths, *, create_parents: bool = True) -> None:
    """InputError (exit 2) naming `flag` (a flag or a setting) when a file cannot be written at one of `paths`
    (gpuprov.inventory.checks.output_file_problem): checked before anything is written or any host contacted."""
    from pathlib import Path

    from gpuprov.inventory.checks import output_file_problem

    for path in paths:
        problem = output_file_problem(Path(path), create_parents)
        if problem:
            raise InputError(f"{flag}: {literal(problem)}", hint=f"move what is in the way (or create the missing "
                                                                 f"folder), or give {flag} another path")


def parallel_setting(c, parallel: str | int | None) -> int:
    """--parallel, else gpuprov.parallel: a whole number >= 1 (InputError otherwise)."""
    from gpuprov.core.config import KINDS

    return settings(c).parallel if parallel is None else whole_number("--parallel", parallel, 1,
                                                                      KINDS["parallel"].maximum)


def max_fail_setting(max_fail: str | int | None) -> str | None:
    """--max-fail as given, once the executor's failure budget accepts it (InputError otherwise)."""
    from gpuprov.core.executor import failure_budget

    failure_budget(max_fail, 1)
    return None if max_fail is None else str(max_fail)


def only_components(only: str | None, choices: tuple[str, ...] | None = None) -> frozenset[str] | None:
    """--only a,b: the components named (None without --only); InputError for an empty item or an unknown
    name, saying which components there are (`choices`, by default provisioning's)."""
    if only is None:
        return None
    if choices is None:
        from gpuprov.provision.ops import COMPONENTS

        choices = COMPONENTS
    accepted = f"give a comma list of components: {', '.join(choices)}"
    names = [name.strip() for name in str(only).split(",")]
    if "" in names:
        raise InputError(f"--only {only!r} has an empty item; {accepted}")
    for name in names:
        if name not in choices:
            close = difflib.get_close_matches(name, choices, n=1)
            guess = f" (did you mean {close[0]}?)" if close else ""
            raise InputError(f"--only: unknown component {name!r}{guess}; {accepted}")
    return frozenset(names)


def run_settings(c, inv, *, trust_new_hosts: bool = False, parallel: str | int | None = None,
                 max_fail: str | None = None, serial: str | None = None, batch_window: str | None = None,
                 max_fail_percentage: str | None = None):
    """Executor settings from invoke.yaml, the inventory (its known_hosts wins) and the task's flags (batches:
    gpuprov.core.batches.batch_plan, bad values exit 2 before any host is contacted)."""
    from gpuprov.core.batches import batch_plan
    from gpuprov.core.executor import Settings

    config = settings(c)
    if trust_new_hosts:  # new keys are appended to it: a folder there, or a file above it, is found now
        check_output_files("gpuprov.known_hosts" if inv.known_hosts is None else f"known_hosts ({inv.path})",
                           [inv.known_hosts or config.known_hosts])
    return Settings(
        known_hosts=inv.known_hosts or config.known_hosts,
        trust_new=trust_new_hosts,
        parallel=parallel_setting(c, parallel),
        connect_timeout=config.connect_timeout,
        connect_retries=config.connect_retries,
        command_timeout=config.command_timeout,
        max_fail=max_fail_setting(max_fail),
        batches=batch_plan(serial, batch_window, max_fail_percentage),
    )


def open_fleet(c, host, group, all_: bool, inventory, *, parallel=None, trust_new_hosts: bool = False,
               max_fail=None, serial=None, batch_window=None, max_fail_percentage=None, json_: bool = False,
               kind: str | None = None):
    """The fleet a host job runs on: the selected hosts (the shard's with --shard K/N, recorded for the report), the
    executor's settings (batches too), the reports folder (checked, created when missing; `<kind>-latest.json`
    writable) and the progress printer (none with --json or --quiet; --verbose adds each command). A warning on
    stderr, before any host is contacted, when the controller's memory or open files look short for the run
    (shards.budget_notices)."""
    from gpuprov.core.report import check_folder, progress_printer
    from gpuprov.core.runtime import Fleet

    inv, hosts, shard = select_shard(c, host, group, all_, inventory)
    settings = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel, max_fail=max_fail,
                            serial=serial, batch_window=batch_window, max_fail_percentage=max_fail_percentage)
    warn_budget(len(hosts), settings.parallel)
    reports = path_setting(c, "reports")
    new_reports = check_folder("gpuprov.reports", reports, write=True)
    if kind is not None:
        check_output_files("gpuprov.reports", [reports / f"{kind}-latest.json"])
    mode = output_mode()
    return Fleet(inv, hosts, settings, reports, new_reports=new_reports, quiet=json_,
                 on_event=progress_printer(quiet=json_ or mode == "quiet"), shard=shard,
                 verbose=mode == "verbose" and not json_, terse=mode == "quiet")


def finish(code: int) -> None:
    """A host job's exit code, as the task's."""
    if code:
        raise Exit(code=code)


def gather_outcomes(c, inv, hosts, *, trust_new_hosts: bool = False, parallel: str | int | None = None,
                    quiet: bool = False) -> list:
    """Facts of every host, in parallel, with per-host progress (none when `quiet` or with -q; -v adds each command)
    after the controller's budget check (warn_budget): one executor Outcome per host."""
    from gpuprov.core.executor import run_on_hosts
    from gpuprov.core.report import progress_printer
    from gpuprov.core.runtime import echoing
    from gpuprov.facts.gather import gather
    from gpuprov.provision.ops import MANAGED_FILES

    settings = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel)
    warn_budget(len(hosts), settings.parallel)
    mode = output_mode()
    verbose = mode == "verbose" and not quiet
    return run_on_hosts(hosts, lambda conn: gather(echoing(conn) if verbose else conn, MANAGED_FILES), settings,
                        jump_of=inv.jump_host, on_event=progress_printer(quiet=quiet or mode == "quiet"))


def gather_all(c, inv, hosts, *, trust_new_hosts: bool = False, parallel: str | int | None = None,
               quiet: bool = False) -> dict:
    """Facts of every host: {name: facts} or {name: {"error": message}}."""
    outcomes = gather_outcomes(c, inv, hosts, trust_new_hosts=trust_new_hosts, parallel=parallel, quiet=quiet)
    return {o.host.name: o.value if o.ok else {"error": str(o.error)} for o in outcomes}
