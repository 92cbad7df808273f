"""`invoke health.deploy`: the passive health check (gpuprov-health) on Slurm GPU nodes, wired into Slurm."""

from __future__ import annotations

from gpuprov.tasks._common import finish, host_task, whole_number


@host_task(help={
    "interval": "seconds between two runs of the check on a node (slurm.conf HealthCheckInterval; default 300)",
    "max_drained": "circuit breaker: the share of a partition the check may hold drained at once (default 10%)",
    "epilog": "also set slurm.conf's Epilog to the deeper check after a failed job (--no-epilog: leave Epilog alone, "
              "for a cluster with an Epilog of its own)",
    "slurm_conf": "where the nodes and the controller keep slurm.conf (default /etc/slurm/slurm.conf)",
    "dry_run": "show every change (with diffs); change nothing, reconfigure nothing",
    "json": "print the run report as JSON on stdout",
})
def deploy(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False, interval=None,
           max_drained=None, epilog=True, slurm_conf=None, dry_run=False, json_=False):
    """Install gpuprov-health on Slurm GPU nodes, set it as HealthCheckProgram (and the Epilog), reconfigure Slurm."""
    from gpuprov.health.deploy import DEFAULT_INTERVAL_S, SLURM_CONF, Options, check_path, parse_share, run_deploy

    options = Options(
        interval=DEFAULT_INTERVAL_S if interval is None else whole_number("--interval", interval, 1, 86400),
        max_drained_pct=parse_share(max_drained), epilog=bool(epilog),
        slurm_conf=check_path("--slurm-conf", SLURM_CONF if slurm_conf is None else str(slurm_conf)))
    fleet_args = {"host": host, "group": group, "all_": all, "inventory": inventory, "parallel": parallel,
                  "trust_new_hosts": trust_new_hosts, "json_": json_, "kind": "health-deploy"}
    finish(run_deploy(c, fleet_args, options, dry_run))
