"""`invoke validate`: the training and inference smoke suite on every host, judged against each GPU's datasheet
and against the rest of the fleet; optionally one all-reduce across the hosts; JSON, JUnit and Prometheus
reports."""

from __future__ import annotations

from invoke import task
from invoke.exceptions import Exit

from gpuprov.tasks._common import (
    check_output_files,
    exits_cleanly,
    host_task,
    run_settings,
    select_hosts,
    split_names,
)


@host_task(help={
    "level": "quick (default: under a minute per host) or burn-in (minutes of matmul and memory load, "
             "dcgmi diag -r 3)",
    "strict": "a skipped or warning check fails",
    "image": "run the suite in this container image (docker run --gpus all) instead of the host's venv",
    "multi_node": "also all-reduce across the selected hosts with torchrun (c10d rendezvous at the first host's "
                  "cluster_address)",
    "only": "comma list of checks to run (e.g. host.ecc,perf.matmul)",
    "json": "print the run report as JSON on stdout",
    "textfile": "place the Prometheus textfile on each host (default; --no-textfile leaves hosts alone)",
    "dry_run": "say what the environment step would do on each host (build the venv, install torch.compile's "
               "compiler, with the command); change nothing, run no suite",
})
def validate(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False,
             level="quick", strict=False, image=None, multi_node=False, only=None, json_=False, textfile=True,
             dry_run=False):
    """Run the training and inference smoke suite on hosts, judged against datasheets and the fleet.

    Host health, training, inference, sizing, software and performance checks; exit 1 when any check failed."""
    import sys
    import time

    from gpuprov import report as reports_
    from gpuprov.config import path_setting
    from gpuprov.errors import InputError, literal
    from gpuprov.executor import run_on_hosts
    from gpuprov.json_text import dump_json
    from gpuprov.stack.lock import locks_for
    from gpuprov.validation import host as validation
    from gpuprov.validation.suite_config import IMAGE_PATTERN, LEVELS, validate_vars

    if level not in LEVELS:
        raise InputError(f"--level must be one of {', '.join(LEVELS)}, not {level!r}", step="validate")
    if image is not None and not IMAGE_PATTERN.fullmatch(image):
        raise InputError(f"--image must be an image reference like repo/name:tag, not {image!r}", step="validate")
    checks = _checks(level, only)
    inv, hosts = select_hosts(c, host, group, all, inventory)
    for h in hosts:
        validate_vars(h)  # a bad variable is exit 2 here, before any host is contacted
    if multi_node and len(hosts) < 2:
        raise InputError("--multi-node needs at least two hosts", step="validate",
                         hint="select the group with --group NAME")
    settings = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel)
    reports, locks, wheels = path_setting(c, "reports"), path_setting(c, "locks"), path_setting(c, "wheelhouse")
    new_reports = reports_.check_folder("gpuprov.reports", reports, write=True)
    check_output_files("gpuprov.reports", [reports / "validate-latest.json", reports / "validate-latest.xml",
                                           *(reports / "textfile" / f"{h.name}.prom" for h in hosts)])
    reports_.check_folder("gpuprov.locks", locks, write=False)
    reports_.check_folder("gpuprov.wheelhouse", wheels, write=True)
    locks_for(hosts, locks)  # a corrupt lock is bad input: found before any host is contacted
    options = validation.RunOptions(level=level, strict=strict, image=image, only=checks, locks_dir=locks,
                                    wheelhouse=wheels, dry_run=dry_run)
    printer = reports_.progress_printer(quiet=json_)
    started = time.time()

    def work(conn):
        return validation.validate_host(conn, conn.host, options, say=lambda what: printer(conn.host, what))

    outcomes = run_on_hosts(hosts, work, settings, jump_of=inv.jump_host, on_event=printer)
    runs = [o.value if o.ok else validation.failed_run(o) for o in outcomes]
    if dry_run:
        _dry_run(runs, json_)
        return
    validation.apply_fleet(runs, reports, strict)

    summary = None
    if multi_node:
        summary = _multi_node(inv, hosts, runs, settings, options, printer, run_on_hosts)

    finished = time.time()
    entries = [run.to_dict() for run in runs]
    if textfile:
        _publish(inv, hosts, runs, entries, settings, finished, printer, run_on_hosts, validation.publish_textfile)
    local = {}
    for entry in entries:
        local[entry["host"]] = str(reports_.replace_file(reports / "textfile" / f"{entry['host']}.prom",
                                                         reports_.prometheus_textfile(entry, finished)))
    payload = {"level": level, "strict": strict, "image": image, "only": list(checks) if checks else None,
               "started": started, "finished": finished, "finished_epoch": finished, "multi_node": summary,
               "hosts": entries, "textfiles": local}
    report = reports_.write_json_report(reports, "validate", payload)
    junit = reports_.write_report_sibling(report, "validate", ".xml", reports_.junit_report(entries))
    if new_reports:
        print(f"created the folder {literal(str(reports))} (gpuprov.reports)", file=sys.stderr)
    if json_:
        print(dump_json({"report": str(report), "junit": str(junit), **payload}))
    else:
        reports_.validate_tables(entries, summary)
        print(f"report: {literal(str(report))}\njunit: {literal(str(junit))}")
    code = validation.exit_code(entries)
    if code == 0 and any((e.get("textfile") or {}).get("error") for e in entries):
        code = 1
    if code:
        raise Exit(code=code)


def _dry_run(runs, json_: bool) -> None:
    """validate --dry-run's answer: each host's environment plan (or why it has none); exit 1 when a host could not
    be asked."""
    from gpuprov.errors import literal
    from gpuprov.json_text import dump_json
    from gpuprov.validation.env import plan_lines

    entries = [{"host": run.host, "env": run.env, "error": run.error} for run in runs]
    if json_:
        print(dump_json({"dry_run": True, "hosts": entries}))
    else:
        for run in runs:
            print("\n".join(literal(line) for line in (plan_lines(run.host, run.env) if run.error is None else
                                                         [f"{run.host}: not asked: {run.error['error']}"])))
    if any(run.error for run in runs):
        raise Exit(code=1)


def _checks(level: str, only: str | None) -> tuple[str, ...] | None:
    """--only as given, once every name is a check (or a group of checks) of the suite that runs at `level`:
    the suite's own selection, asked here on the controller (InputError, exit 2) rather than on each host."""
    if only is None:
        return None
    from gpuprov.errors import InputError
    from gpuprov.smoke.runner import UsageError, discover, select

    names = tuple(split_names([only], "--only"))
    discover()
    try:
        select(level, ",".join(names))
    except UsageError as exc:
        raise InputError(str(exc), step="validate", hint="invoke validate --help lists the levels; the checks "
                                                         "are named in the error") from None
    return names


def _multi_node(inv, hosts, runs, settings, options, printer, run_on_hosts) -> dict:
    """The all-reduce across the selected hosts; each host gets its multinode.allreduce result."""
    from gpuprov.validation.multinode import nodes_for, run_multinode
    from gpuprov.validation.suite_config import DEFAULT_RDZV_PORT, validate_vars

    nodes = nodes_for(runs, hosts, validate_vars)
    try:
        port = validate_vars(hosts[0]).rdzv_port
    except Exception:  # noqa: BLE001 - the first host's bad variables are its join problem, named already
        port = DEFAULT_RDZV_PORT
    outcome = run_multinode(nodes, hosts, settings, jump_of=inv.jump_host, port=port, level=options.level,
                            image=options.image, layout=options.layout, on_event=printer,
                            run_on_hosts=run_on_hosts)
    for run in runs:
        item = outcome["results"].get(run.host)
        if item is not None:
            run.results.append(item)
    return outcome["summary"]


def _publish(inv, hosts, runs, entries, settings, finished, printer, run_on_hosts, publish) -> None:
    """Each reachable host's textfile into its node_exporter textfile folder; the outcome goes into its entry."""
    from gpuprov.report import prometheus_textfile

    by_name = {entry["host"]: entry for entry in entries}
    folders = {run.host: run.textfile_dir for run in runs if run.textfile_dir}
    unreachable = {name for name, entry in by_name.items()
                   if (entry.get("error") or {}).get("skipped") or (entry.get("error") or {}).get("step") == "connect"}
    targets = [h for h in hosts if h.name in folders and h.name not in unreachable]
    if not targets:
        return
    outcomes = run_on_hosts(
        targets, lambda conn: publish(conn, prometheus_textfile(by_name[conn.host.name], finished),
                                      folders[conn.host.name]),
        settings, jump_of=inv.jump_host, on_event=lambda host, event: None)
    for outcome in outcomes:
        entry = by_name[outcome.host.name]
        entry["textfile"] = {"path": outcome.value} if outcome.ok else {
            "path": f"{folders[outcome.host.name]}/gpuprov_validate.prom", "error": str(outcome.error)}


@task(help={"output": "where to write it (default build/gpuprov-smoke.pyz)"})
@exits_cleanly
def bundle(c, output=None):
    """Write the suite as one file for a bare GPU machine: `python3 gpuprov-smoke.pyz` (Python 3.9+, no gpuprov).

    A zipapp with the suite, its front end and the GPU catalog's suite configs; the same inputs give the same bytes
    (gpuprov.validation.bundle; bench/README.md says how to run it)."""
    from pathlib import Path

    from gpuprov.validation.bundle import DEFAULT_OUTPUT, build

    path = Path(output) if output else DEFAULT_OUTPUT
    check_output_files("--output", [path])
    print(build(path))
