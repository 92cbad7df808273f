"""The scheduler a rollout drains through, built from `--drain` and the hosts' `scheduler:` variables.

Slurm's commands run on the inventory host named by `scheduler.controller` (slurmctld's host, or any host with
the Slurm client and munge), over one verified SSH connection shared by the run, one command at a time; `scontrol
update` runs through sudo unless the login is root. Hooks run on this machine (gpuprov.rollout.hooks).
"""

from __future__ import annotations

from gpuprov.core.controller import controller_name, controller_runner
from gpuprov.core.errors import InputError
from gpuprov.rollout.scheduler import Scheduler


def scheduler_for(kind: str, fleet) -> Scheduler:
    """The scheduler of `--drain kind` for the fleet's hosts; InputError (exit 2) when the inventory does not say
    enough (no controller, or hosts that name different controllers)."""
    if kind == "slurm":
        from gpuprov.rollout.slurm import SlurmScheduler

        controller = controller_name(fleet.hosts, "--drain slurm", "rollout",
                                     "set scheduler.controller to the inventory host that runs scontrol (slurmctld's "
                                     "host), or choose --drain hook or --drain none")
        runner = controller_runner(fleet, controller)
        return SlurmScheduler(runner, where=controller)
    if kind == "hook":
        from gpuprov.rollout.hooks import REQUIRED as HOOKS
        from gpuprov.rollout.hooks import HookScheduler, check_hook

        missing = [h.name for h in fleet.hosts if not all((h.vars.get("scheduler") or {}).get(name)
                                                          for name in HOOKS)]
        if missing:
            raise InputError("--drain hook: hosts without scheduler." + ", scheduler.".join(HOOKS) + ": "
                             + ", ".join(missing), step="rollout",
                             hint="give the hook commands in the inventory (docs/rollout-schedulers.md); the state "
                                  "hook is what tells gpuprov's cordon from an admin's")
        for host in fleet.hosts:
            for name in HOOKS:
                check_hook(host.name, name, host.vars["scheduler"][name])
        return HookScheduler()
    from gpuprov.rollout.hooks import NoScheduler

    return NoScheduler(lambda host: _facts(host, fleet))


def _facts(host, fleet) -> dict:
    """The host's facts over a connection of its own (--drain none: the work the host itself shows)."""
    from gpuprov.core.executor import connect
    from gpuprov.core.known_hosts import read_known_hosts
    from gpuprov.facts.gather import gather

    conn = connect(host, fleet.settings, read_known_hosts(fleet.settings.known_hosts),
                   jump=fleet.inventory.jump_host(host)).open()
    try:
        return gather(conn)
    finally:
        conn.close()
