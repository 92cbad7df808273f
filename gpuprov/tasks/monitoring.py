"""`invoke monitoring.*`: exporters on every host, Prometheus targets and server from the inventory, idle GPUs."""

from __future__ import annotations

from invoke import task
from invoke.exceptions import Exit

from gpuprov.tasks._common import exits_cleanly, failed_run, host_task

DASHBOARD_OUT = "build/monitoring/gpu-fleet.json"
SERVER_HELP = "the monitoring host (an inventory host) whose Prometheus to use, reached through its SSH connection"


@host_task(help={
    "dry_run": "show the plan (with diffs); change nothing",
    "max_fail": "stop starting new hosts after this many failures: a count (3) or a share (10%)",
    "json": "print the run report as JSON on stdout",
})
def deploy(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False, dry_run=False,
           max_fail=None, json_=False):
    """Install and start node_exporter and dcgm-exporter (on the monitoring address) and the drift and idle-GPU
    validation timers on hosts; then read each exporter's metrics."""
    from gpuprov.monitoring.deploy import deploy_host

    _run_hosts(c, "monitoring-deploy", host, group, all, inventory, parallel, trust_new_hosts, max_fail, dry_run,
               json_, lambda conn, say: deploy_host(conn, conn.host, dry_run, say))


@task(help={"out": "folder for the file_sd files and the scrape configuration (default: build/monitoring)",
            "server": "also put the targets on this monitoring host's Prometheus (it reloads them by itself)",
            "inventory": "inventory file (default: gpuprov.inventory)", "dry_run": "with --server: show the plan",
            "trust_new_hosts": "record an unknown host key of the server (trust on first use)",
            "json": "print the targets as JSON on stdout"})
@exits_cleanly
def targets(c, out=None, server=None, inventory=None, dry_run=False, trust_new_hosts=False, json_=False):
    """Prometheus file_sd targets for every inventory host (labels: host, groups, GPU, stack, cost) and a scrape
    configuration fragment; --server puts the targets on the monitoring host."""
    from pathlib import Path

    import yaml

    from gpuprov.json_text import dump_json
    from gpuprov.monitoring.targets import TARGET_FILES, file_sd_text, scrape_configs
    from gpuprov.report import check_folder, replace_file
    from gpuprov.tasks._common import check_output_files

    inv, jobs = _inventory_targets(c, inventory)
    folder = Path(out or "build/monitoring")
    check_folder("--out", folder, write=True)
    check_output_files("--out", [*(folder / "targets" / n for n in TARGET_FILES.values()),
                                 folder / "prometheus-scrape.yml"])
    for job, name in TARGET_FILES.items():
        replace_file(folder / "targets" / name, file_sd_text(jobs[job]))
    fragment = yaml.safe_dump({"scrape_configs": scrape_configs(directory=str(folder.resolve()))}, sort_keys=False)
    replace_file(folder / "prometheus-scrape.yml", fragment)
    if server:
        from gpuprov.monitoring.server import target_changes

        _server_run(c, inv, server, trust_new_hosts, dry_run, json_, "monitoring-targets",
                    lambda ctx: list(target_changes(ctx, jobs)))
    elif json_:
        print(dump_json({job: jobs[job] for job in TARGET_FILES}))
    if not json_:
        counts = ", ".join(f"{len(jobs[job])} {job}" for job in TARGET_FILES)
        print(f"targets: {counts} in {folder / 'targets'}; scrape configuration: {folder / 'prometheus-scrape.yml'}")


@task(help={"host": "the monitoring host (an inventory host): Prometheus is installed there",
            "inventory": "inventory file (default: gpuprov.inventory)", "dry_run": "show the plan; change nothing",
            "trust_new_hosts": "record an unknown host key (trust on first use)",
            "json": "print the run report as JSON on stdout"})
@exits_cleanly
def server(c, host=None, inventory=None, dry_run=False, trust_new_hosts=False, json_=False):
    """Install Prometheus (the distribution's package, port 9090) on a monitoring host with gpuprov's scrape
    configuration, alert rules (checked by its promtool first) and every inventory host as a target."""
    from gpuprov.errors import InputError
    from gpuprov.monitoring.policy import build_policy
    from gpuprov.monitoring.server import server_changes

    if not host:
        raise InputError("--host is required: the monitoring host where Prometheus runs", step="monitoring.server")
    inv, jobs = _inventory_targets(c, inventory)
    policy = build_policy(inv.host(host))
    _server_run(c, inv, host, trust_new_hosts, dry_run, json_, "monitoring-server",
                lambda ctx: list(server_changes(ctx, jobs, policy)), listens_on=policy)


@task(help={"hours": "how long a GPU must have stayed under the threshold (default 6; fractions allowed)",
            "threshold": "utilisation (%%) under which a GPU is idle (default 5, as the GpuprovGpuIdle alert's)",
            "server": SERVER_HELP, "prometheus": "Prometheus's URL, when the controller reaches it directly",
            "inventory": "inventory file (default: gpuprov.inventory)",
            "trust_new_hosts": "record an unknown host key of the server (trust on first use)",
            "json": "print the idle GPUs as JSON on stdout"})
@exits_cleanly
def idle(c, hours="6", threshold="5", server=None, prometheus=None, inventory=None, trust_new_hosts=False,
         json_=False):
    """GPUs whose utilisation stayed under the threshold for --hours: host, GPUs, idle hours and what they cost."""
    from gpuprov.json_text import dump_json
    from gpuprov.monitoring.idle import find_idle
    from gpuprov.monitoring.policy import build_policy
    from gpuprov.report import summary_table
    from gpuprov.tasks._common import select_hosts

    span, cut = _positive_number("--hours", hours), _positive_number("--threshold", threshold)
    if cut > 100 or span > 24 * 366:
        from gpuprov.errors import InputError

        raise InputError("--threshold is a percentage (at most 100) and --hours at most a year (8784), not "
                         f"{threshold!r} and {hours!r}", step="monitoring")
    inv, hosts = select_hosts(c, None, None, True, inventory, connects=False)
    costs = {p.host: (p.cost_per_hour, p.currency) for p in map(build_policy, hosts)}
    found, where = _on_prometheus(c, inv, server, prometheus, trust_new_hosts,
                                  lambda prom: (find_idle(prom, span, cut, costs), prom.where))
    rows = [entry.to_dict() for entry in found]
    if json_:
        print(dump_json({"hours": span, "threshold_pct": cut, "prometheus": where, "idle": rows}))
        return
    summary_table(f"GPUs idle for {span:g} h or more (utilisation under {cut:g} %)",
                  [{"host": r["host"], "GPUs": ",".join(r["gpus"]) + f" of {r['gpu_count']}",
                    "idle hours": f"{r['idle_hours']:.2f}",
                    "cost/h": _money(r["idle_cost_per_hour"], r["currency"]),
                    "cost so far": _money(r["idle_cost"], r["currency"])} for r in rows],
                  ["host", "GPUs", "idle hours", "cost/h", "cost so far"])
    total = sum(r["idle_cost_per_hour"] or 0 for r in rows)
    print(f"{len(rows)} hosts with idle GPUs" + (f"; their idle GPUs cost {total:,.2f} per hour" if total else ""))


@task(help={"out": f"where to write the dashboard JSON (default: {DASHBOARD_OUT}, under the working directory)"})
@exits_cleanly
def dashboard(c, out=None):
    """Write the Grafana dashboard (built with grafanalib) that gpuprov ships, to import into Grafana."""
    from pathlib import Path

    from gpuprov.monitoring.dashboard import write_dashboard
    from gpuprov.tasks._common import check_output_files

    path = Path(out) if out else Path(DASHBOARD_OUT)
    check_output_files("--out", [path], create_parents=out is None)
    if out is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    write_dashboard(path)
    print(f"dashboard: {path}")


# ----------------------------------------------------------------------------------------------- helpers

def _money(value, currency: str) -> str:
    return "-" if value is None else f"{value:,.2f} {currency}"


def _positive_number(flag: str, value) -> float:
    from gpuprov.errors import InputError

    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise InputError(f"{flag} must be a number > 0, not {value!r}", step="monitoring")
    return number


def _inventory_targets(c, inventory):
    """The whole inventory and its file_sd jobs (the locks' stacks label the targets)."""
    from gpuprov.config import path_setting
    from gpuprov.monitoring.targets import file_sd
    from gpuprov.stack.lock import locks_for
    from gpuprov.tasks._common import select_hosts

    inv, hosts = select_hosts(c, None, None, True, inventory, connects=False)
    return inv, file_sd(inv, hosts, locks_for(hosts, path_setting(c, "locks")))


def _on_prometheus(c, inv, server, url, trust_new_hosts, ask):
    """`ask(prometheus)` against Prometheus at --prometheus, or on --server through its SSH connection."""
    from gpuprov.errors import InputError
    from gpuprov.executor import run_on_hosts
    from gpuprov.monitoring.query import at_url, through_ssh
    from gpuprov.tasks._common import run_settings

    if bool(server) == bool(url):
        raise InputError("give --server HOST (Prometheus on that inventory host, through SSH) or --prometheus URL",
                         step="monitoring")
    if url:
        from gpuprov.inventory.checks import url_problem

        if url_problem(url):
            raise InputError(f"--prometheus: {url_problem(url)}", step="monitoring")
        return ask(at_url(url))
    outcome, = run_on_hosts([inv.host(server)], lambda conn: ask(through_ssh(conn)),
                            run_settings(c, inv, trust_new_hosts=trust_new_hosts), jump_of=inv.jump_host)
    if not outcome.ok:
        raise outcome.error
    return outcome.value


def _server_run(c, inv, name, trust_new_hosts, dry_run, json_, kind, plan, listens_on=None) -> None:
    """Plan and apply changes on the one monitoring host, provision's way; `listens_on`: the host's monitoring
    policy when Prometheus is to listen on its address (checked to be the host's own before anything changes)."""
    from gpuprov.errors import GpuprovError
    from gpuprov.monitoring.deploy import check_address
    from gpuprov.monitoring.server import managed_files

    def work(conn, say):
        from gpuprov.apply import apply_changes
        from gpuprov.facts.gather import gather
        from gpuprov.monitoring.deploy import DeployRun, context
        from gpuprov.plan import change_dict

        run = DeployRun(conn.host.name, address=conn.host.address)
        try:
            say("facts")
            if listens_on is not None:
                check_address(conn, listens_on)
            changes = plan(context(conn.host, gather(conn, managed_files())))
            run.plan = [change_dict(change) for change in changes]
            if dry_run or not changes:
                run.status = "planned" if changes else "unchanged"
                return run
            say(f"apply {len(changes)} changes")
            run.steps, _ = apply_changes(conn, changes, managed_files=managed_files(), task="monitoring.server")
            run.status = "changed"
            return run
        except GpuprovError as exc:
            exc.run = run
            raise

    _run_hosts(c, kind, [name], None, False, inv.path, None, trust_new_hosts, None, dry_run, json_, work)


def _run_hosts(c, kind, host, group, all_, inventory, parallel, trust_new_hosts, max_fail, dry_run, json_,
               work) -> None:
    """Run `work(conn, say)` on the selected hosts; the report, the tables and the exit code."""
    import sys

    from gpuprov.config import path_setting
    from gpuprov.errors import InputError, literal
    from gpuprov.executor import RunInterrupted, run_on_hosts
    from gpuprov.json_text import dump_json
    from gpuprov.report import check_folder, print_plan, progress_printer, summary_table, write_json_report
    from gpuprov.tasks._common import run_settings, select_hosts

    inv, hosts = select_hosts(c, host, group, all_, inventory)
    settings = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel, max_fail=max_fail)
    reports = path_setting(c, "reports")
    new_reports = check_folder("gpuprov.reports", reports, write=True)
    printer = progress_printer(quiet=json_)
    interrupted = False
    try:
        outcomes = run_on_hosts(hosts, lambda conn: work(conn, lambda what: printer(conn.host, what)), settings,
                                jump_of=inv.jump_host, on_event=printer)
    except RunInterrupted as stop:
        outcomes, interrupted = stop.outcomes, True
    runs = [o.value.to_dict() if o.ok else failed_run(o) for o in outcomes]
    report = write_json_report(reports, kind, {"dry_run": dry_run, "interrupted": interrupted, "hosts": runs})
    if new_reports:
        print(f"created the folder {literal(str(reports))} (gpuprov.reports)", file=sys.stderr)
    if json_:
        print(dump_json({"report": str(report), "hosts": runs}))
    else:
        for run in runs:
            if dry_run and run.get("plan"):
                print_plan(run["host"], run["plan"])
        summary_table(kind + (" (dry run)" if dry_run else ""), [_row(r) for r in runs],
                      ["host", "status", "changes", "exporters", "detail"])
        print(f"report: {literal(str(report))}")
    if interrupted:
        raise Exit(code=130)
    failed = [o for o in outcomes if not o.ok]
    unserved = [r for r in runs if any(state != "serving" for state in (r.get("endpoints") or {}).values())]
    if failed:
        raise Exit(code=2 if all(isinstance(o.error, InputError) for o in failed) else 1)
    if unserved:
        raise Exit(code=1)


def _row(run: dict) -> dict:
    endpoints = run.get("endpoints") or {}
    exporters = ", ".join(f"{name} {state}" for name, state in endpoints.items()) or "-"
    detail = (run.get("error") or {}).get("error") or (f"dcgm-exporter: {run['dcgm_exporter']}"
                                                      if run.get("dcgm_exporter") else "")
    return {"host": run["host"], "status": run.get("status", "failed"), "changes": str(len(run.get("plan") or [])),
            "exporters": exporters, "detail": detail}
