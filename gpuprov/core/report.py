"""Human output: per-host progress lines and tables; the JSON report writer and the check of the folders a
run writes into. Machine output lives with each task.

Everything is printed literally: the console reads no rich markup (`[gpu01]`, `[host]:2222` and `[/]` are
text), styles come from `styled`, and control characters in names are escaped (gpuprov.core.errors.literal).
Every task prints through `console()`: the terminal's width on a terminal, PIPE_WIDTH columns in a pipe or a file
(the same for every table of every task, whatever COLUMNS says), and tables made by `table()` never cut a word
(a version pin) while another column can wrap, and fold rather than end in an ellipsis.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuprov.core.errors import InputError, literal

PIPE_WIDTH = 160        # columns of every table printed into a pipe or a file


def console(stderr: bool = False):
    """The rich console every task prints through: text as it is (no markup, no highlighting), the terminal's
    width on a terminal and PIPE_WIDTH otherwise. A closed pipe is left to the program (gpuprov.program.quiet_pipe:
    exit 141, as for any other output), not to rich's own exit 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    stream = sys.stderr if stderr else sys.stdout
    return PipeConsole(stderr=stderr, markup=False, highlight=False, width=None if stream.isatty() else PIPE_WIDTH)


def table(columns: list[str], rows: list[list], *, title: object = None, styles: dict[str, str] | None = None,
          **options):
    """A rich Table whose cells are printed literally (`styled`, the style of a cell's value from `styles`) and
    whose columns never cut a word: rich narrows a column no further than its longest word while another can
    wrap, and past that a column folds (every character kept) instead of ending in an ellipsis; `options` go to
    Table (show_header, title_justify...)."""
    from rich.table import Table

    shown = Table(title=styled(title) if isinstance(title, str) else title, **options)
    for column in columns:
        shown.add_column(column, overflow="fold")
    for row in rows:
        shown.add_row(*(styled(value, (styles or {}).get(str(value))) for value in row))
    return shown


def styled(value: object, style: str | None = None):
    """`value` as rich Text in `style`, with control characters escaped."""
    from rich.text import Text

    return Text(literal(str(value)), style=style or "")


def progress_printer(quiet: bool = False) -> Callable[[object, str], None]:
    """An on_event callback that prints one line per host event on stderr, with elapsed time.

    Events: start, ok, failed, skipped; anything else is a phase of the host's work ("apply 14 changes").
    """
    lock = threading.Lock()
    started: dict[str, float] = {}
    out = console(stderr=True)
    styles = {"ok": "green", "failed": "bold red", "skipped": "yellow", "start": "dim"}

    def on_event(host, event: str) -> None:
        if quiet:
            return
        with lock:
            if event == "start":
                started[host.name] = time.monotonic()
                return
            elapsed = time.monotonic() - started.get(host.name, time.monotonic())
            if event in styles:
                out.print(styled(f"{event:>7}", styles[event]), styled(f"{host.name} ({elapsed:.1f}s)"))
            else:
                out.print(styled(f"{'...':>7} {host.name}: {event} ({elapsed:.1f}s)", "dim"))

    return on_event


def _gpu_summary(facts: dict) -> str:
    models: dict[str, int] = {}
    for gpu in facts.get("pci_gpus", []):
        label = gpu["model"] or f"unknown 10de:{gpu['device_id']}"
        models[label] = models.get(label, 0) + 1
    text = ", ".join(f"{count}x {model}" for model, count in models.items()) or "none"
    if facts.get("nvswitch_count"):
        text += f" + {facts['nvswitch_count']} NVSwitch"
    return text


def _maybe(value, none: str = "-") -> str:
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def facts_rows(facts: dict) -> list[tuple[str, str]]:
    """The readable key/value rows of one host's facts."""
    smi = facts.get("nvidia_smi") or {}
    os_ = facts.get("os") or {}
    docker = facts.get("docker")
    fm = facts.get("fabricmanager")
    return [
        ("OS", f"{_maybe(os_.get('pretty_name'))} ({_maybe(os_.get('key'), 'unsupported')})"),
        ("kernel / arch", f"{_maybe(facts.get('kernel'))} / {_maybe(facts.get('arch'))}"),
        ("CPUs / memory", f"{_maybe(facts.get('cpus'))} / {_maybe(facts.get('mem_total_mib'))} MiB"),
        ("GPUs (PCI)", _gpu_summary(facts)),
        ("nvidia-smi", smi.get("error") or (f"driver {smi.get('driver_version')}, CUDA {smi.get('cuda_version')}, "
                                            f"{len(smi.get('gpus', []))} GPUs" if smi else "not installed")),
        ("loaded module", _maybe(facts.get("loaded_driver_version"), "none")),
        ("NVIDIA packages", f"{len(facts.get('packages', {}))} installed, {len(facts.get('held', []))} held"),
        ("nouveau loaded", _maybe(facts.get("nouveau_loaded"))),
        ("Secure Boot", _maybe(facts.get("secure_boot"), "unknown")),
        ("kernel headers", _maybe(facts.get("kernel_headers"))),
        ("Docker", "not installed" if docker is None else
         f"{docker['version']} ({'active' if docker['active'] else 'inactive'}), "
         f"runtimes: {', '.join(docker['runtimes']) or 'default'}"),
        ("container toolkit", _maybe(facts.get("container_toolkit"), "not installed")),
        ("fabric manager", "not installed" if fm is None else
         f"{_maybe(fm['version'])} ({'active' if fm['active'] else 'inactive'})"),
        ("reboot required", _maybe(facts.get("reboot_required"))),
    ]


def facts_table(outcomes) -> None:
    """One table per host; failed hosts print their error."""
    out = console()
    for outcome in outcomes:
        if not outcome.ok:
            out.print(styled(f"{outcome.host.name}: FAILED", "bold red"))
            out.print(f"{outcome.error}\n")
            continue
        out.print(table(["fact", "value"], [list(row) for row in facts_rows(outcome.value)],
                        title=f"{outcome.host.name} ({outcome.host.address}:{outcome.host.port})", show_header=False,
                        title_justify="left"))
    failed = sum(1 for o in outcomes if not o.ok)
    print(f"{len(outcomes) - failed} hosts answered, {failed} failed", file=sys.stderr)


def print_plan(host: str, plan: list[dict]) -> None:
    """A host's planned changes and their diffs, as --dry-run shows them (reboot, disruptive and refused steps
    marked); every value printed literally."""
    from rich.text import Text

    from gpuprov.core.errors import literal, literal_lines

    out = console()
    out.print(styled(literal(host), "bold"), f": {len(plan)} changes", sep="")
    for change in plan:
        line = Text.assemble(styled(f"  {change['component']:>17} ", "cyan"), styled(change["summary"]))
        if change.get("reboot"):
            line.append(" (reboot)", "yellow")
        if change.get("disruptive"):
            line.append(f" (disruptive: {literal(change['disruptive'])})", "magenta")
        if change.get("refused"):
            line.append(" (refused: work runs here)", "red")
        out.print(line)
        if change.get("diff"):
            out.print("    " + literal_lines(change["diff"].rstrip()).replace("\n", "\n    "))


def print_host(entry: dict, dry_run: bool) -> None:
    """One host of a run above its summary table: notices, the work that refused disruptive steps, the error
    (step, command, hint) and, in a dry run, the plan."""
    from gpuprov.core.errors import literal, literal_lines

    out = console()
    host = literal(entry["host"])
    plan = entry.get("plan")
    changes = plan.get("changes", []) if isinstance(plan, dict) else plan or []
    for notice in entry.get("notices") or []:
        out.print(f"{host}: {literal(notice)}")
    if entry.get("busy") and any(c.get("refused") for c in changes):
        out.print(f"{host}: work runs here, disruptive steps refused (--disrupt overrides):")
        for line in entry["busy"]:
            out.print(f"    {literal(line)}")
    if entry.get("error"):
        out.print(styled(f"{host}: FAILED", "bold red"), literal_lines(entry["error"]["error"]))
        for key in ("step", "command", "hint"):
            if entry["error"].get(key):
                out.print(f"  {key}: " + literal_lines(entry["error"][key]).replace("\n", "\n    "))
    if dry_run and changes:
        print_plan(entry["host"], changes)


def write_json_report(folder: str | Path, kind: str, payload: dict) -> Path:
    """The project's one report writer: reports/<kind>-<UTC timestamp>.json, masked, never overwriting another
    run's report (a second report in the same second gets -2, -3, ...); <kind>-latest.json is replaced
    atomically. Returns the report's path."""
    from gpuprov.core.json_text import dump_json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = dump_json(payload, sort_keys=True)
    path = _create_new(folder, f"{kind}-{_stamp()}", text)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{kind}-latest.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, folder / f"{kind}-latest.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _create_new(folder: Path, base: str, text: str) -> Path:
    """Write `text` to the first of base.json, base-2.json, ... that does not exist (O_EXCL, so two runs
    never take the same name)."""
    attempt = 1
    while True:
        path = folder / (f"{base}.json" if attempt == 1 else f"{base}-{attempt}.json")
        try:
            with open(path, "x", encoding="utf-8") as handle:
                handle.write(text)
            return path
        except FileExistsError:
            attempt += 1


def _stamp() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def summary_table(title: str, rows: list[dict], columns: list[str]) -> None:
    """A table of dict rows (`table`: no word cut), the words of a status in their colour."""
    styles = {"failed": "bold red", "changed": "yellow", "planned": "cyan", "unchanged": "green",
              "fail": "bold red", "warn": "yellow", "pass": "green", "skip": "dim", "required": "bold yellow",
              "error": "bold red", "partial": "cyan"}
    console().print(table(columns, [[str(row.get(column, "")) for column in columns] for row in rows], title=title,
                          styles=styles, title_justify="left"))


def check_folder(setting: str, path: str | Path, *, write: bool) -> bool:
    """Check, before any host is contacted, the folder a setting names (gpuprov.reports, gpuprov.locks): an
    existing folder this user may read and, with `write`, write into; or, missing, one that `write` can create
    (its writer creates it). Returns whether it is missing. InputError (exit 2) naming the setting, the path and
    what to do; nothing is created or changed here."""
    path = Path(path)
    shown = literal(str(path))
    elsewhere = (f"or point {setting} at another folder (invoke.yaml, or INVOKE_GPUPROV_"
                 f"{setting.removeprefix('gpuprov.').upper()}=PATH)" if setting.startswith("gpuprov.") else
                 f"or give {setting} another folder")
    if path.is_dir():
        mode, verb = (os.W_OK | os.X_OK, "write into") if write else (os.R_OK | os.X_OK, "read")
        if not os.access(path, mode):
            raise InputError(f"{setting}: cannot {verb} the folder {shown} (permission denied)",
                             hint=f"give this user access to it, {elsewhere}")
        return False
    if path.exists():
        raise InputError(f"{setting}: {shown} is a file, not a folder", hint=f"move the file away, {elsewhere}")
    if os.path.lexists(path):
        raise InputError(f"{setting}: {shown} is a broken symbolic link (to {literal(os.readlink(path))})",
                         hint=f"create the folder it points to, {elsewhere}")
    if write:
        parent = next(p for p in path.absolute().parents if os.path.lexists(p))
        if not parent.is_dir():
            raise InputError(f"{setting}: cannot create the folder {shown}: {literal(str(parent))} is a file, "
                             "not a folder", hint=f"move the file away, {elsewhere}")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(f"{setting}: cannot create the folder {shown}: no permission to write into "
                             f"{literal(str(parent))}", hint=f"create it with access for this user, {elsewhere}")
    return True


# ------------------------------------------------------------------------------------------- validate reports

def write_report_sibling(json_path: str | Path, kind: str, suffix: str, text: str) -> Path:
    """Another format of a report that write_json_report wrote: the same name with `suffix` (".xml") next to
    it, and <kind>-latest<suffix> replaced atomically. Masked like the JSON."""
    from gpuprov.core.errors import mask_credentials

    json_path = Path(json_path)
    text = mask_credentials(text)
    path = json_path.with_name(json_path.name.removesuffix(".json") + suffix)
    with open(path, "x", encoding="utf-8") as handle:
        handle.write(text)
    replace_file(json_path.parent / f"{kind}-latest{suffix}", text)
    return path


def replace_file(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically: a temporary file in the same folder, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
