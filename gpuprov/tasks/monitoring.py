"""`invoke monitoring.*`: exporters on every host, Prometheus targets and server from the inventory, idle GPUs."""

from __future__ import annotations

from gpuprov.tasks._common import BATCH_HELP, exits_cleanly, finish, host_task, open_fleet, task

DASHBOARD_OUT = "build/monitoring/gpu-fleet.json"
SERVER_HELP = "the monitoring host (an inventory host) whose Prometheus to use, reached through its SSH connection"


@host_task(help={
    "dry_run": "show the plan (with diffs); change nothing",
    "max_fail": "stop starting new hosts after this many failures: a count (3) or a share (10%)",
    **BATCH_HELP,
    "json": "print the run report as JSON on stdout",
})
def deploy(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False, dry_run=False,
           max_fail=None, json_=False, serial=None, batch_window=None, max_fail_percentage=None):
    """Install node_exporter, dcgm-exporter and the drift and idle-GPU timers on hosts, then read the metrics.

    The exporters listen on the monitoring address; each exporter's metrics are read back once it runs."""
    from gpuprov.core.runtime import run_fleet
    from gpuprov.monitoring.deploy import DeployJob

    fleet = open_fleet(c, host, group, all, inventory, parallel=parallel, trust_new_hosts=trust_new_hosts,
                       max_fail=max_fail, serial=serial, batch_window=batch_window,
                       max_fail_percentage=max_fail_percentage, json_=json_, kind=DeployJob.kind)
    finish(run_fleet(fleet, DeployJob(dry_run)))


@task(help={"out": "folder for the file_sd files and the scrape configuration (default: build/monitoring)",
            "server": "also put the targets on this monitoring host's Prometheus (it reloads them by itself)",
            "inventory": "inventory file (default: gpuprov.inventory)", "dry_run": "with --server: show the plan",
            "trust_new_hosts": "record an unknown host key of the server (trust on first use)",
            "json": "print the targets as JSON on stdout"})
@exits_cleanly
def targets(c, out=None, server=None, inventory=None, dry_run=False, trust_new_hosts=False, json_=False):
    """Write Prometheus file_sd targets for every inventory host and a scrape configuration fragment.

    The targets' labels: host, groups, GPU, stack, cost. --server puts the targets on the monitoring host."""
    from pathlib import Path

    import yaml

    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import check_folder, replace_file
    from gpuprov.core.runtime import run_fleet
    from gpuprov.monitoring.deploy import ServerJob
    from gpuprov.monitoring.targets import TARGET_FILES, file_sd_text, scrape_configs
    from gpuprov.tasks._common import check_output_files

    inv, jobs = _inventory_targets(c, inventory)
    folder = Path(out or "build/monitoring")
    check_folder("--out", folder, write=True)
    check_output_files("--out", [*(folder / "targets" / n for n in TARGET_FILES.values()),
                                 folder / "prometheus-scrape.yml"])
    # --server: the monitoring host and the reports folder checked before anything is written
    put = ServerJob(jobs, prometheus=False, dry_run=dry_run) if server else None
    fleet = _monitoring_host(c, inv, server, trust_new_hosts, json_, put.kind) if put else None
    for job, name in TARGET_FILES.items():
        replace_file(folder / "targets" / name, file_sd_text(jobs[job]))
    fragment = yaml.safe_dump({"scrape_configs": scrape_configs(directory=str(folder.resolve()))}, sort_keys=False)
    replace_file(folder / "prometheus-scrape.yml", fragment)
    if fleet is not None:
        finish(run_fleet(fleet, put))
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
    """Install Prometheus on a monitoring host, with every inventory host as a target.

    The distribution's package (port 9090), gpuprov's scrape configuration and alert rules (checked by its
    promtool first)."""
    from gpuprov.core.errors import InputError
    from gpuprov.core.runtime import run_fleet
    from gpuprov.monitoring.deploy import ServerJob

    if not host:
        raise InputError("--host is required: the monitoring host where Prometheus runs", step="monitoring.server")
    inv, jobs = _inventory_targets(c, inventory)
    job = ServerJob(jobs, prometheus=True, dry_run=dry_run)
    finish(run_fleet(_monitoring_host(c, inv, host, trust_new_hosts, json_, job.kind), job))


@task(help={"hours": "how long a GPU must have stayed under the threshold (default 6; fractions allowed)",
            "threshold": "utilisation (percent) under which a GPU is idle (default 5, as the GpuprovGpuIdle alert's)",
            "server": SERVER_HELP, "prometheus": "Prometheus's URL, when the controller reaches it directly",
            "inventory": "inventory file (default: gpuprov.inventory)",
            "trust_new_hosts": "record an unknown host key of the server (trust on first use)",
            "json": "print the idle GPUs as JSON on stdout"})
@exits_cleanly
def idle(c, hours="6", threshold="5", server=None, prometheus=None, inventory=None, trust_new_hosts=False,
         json_=False):
    """GPUs whose utilisation stayed under the threshold for --hours: host, GPUs, idle hours and what they cost."""
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import summary_table
    from gpuprov.monitoring.idle import find_idle
    from gpuprov.monitoring.policy import build_policy
    from gpuprov.tasks._common import select_hosts

    span, cut = _positive_number("--hours", hours), _positive_number("--threshold", threshold)
    if cut > 100 or span > 24 * 366:
        from gpuprov.core.errors import InputError

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
    from gpuprov.core.errors import InputError

    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise InputError(f"{flag} must be a number > 0, not {value!r}", step="monitoring")
    return number


def _inventory_targets(c, inventory):
    """The whole inventory and its file_sd jobs (the locks' stacks label the targets)."""
    from gpuprov.core.config import path_setting
    from gpuprov.monitoring.targets import file_sd
    from gpuprov.stack.lock import locks_for
    from gpuprov.tasks._common import select_hosts

    inv, hosts = select_hosts(c, None, None, True, inventory, connects=False)
    return inv, file_sd(inv, hosts, locks_for(hosts, path_setting(c, "locks")))


def _monitoring_host(c, inv, name: str, trust_new_hosts: bool, json_: bool, kind: str):
    """The fleet of the one monitoring host `name` (an inventory host: InputError otherwise, before any host is
    contacted), for the report `kind`."""
    inv.host(name)
    return open_fleet(c, [name], None, False, str(inv.path), trust_new_hosts=trust_new_hosts, json_=json_, kind=kind)


def _on_prometheus(c, inv, server, url, trust_new_hosts, ask):
    """`ask(prometheus)` against Prometheus at --prometheus, or on --server through its SSH connection (a read:
    no report, no progress lines)."""
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError
    from gpuprov.core.runtime import Fleet
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
    fleet = Fleet(inv, [inv.host(server)], run_settings(c, inv, trust_new_hosts=trust_new_hosts),
                  path_setting(c, "reports"))
    outcome, = fleet.run(fleet.hosts, lambda conn: ask(through_ssh(conn)))
    if not outcome.ok:
        raise outcome.error
    return outcome.value
