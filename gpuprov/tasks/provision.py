"""`invoke provision` and `invoke preflight`: plan and apply a matching GPU stack over SSH."""

from __future__ import annotations

from invoke import task
from invoke.exceptions import Exit

from gpuprov.json_text import dump_json
from gpuprov.tasks._common import (
    HOST_HELP,
    check_output_files,
    exits_cleanly,
    failed_run,
    only_components,
    run_settings,
    select_hosts,
)

# gpuprov.ops.COMPONENTS, written out so that `invoke --list` imports no operation module
ONLY_CHOICES = "sources,kernel,driver,cuda,nccl,engine,container_toolkit,fabricmanager,dcgm,pins"
RUN_HELP = {
    **HOST_HELP,
    "parallel": "hosts worked on at once (default: gpuprov.parallel)",
    "max_fail": "stop starting new hosts after this many failures: a count (3) or a share (10%)",
    "trust_new_hosts": "record unknown host keys (trust on first use)",
}


def _exit_code(outcomes) -> int:
    """0 all good; 2 every failure was bad input; 1 a host failed, or left a step or reboot refused because
    work runs there (the host is not where the operator asked it to be)."""
    from gpuprov.errors import InputError

    failed = [o for o in outcomes if not o.ok]
    if failed:
        return 2 if all(isinstance(o.error, InputError) for o in failed) else 1
    return 1 if any(_held_back(o.value) for o in outcomes) else 0


def _held_back(run) -> bool:
    """Whether a disruptive step or the reboot was refused (at plan time or on the host) in a real run."""
    if run.plan is None or run.status == "planned":
        return False
    return (run.reboot == "refused" or any(c.get("refused") for c in run.plan["changes"])
            or any(step.status == "refused" for step in run.steps))


@task(iterable=["host", "group"], help={
    **RUN_HELP,
    "dry_run": "show the plan and change nothing",
    "reboot": "never | if-needed (default: only for this run's changes or a driver swap gpuprov recorded) "
              "| always",
    "disrupt": "allow disruptive steps (driver change, reboot, fabric manager or Docker restart) even while "
               "GPU processes, containers or Slurm jobs run on the host",
    "only": "comma list of components: " + ONLY_CHOICES,
    "skip_preflight": "provision even when a preflight check fails",
    "update_lock": "move the lock file to the newly resolved stack",
    "json": "print the run report as JSON on stdout",
})
@exits_cleanly
def provision(c, host=None, group=None, all=False, inventory=None, dry_run=False, parallel=None, max_fail=None,
              reboot="if-needed", only=None, skip_preflight=False, update_lock=False, trust_new_hosts=False,
              disrupt=False, json_=False):
    """Plan and apply the resolved driver/CUDA/NCCL/toolkit/fabric manager/DCGM stack on hosts."""
    import sys

    from gpuprov.config import path_setting
    from gpuprov.errors import InputError, literal
    from gpuprov.executor import RunInterrupted, run_on_hosts
    from gpuprov.provision import REBOOT_POLICIES, Options, provision_host
    from gpuprov.report import check_folder, progress_printer, summary_table, write_json_report
    from gpuprov.stack.lock import locks_for

    if reboot not in REBOOT_POLICIES:
        raise InputError(f"--reboot must be one of {', '.join(REBOOT_POLICIES)}, got {reboot!r}")
    components = only_components(only)
    inv, hosts = select_hosts(c, host, group, all, inventory)
    settings = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel, max_fail=max_fail)
    reports, locks = path_setting(c, "reports"), path_setting(c, "locks")
    new_reports = check_folder("gpuprov.reports", reports, write=True)
    check_output_files("gpuprov.reports", [reports / "provision-latest.json"])
    check_folder("gpuprov.locks", locks, write=update_lock and locks.exists())
    locks_for(hosts, locks)  # a corrupt lock is bad input: found before any host is contacted
    options = Options(dry_run=dry_run, reboot=reboot, only=components, skip_preflight=skip_preflight,
                      update_lock=update_lock, disrupt=disrupt, locks_dir=locks)
    printer = progress_printer(quiet=json_)
    interrupted = False
    try:
        outcomes = run_on_hosts(
            hosts, lambda conn: provision_host(conn, conn.host, inv.path.parent, options,
                                               say=lambda _name, what: printer(conn.host, what)), settings,
            jump_of=inv.jump_host, on_event=printer)
    except RunInterrupted as stop:
        outcomes, interrupted = stop.outcomes, True
    runs = [o.value.to_dict() if o.ok else failed_run(o) for o in outcomes]
    report = write_json_report(reports, "provision", {"dry_run": dry_run, "reboot_policy": reboot,
                                                      "interrupted": interrupted, "hosts": runs})
    if new_reports:
        print(f"created the folder {literal(str(reports))} (gpuprov.reports)", file=sys.stderr)
    if json_:
        print(dump_json({"report": str(report), "hosts": runs}))
    else:
        _print_plans(runs, dry_run)
        summary_table("provision" + (" (dry run)" if dry_run else ""), [_summary_row(r) for r in runs],
                      ["host", "status", "changes", "reboot", "stack", "detail"])
        print(f"report: {literal(str(report))}")
    if interrupted:
        print(f"interrupted (Ctrl-C): the report {literal(str(report))} has what completed", file=sys.stderr)
        raise Exit(code=130)
    code = _exit_code(outcomes)
    if code:
        raise Exit(code=code)


def _summary_row(run: dict) -> dict:
    stack = run.get("stack") or {}
    driver = (stack.get("driver") or {}).get("version", "")
    cuda = (stack.get("cuda") or {}).get("version", "")
    changes = (run.get("plan") or {}).get("changes", [])
    refused = [c for c in changes if c.get("refused")]
    details = []
    if run.get("error"):
        details.append(run["error"]["error"].splitlines()[0])
    if refused:
        details.append(f"{len(refused)} disruptive steps refused: work runs there (--disrupt overrides)")
    if run.get("reboot_detail"):
        details.append(run["reboot_detail"])
    if run.get("mismatches"):
        details.append("; ".join(m["what"] for m in run["mismatches"]))
    detail = "; ".join(details)[:160]
    changes = len(changes)
    return {"host": run["host"], "status": run["status"], "changes": changes, "reboot": run.get("reboot", ""),
            "stack": f"driver {driver} / CUDA {cuda}" if driver else "", "detail": detail}


def _print_plans(runs: list[dict], dry_run: bool) -> None:
    from rich.text import Text

    from gpuprov.errors import literal, literal_lines
    from gpuprov.report import console, styled

    out = console()
    for run in runs:
        host = literal(run["host"])
        changes = (run.get("plan") or {}).get("changes", [])
        for notice in run.get("notices") or []:
            out.print(f"{host}: {literal(notice)}")
        if run.get("busy") and any(c.get("refused") for c in changes):
            out.print(f"{host}: work runs here, disruptive steps refused (--disrupt overrides):")
            for line in run["busy"]:
                out.print(f"    {literal(line)}")
        if run.get("error"):
            out.print(styled(f"{host}: FAILED", "bold red"), literal_lines(run["error"]["error"]))
            for key in ("step", "command", "hint"):
                if run["error"].get(key):
                    out.print(f"  {key}: " + literal_lines(run["error"][key]).replace("\n", "\n    "))
        if not changes or not dry_run:
            continue
        out.print(styled(host, "bold"), f": {len(changes)} changes", sep="")
        for change in changes:
            line = Text.assemble(styled(f"  {change['component']:>17} ", "cyan"), styled(change["summary"]))
            if change["reboot"]:
                line.append(" (reboot)", "yellow")
            if change.get("disruptive"):
                line.append(f" (disruptive: {literal(change['disruptive'])})", "magenta")
            if change.get("refused"):
                line.append(" (refused: work runs here)", "red")
            out.print(line)
            if change.get("diff"):
                out.print("    " + literal_lines(change["diff"].rstrip()).replace("\n", "\n    "))


@task(iterable=["host", "group"], help={**{k: v for k, v in RUN_HELP.items() if k != "max_fail"},
                                        "json": "print the checks as JSON"})
@exits_cleanly
def preflight(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False,
              json_=False):
    """Read-only checks that must pass before provisioning (Secure Boot, nouveau, headers, locks, disk, sources)."""
    from gpuprov.executor import run_on_hosts
    from gpuprov.facts.gather import gather
    from gpuprov.plan import repo_spec
    from gpuprov.preflight import run_preflight
    from gpuprov.report import progress_printer, summary_table

    inv, hosts = select_hosts(c, host, group, all, inventory)
    settings = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel)

    def work(conn):
        facts = gather(conn)
        return run_preflight(conn, facts, repo_spec(conn.host, facts, inv.path.parent), None)

    outcomes = run_on_hosts(hosts, work, settings, jump_of=inv.jump_host, on_event=progress_printer(quiet=json_))
    rows = []
    for outcome in outcomes:
        if not outcome.ok:
            rows.append({"host": outcome.host.name, "check": "connect", "status": "fail",
                         "detail": str(outcome.error).splitlines()[0], "remedy": outcome.error.hint or ""})
            continue
        rows += [{"host": outcome.host.name, "check": c.name, "status": c.status, "detail": c.detail,
                  "remedy": c.remedy} for c in outcome.value]
    if json_:
        print(dump_json(rows))
    else:
        summary_table("preflight", rows, ["host", "check", "status", "detail", "remedy"])
    if any(row["status"] == "fail" for row in rows):
        raise Exit(code=1)
