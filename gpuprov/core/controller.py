"""A command on a Slurm controller host (or any inventory host with the Slurm client and munge) over one verified
SSH connection shared by a run, one command at a time, through sudo for an admin command unless the login is root:
how rollout, validate --via slurm, health.deploy and an inventory's `slurm:` source reach Slurm. And the names they
use: a host's node name (`scheduler.node`, else its name) and the one controller a selection names
(`scheduler.controller`)."""

from __future__ import annotations

import re
import shlex
import threading

from gpuprov.core.errors import GpuprovError, InputError, literal

# a Slurm NodeName or a Kubernetes node name: letters, digits and . _ - (no spaces, no shell characters). Slurm reads
# `-n`, `-w` and `nodename=` as hostlist expressions: a `,`, `[` or space in a name would name other nodes
# (`nodename=gpu[01-08]` drains eight), and a leading `-` reads as an option.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")

COMMAND_TIMEOUT_S = 60


class ControllerRunner:
    """argv on the Slurm controller host over SSH: (rc, stdout, stderr). Reconnects and runs it again once after a
    dropped link or a timeout, unless `retry=False`: a command that is not idempotent (sbatch) may have reached
    Slurm before the link failed, and would then run twice."""

    def __init__(self, host, settings, jump=None):
        from gpuprov.core.known_hosts import read_known_hosts

        self.host, self.settings, self.jump = host, settings, jump
        self.known_hosts = read_known_hosts(settings.known_hosts)
        self.conn = None
        self._lock = threading.Lock()

    def __call__(self, argv: list[str], admin: bool, *, retry: bool = True) -> tuple[int, str, str]:
        from gpuprov.core.executor import connect

        command = shlex.join(argv)
        tries = 2 if retry else 1
        with self._lock:
            for attempt in range(1, tries + 1):
                try:
                    if self.conn is None:
                        self.conn = connect(self.host, self.settings, self.known_hosts, jump=self.jump).open()
                    result = self.conn.run(command, sudo=admin and self.host.user != "root",
                                           timeout=COMMAND_TIMEOUT_S)
                    return result.rc, result.stdout, result.stderr
                except GpuprovError:
                    self.close()
                    if attempt == tries:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def node_name(host) -> str:
    """The host's node name in the scheduler: `scheduler.node`, else the host's name."""
    settings = host.vars.get("scheduler") or {}
    return str(settings.get("node") or host.name)


def checked_node(host, step: str) -> str:
    """The host's node name, refused unless it is a plain name (see NODE_NAME)."""
    node = node_name(host)
    if not NODE_NAME.fullmatch(node):
        raise InputError(f"scheduler node name {literal(node)!r} is not a plain node name: give letters, digits, "
                         "'.', '_' and '-', starting with a letter or digit (no range, no list)",
                         host=host.name, step=step, hint="set scheduler.node to the node's name in the scheduler")
    return node


def controller_name(hosts, what: str, step: str, hint: str) -> str:
    """The one `scheduler.controller` every host of `hosts` names; InputError (exit 2), saying `what` needs it,
    when one names none (`hint`: where to set it) or they name different ones."""
    names = {(h.vars.get("scheduler") or {}).get("controller") or "" for h in hosts}
    if "" in names:
        lacking = [h.name for h in hosts if not (h.vars.get("scheduler") or {}).get("controller")]
        raise InputError(f"{what}: no scheduler.controller for {', '.join(lacking)}", step=step, hint=hint)
    if len(names) > 1:
        raise InputError(f"{what}: the hosts name different controllers ({', '.join(sorted(names))}); work on one "
                         "Slurm cluster at a time", step=step, hint="select one cluster's hosts with --group")
    return names.pop()


def controller_runner(fleet, name: str) -> ControllerRunner:
    """The runner of the inventory host `name`, with the fleet's connection settings and jump host."""
    host = fleet.inventory.host(name)
    return ControllerRunner(host, fleet.settings, jump=fleet.inventory.jump_host(host))
