"""Slurm as a rollout's scheduler: sinfo for node states, squeue for a node's jobs, scontrol update to drain, resume
and change a drain's reason, all run on the Slurm controller through a runner (Slurm 22.05, Debian bookworm's
slurm-wlm; every format below is read from SchedMD's source and man pages at tag slurm-22-05-8-1).

Every command runs with admin=True (root or SlurmUser): scontrol update needs it, and with `PrivateData=jobs` or
`PrivateData=nodes` in slurm.conf an ordinary user's squeue hides other users' jobs and sinfo hides node states, so
a busy node would look idle. `-a` shows hidden partitions too: by default both commands leave them out.

gpuprov never lifts a drain it did not set: drain, resume and set_reason first read the node's state, and refuse a
node that someone else drained (its reason does not start with REASON_PREFIX); resume of a node that is not drained
does nothing (scontrol itself answers "Invalid node state specified").
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from gpuprov.core.controller import NODE_NAME, checked_node
from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.rollout.scheduler import REASON_PREFIX, Job, NodeState

# run(argv, admin) on the Slurm controller -> (exit code, stdout, stderr)
Runner = Callable[[list[str], bool], tuple[int, str, str]]

# NODE_NAME: Slurm reads `-n`, `-w` and `nodename=` as hostlist expressions: a `,`, `[` or space in a name would
# name other nodes (`nodename=gpu[01-08]` drains eight), and a leading `-` reads as an option. The inventory's
# scheduler.node is a plain name, which also keeps the output separator out of it.
SEPARATOR = "|"
# sinfo -O: "type[:[.][size][suffix]]", size 0 prints the whole value (src/sinfo/print.c _print_str: width 0 is a
# plain "%s", never cut); slurm's own default node format uses `nodelist:0`. Reason last: it may hold the separator.
NODE_FIELDS = f"NodeList:0{SEPARATOR},StateComplete:0{SEPARATOR},Reason:0"
# squeue -o: "%[[.]size]type[suffix]", no size prints the whole value; the name last: it may hold the separator
JOB_FORMAT = SEPARATOR.join(("%i", "%u", "%L", "%j"))
# the job states that hold a node's resources (a reboot would end them): squeue's JOB STATE CODES
JOB_STATES = "RUNNING,SUSPENDED,COMPLETING,CONFIGURING,STAGE_OUT,SIGNALING,STOPPED"
# StateComplete is node_state_string_complete(): the base state, then `+FLAG` for each flag, lower-cased by sinfo
# (src/common/slurm_protocol_defs.c node_states[] and node_state_flags[]): `idle+drain`, `down+drain+not_responding`
BASES = frozenset({"idle", "allocated", "mixed", "down", "error", "future", "unknown", "invalid"})
DOWN_BASES = frozenset({"down", "error", "future", "unknown", "invalid"})
DOWN_FLAGS = frozenset({"not_responding", "fail", "invalid_reg", "powered_down", "powering_down", "powering_up",
                        "reboot_issued"})
NOT_IN_SLURM = "not in Slurm: sinfo -N lists no partition with this node"
NO_REASON = "none"                       # sinfo's Reason for a node without one (src/sinfo/print.c _print_reason)
INVALID_STATE = "Invalid node state specified"   # ESLURM_INVALID_NODE_STATE: resume of a node not drained or down
# squeue's %L (src/squeue/print.c _print_job_time_left/_print_secs): UNLIMITED, NOT_SET, INVALID (below zero or
# over a year), else `D-HH:MM:SS`, `H:MM:SS` or `M:SS`
NO_TIME_LEFT = frozenset({"UNLIMITED", "NOT_SET", "INVALID"})
_TIME_LEFT = re.compile(r"(?:(?:(\d+)-)?(\d+):)?(\d+):(\d{2})")
_DENIED = ("Access/permission denied", "Invalid user", "must be root")


def time_left(text: str) -> int | None:
    """Seconds from squeue's %L; None for no limit or a figure Slurm does not give. ValueError for anything else."""
    if text in NO_TIME_LEFT:
        return None
    match = _TIME_LEFT.fullmatch(text)
    if not match:
        raise ValueError(f"not a time left: {text!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def checked_reason(host, reason: str, step: str) -> str:
    """The drain reason as gpuprov writes it: on one line (a line break or other control character shown as its
    escape, as gpuprov prints any text: sinfo prints one node a line). One that lacks REASON_PREFIX is refused:
    gpuprov would take its own drain for someone else's. scontrol drops a leading and a trailing `"`
    (src/scontrol/update_node.c); the prefix is never one, and a trailing one lost changes nothing gpuprov reads."""
    if not reason.startswith(REASON_PREFIX):
        raise InputError(f"drain reason {literal(reason)!r} does not start with {REASON_PREFIX!r}: gpuprov would "
                         "take its own drain for someone else's", host=host.name, step=step)
    return literal(reason)


def parse_nodes(text: str) -> dict[str, NodeState]:
    """{node: state} from `sinfo -h -N -O NODE_FIELDS`: one line per node and partition (the first kept); a reason
    that holds a line break goes on in the lines after it."""
    states: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        node, sep, rest = line.partition(SEPARATOR)
        state, sep2, reason = rest.partition(SEPARATOR)
        if sep and sep2 and NODE_NAME.fullmatch(node) and state.split("+")[0] in BASES:
            current = None if node in states else [state, reason]
            if current is not None:
                states[node] = current
        elif current is not None:
            current[1] += "\n" + line
        elif line and not states:
            raise ValueError(f"not a sinfo node line: {line!r}")
    return {node: _node_state(node, state, reason.rstrip("\n")) for node, (state, reason) in states.items()}


def _node_state(node: str, state: str, reason: str) -> NodeState:
    base, *flags = state.split("+")
    return NodeState(node=node, drained="drain" in flags, down=base in DOWN_BASES or bool(DOWN_FLAGS & set(flags)),
                     reason="" if reason == NO_REASON else reason, state=state)


def parse_jobs(text: str) -> list[Job]:
    """Jobs from `squeue -h -o JOB_FORMAT`; a name that holds a line break goes on in the lines after it."""
    jobs: list[dict] = []
    for line in text.split("\n"):
        parts = line.split(SEPARATOR, 3)
        if len(parts) == 4 and parts[0] and " " not in parts[0] and _is_time_left(parts[2]):
            jobs.append({"id": parts[0], "user": parts[1], "time_left_s": time_left(parts[2]), "name": parts[3]})
        elif jobs:
            jobs[-1]["name"] += "\n" + line
        elif line:
            raise ValueError(f"not a squeue job line: {line!r}")
    for job in jobs:
        job["name"] = job["name"].rstrip("\n")
    return [Job(**job) for job in jobs]


def _is_time_left(text: str) -> bool:
    return text in NO_TIME_LEFT or bool(_TIME_LEFT.fullmatch(text))


class SlurmScheduler:
    """The Scheduler protocol (gpuprov.rollout.scheduler) over Slurm's commands on its controller `where`."""

    kind = "slurm"

    def __init__(self, run: Runner, where: str):
        self._run = run
        self.where = where

    def nodes(self, hosts: list) -> dict[str, NodeState]:
        """One sinfo for all the hosts; a node sinfo does not list is down, "not in Slurm"."""
        names = {host.name: checked_node(host, "rollout.nodes") for host in hosts}
        if not names:
            return {}
        wanted = sorted(set(names.values()))
        argv = ["sinfo", "-a", "-h", "-N", "-n", ",".join(wanted), "-O", NODE_FIELDS]
        rc, out, err = self._run(argv, True)
        if rc != 0:
            raise self._error(f"sinfo failed for {', '.join(wanted)}", None, "rollout.nodes", argv, rc, out, err)
        try:
            found = parse_nodes(out)
        except ValueError as exc:
            raise self._error(f"sinfo printed what gpuprov cannot read: {exc}", None, "rollout.nodes", argv, rc,
                              out, err) from None
        return {host: found.get(node) or NodeState(node, down=True, reason=NOT_IN_SLURM)
                for host, node in names.items()}

    def jobs(self, host) -> list[Job]:
        node = checked_node(host, "rollout.jobs")
        argv = ["squeue", "-a", "-h", "-w", node, "-t", JOB_STATES, "-o", JOB_FORMAT]
        rc, out, err = self._run(argv, True)
        if rc != 0:
            raise self._error(f"squeue failed for node {node}", host, "rollout.jobs", argv, rc, out, err)
        try:
            return parse_jobs(out)
        except ValueError as exc:
            raise self._error(f"squeue printed what gpuprov cannot read: {exc}", host, "rollout.jobs", argv, rc,
                              out, err) from None

    def drain(self, host, reason: str) -> None:
        self._drain(host, reason, "rollout.drain")

    def set_reason(self, host, reason: str) -> None:
        """Keep the node drained with `reason` (`state=drain` on a drained node only sets its reason: slurmctld's
        update_node); a node that is not drained is drained."""
        self._drain(host, reason, "rollout.set_reason")

    def resume(self, host) -> None:
        node = checked_node(host, "rollout.resume")
        if not self._ours(host, node, "rollout.resume").drained:
            return
        argv = ["scontrol", "update", f"nodename={node}", "state=resume"]
        rc, out, err = self._run(argv, True)
        # resumed by someone else in between: scontrol refuses a node that is no longer drained or down
        if rc != 0 and not (INVALID_STATE in err + out and not self._ours(host, node, "rollout.resume").drained):
            raise self._error(f"scontrol could not resume node {node}", host, "rollout.resume", argv, rc, out, err)

    def _drain(self, host, reason: str, step: str) -> None:
        node = checked_node(host, step)
        reason = checked_reason(host, reason, step)
        state = self._ours(host, node, step)
        if state.drained and state.reason == reason:
            return
        argv = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
        rc, out, err = self._run(argv, True)
        if rc != 0:
            raise self._error(f"scontrol could not drain node {node}", host, step, argv, rc, out, err)

    def _ours(self, host, node: str, step: str) -> NodeState:
        """The node's state, refused when someone other than gpuprov drained it."""
        state = self.nodes([host])[host.name]
        if state.drained and not state.drained_by():
            raise GpuprovError(f"node {node} was drained by someone else ({state.reason or 'no reason'}): gpuprov "
                               "leaves it as it is", host=host.name, step=step,
                               hint=f"lift that drain yourself (scontrol update nodename={node} state=resume) "
                                    "when the node may take work again")
        return state

    def _error(self, message: str, host, step: str, argv: list[str], rc: int, out: str, err: str) -> GpuprovError:
        output = "\n".join(part for part in (out.rstrip("\n"), err.rstrip("\n")) if part)
        if any(word in output for word in _DENIED):
            hint = f"scontrol update needs root or the SlurmUser on {self.where}"
        else:
            hint = f"check that slurmctld answers: scontrol ping (on {self.where})"
        return GpuprovError(f"{message} (exit {rc}, on the Slurm controller {self.where})",
                            host=host.name if host is not None else self.where, step=step,
                            command=shlex.join(argv), output=output, hint=hint)
