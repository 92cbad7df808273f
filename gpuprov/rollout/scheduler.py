"""What a rollout asks of the scheduler that runs work on the hosts, whatever it is (Slurm, a hook for another
scheduler, or none): the node's state and the reason it is drained, the jobs on it, drain, resume, and a new reason
for a node that stays drained.

A host's node name is `scheduler.node` in the inventory, else the host's name. Implementations:
gpuprov.rollout.slurm.SlurmScheduler (scontrol/squeue/sinfo), gpuprov.rollout.hooks.HookScheduler (the inventory's
commands), gpuprov.rollout.hooks.NoScheduler (facts only: nothing to drain, work seen on the host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# every drain reason gpuprov writes starts so; a drain whose reason does not is someone else's and is never lifted
REASON_PREFIX = "gpuprov rollout"


@dataclass(frozen=True)
class Job:
    """A job running on a node."""

    id: str
    user: str
    name: str = ""
    time_left_s: int | None = None     # None: no time limit, or the scheduler does not say

    def describe(self) -> str:
        """`job 1234 (alice, 3 h 10 min left)`; work without a user or time is named as it is (`pod ml/x`)."""
        if self.user in ("", "-") and self.time_left_s is None:
            return self.id
        return f"job {self.id} ({self.user}, {left_text(self.time_left_s)})"

    def to_dict(self) -> dict:
        return {"id": self.id, "user": self.user, "name": self.name, "time_left_s": self.time_left_s}


@dataclass(frozen=True)
class NodeState:
    """A node as the scheduler sees it."""

    node: str
    drained: bool = False          # taking no new work (Slurm: DRAIN/DRAINING/DRAINED; Kubernetes: cordoned)
    down: bool = False             # down, not responding or unknown to the scheduler
    reason: str = ""               # why it is drained or down, as the scheduler keeps it ("" for none)
    state: str = ""                # the scheduler's own words for the state (Slurm's StateComplete)

    def drained_by(self, run_id: str | None = None) -> bool:
        """Whether gpuprov drained it (any rollout, or run `run_id`): its reason starts with our prefix."""
        prefix = REASON_PREFIX + (f" {run_id}:" if run_id else "")
        return self.reason.startswith(prefix)

    def failed_rollout(self) -> bool:
        """Whether a rollout left it drained after a failure (`gpuprov rollout <id>: failed ...`): another rollout
        of the host (a rollback of it alone) may take it over."""
        head, _, rest = self.reason.partition(": ")
        return self.drained and head.startswith(REASON_PREFIX + " ") and rest.startswith("failed ")

    def to_dict(self) -> dict:
        return {"node": self.node, "drained": self.drained, "down": self.down, "reason": self.reason,
                "state": self.state}


class Scheduler(Protocol):
    """The scheduler a rollout drains through. `host` is an inventory host; each method raises GpuprovError
    (naming the host, the step and the command) when the scheduler cannot be asked or refuses."""

    kind: str                      # slurm | hook | none

    def nodes(self, hosts: list) -> dict[str, NodeState]:
        """{host name: its node's state} for `hosts`, in one query where the scheduler allows."""
        ...

    def jobs(self, host) -> list[Job]:
        """The jobs running (or completing) on the host's node now."""
        ...

    def drain(self, host, reason: str) -> None:
        """Stop new work landing on the node; running work goes on. Idempotent."""
        ...

    def resume(self, host) -> None:
        """Let work land on the node again. Idempotent."""
        ...

    def set_reason(self, host, reason: str) -> None:
        """Keep the node drained, with `reason` (a failed host's)."""
        ...


def left_text(seconds: int | None) -> str:
    """`3 h 10 min left`, `45 s left`, `no time limit`."""
    if seconds is None:
        return "no time limit"
    if seconds < 60:
        return f"{max(seconds, 0)} s left"
    hours, minutes = divmod(seconds // 60, 60)
    days, hours = divmod(hours, 24)
    parts = ([f"{days} d"] if days else []) + ([f"{hours} h"] if hours else []) + ([f"{minutes} min"] if minutes
                                                                                   else [])
    return " ".join(parts) + " left"
