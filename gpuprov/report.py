"""Human output: per-host progress lines and tables; the JSON report writer and the check of the folders a
run writes into. Machine output lives with each task.

Everything is printed literally: the console reads no rich markup (`[gpu01]`, `[host]:2222` and `[/]` are
text), styles come from `styled`, and control characters in names are escaped (gpuprov.errors.literal).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuprov.errors import InputError, literal


def console(stderr: bool = False):
    """A rich console that prints text as it is: no markup, no highlighting."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, markup=False, highlight=False, width=None if stream.isatty() else 160)


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
    from rich.table import Table

    out = console()
    for outcome in outcomes:
        if not outcome.ok:
            out.print(styled(f"{outcome.host.name}: FAILED", "bold red"))
            out.print(f"{outcome.error}\n")
            continue
        table = Table(title=styled(f"{outcome.host.name} ({outcome.host.address}:{outcome.host.port})"),
                      show_header=False, title_justify="left")
        table.add_column("fact", style="bold")
        table.add_column("value")
        for key, value in facts_rows(outcome.value):
            table.add_row(key, styled(value))
        out.print(table)
    failed = sum(1 for o in outcomes if not o.ok)
    print(f"{len(outcomes) - failed} hosts answered, {failed} failed", file=sys.stderr)


def print_plan(host: str, plan: list[dict]) -> None:
    """A host's planned changes and their diffs, as --dry-run shows them; every value printed literally."""
    from rich.text import Text

    from gpuprov.errors import literal, literal_lines

    out = console()
    out.print(styled(literal(host), "bold"), f": {len(plan)} changes", sep="")
    for change in plan:
        out.print(Text.assemble(styled(f"  {change['component']:>13} ", "cyan"), styled(change["summary"])))
        if change.get("diff"):
            out.print("    " + literal_lines(change["diff"].rstrip()).replace("\n", "\n    "))


def write_json_report(folder: str | Path, kind: str, payload: dict) -> Path:
    """The project's one report writer: reports/<kind>-<UTC timestamp>.json, masked, never overwriting another
    run's report (a second report in the same second gets -2, -3, ...); <kind>-latest.json is replaced
    atomically. Returns the report's path."""
    from gpuprov.json_text import dump_json

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
    """A rich table of dict rows."""
    from rich.table import Table

    styles = {"failed": "bold red", "changed": "yellow", "planned": "cyan", "unchanged": "green",
              "fail": "bold red", "warn": "yellow", "pass": "green", "skip": "dim", "required": "bold yellow",
              "error": "bold red", "partial": "cyan"}
    table = Table(title=styled(title), title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        cells = [str(row.get(column, "")) for column in columns]
        table.add_row(*(styled(value, styles.get(value)) for value in cells))
    console().print(table)


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
    from gpuprov.errors import mask_credentials

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


def _iso(epoch) -> str | None:
    from datetime import UTC, datetime

    if not isinstance(epoch, int | float):
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def junit_report(hosts: list[dict]) -> str:
    """JUnit XML of a validate run (junit-xml): a test suite per host, a test case per check. fail is a
    failure, skip a skipped case, warn a skipped case whose message starts with "warn:" (JUnit has no warning;
    either way it is not a pass), and a host whose validation stopped has one errored case, `validation`.
    Each case's system-out holds its figures and thresholds as JSON."""
    from junit_xml import TestCase, TestSuite, to_xml_report_string

    from gpuprov.json_text import dump_json

    suites = []
    for host in hosts:
        classname = f"gpuprov.validate.{host['host']}"
        cases = []
        for item in host.get("results") or []:
            case = TestCase(item["check"], classname=classname, elapsed_sec=float(item.get("seconds") or 0.0),
                            stdout=dump_json({"figures": item.get("figures") or {},
                                              "thresholds": item.get("thresholds") or {}}, indent=None,
                                             sort_keys=True))
            if item["status"] == "fail":
                case.add_failure_info(message=item["reason"], failure_type="fail")
            elif item["status"] == "skip":
                case.add_skipped_info(message=item["reason"])
            elif item["status"] == "warn":
                case.add_skipped_info(message=f"warn: {item['reason']}")
            cases.append(case)
        error = host.get("error")
        if error:
            case = TestCase("validation", classname=classname, elapsed_sec=float(host.get("seconds") or 0.0))
            details = "\n".join(f"{key}: {error[key]}" for key in ("step", "command", "hint", "output")
                                 if error.get(key))
            case.add_error_info(message=error.get("error"), output=details or None,
                                error_type=error.get("step") or "error")
            cases.append(case)
        properties = {key: str(host[key]) for key in ("gpu", "level", "status", "image") if host.get(key)}
        suites.append(TestSuite(host["host"], cases, hostname=host.get("address") or None,
                                timestamp=_iso(host.get("started")), properties=properties or None))
    return to_xml_report_string(suites, prettyprint=True)


def prometheus_textfile(host: dict, timestamp: float) -> str:
    """A host's Prometheus textfile for node_exporter's textfile collector: the suite's own writer
    (gpuprov.smoke.textfile, which the host's idle-GPU validation timer also uses), so both write the same."""
    from gpuprov.smoke.textfile import validation_textfile

    return validation_textfile(host["host"], host.get("results") or [], timestamp, failed_run=bool(host.get("error")))


def _figures_text(figures: dict, limit: int = 6) -> str:
    parts = []
    for key, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str) or key == "per_gpu":
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts[:limit]) + (" ..." if len(parts) > limit else "")


def validate_tables(hosts: list[dict], multinode: dict | None = None) -> None:
    """A rich table per host (every check with its status, figures and reason), then the fleet summary. Host
    names, reasons and errors are printed as written (no markup), control characters escaped."""
    from rich.table import Table

    out = console()
    styles = {"fail": "bold red", "warn": "yellow", "pass": "green", "skip": "dim"}
    for host in hosts:
        title = f"{host['host']} ({host.get('gpu') or 'GPU unknown'}, {host.get('level')}" + (
            f", image {host['image']}" if host.get("image") else "") + ")"
        if host.get("error") and not host.get("results"):
            error = host["error"]
            out.print(styled(f"{host['host']}: validation stopped", "bold red"), styled(error.get("error") or ""))
            for key in ("step", "command", "hint"):
                if error.get(key):
                    out.print(styled(f"  {key}: {error[key]}"))
            lines = [line for line in str(error.get("output") or "").splitlines() if line.strip()]
            for line in lines[-3:]:
                out.print(styled(f"  output: {line}"))
            continue
        table = Table(title=styled(title), title_justify="left")
        for column in ("check", "status", "figures", "reason"):
            table.add_column(column, overflow="fold")
        for item in host.get("results") or []:
            table.add_row(styled(item["check"]), styled(item["status"], styles.get(item["status"])),
                          styled(_figures_text(item.get("figures") or {})), styled(item["reason"]))
        out.print(table)
    rows = []
    for host in hosts:
        found = host.get("counts") or {}
        failed = [item for item in host.get("results") or [] if item["status"] == "fail"]
        detail = (host.get("error") or {}).get("error") or "; ".join(f"{i['check']}: {i['reason']}" for i in failed)
        rows.append({"host": host["host"], "gpu": host.get("gpu") or "", "status": host.get("status", ""),
                     "pass": found.get("pass", 0), "fail": found.get("fail", 0), "warn": found.get("warn", 0),
                     "skip": found.get("skip", 0), "seconds": f"{host.get('seconds', 0):.1f}",
                     "detail": detail[:160]})
    summary_table("validate: fleet summary", rows, ["host", "gpu", "status", "pass", "fail", "warn", "skip",
                                                    "seconds", "detail"])
    if multinode:
        status = multinode.get("status")
        out.print(styled(f"multi-node ({', '.join(multinode.get('hosts', []))}, rendezvous "
                         f"{multinode.get('rendezvous')}):"),
                  styled(str(status), "green" if status == "pass" else "bold red"),
                  styled(multinode.get("reason") or ""))
