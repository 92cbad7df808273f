"""The scheduler a rollout drains through, built from `--drain` and the hosts' `scheduler:` variables.

Slurm's commands run on the inventory host named by `scheduler.controller` (slurmctld's host, or any host with
the Slurm client and munge), over one verified SSH connection shared by the run, one command at a time; `scontrol
update` runs through sudo unless the login is root. Hooks run on this machine (gpuprov.rollout.hooks).
"""

from __future__ import annotations

import shlex
import threading

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.rollout.scheduler import Scheduler

COMMAND_TIMEOUT_S = 60


class ControllerRunner:
    """argv on the Slurm controller host over SSH: (rc, stdout, stderr). Reconnects once after a dropped link."""

    def __init__(self, host, settings, jump=None):
        from gpuprov.core.known_hosts import read_known_hosts

        self.host, self.settings, self.jump = host, settings, jump
        self.known_hosts = read_known_hosts(settings.known_hosts)
        self.conn = None
        self._lock = threading.Lock()

    def __call__(self, argv: list[str], admin: bool) -> tuple[int, str, str]:
        from gpuprov.core.executor import connect

        command = shlex.join(argv)
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self.conn is None:
                        self.conn = connect(self.host, self.settings, self.known_hosts, jump=self.jump).open()
                    result = self.conn.run(command, sudo=admin and self.host.user != "root",
                                           timeout=COMMAND_TIMEOUT_S)
                    return result.rc, result.stdout, result.stderr
                except GpuprovError:
                    self.close()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def scheduler_for(kind: str, fleet) -> Scheduler:
    """The scheduler of `--drain kind` for the fleet's hosts; InputError (exit 2) when the inventory does not say
    enough (no controller, or hosts that name different controllers)."""
    if kind == "slurm":
        from gpuprov.rollout.slurm import SlurmScheduler

        controller = _controller(fleet)
        host = fleet.inventory.host(controller)
        runner = ControllerRunner(host, fleet.settings, jump=fleet.inventory.jump_host(host))
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


def _controller(fleet) -> str:
    names = {(h.vars.get("scheduler") or {}).get("controller") for h in fleet.hosts}
    if None in names or "" in names:
        lacking = [h.name for h in fleet.hosts if not (h.vars.get("scheduler") or {}).get("controller")]
        raise InputError(f"--drain slurm: no scheduler.controller for {', '.join(lacking)}", step="rollout",
                         hint="set scheduler.controller to the inventory host that runs scontrol (slurmctld's "
                              "host), or choose --drain hook or --drain none")
    if len(names) > 1:
        raise InputError(f"--drain slurm: the hosts name different controllers ({', '.join(sorted(names))}); roll "
                         "out one Slurm cluster at a time", step="rollout", hint="select one cluster's hosts "
                                                                                 "with --group")
    return names.pop()


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
