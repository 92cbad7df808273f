"""Schedulers other than Slurm: the inventory's hook commands (HookScheduler), or none at all (NoScheduler).

A host's hooks are its `scheduler:` variables, each a command or a list of commands run in order on the controller
(the machine gpuprov runs on, where kubectl and its kubeconfig live):

    scheduler:
      node: gpu07                  # the node's name in the scheduler (default: the host's name)
      cordon:                      # block lists: in a [flow list] YAML reads {node} as a mapping
        - kubectl annotate node {node} gpuprov.io/rollout={reason} --overwrite
        - kubectl cordon {node}
      busy:     gpuprov-k8s-busy {node}       # one line per workload still running; nothing (exit 0) = idle
      uncordon:
        - kubectl annotate node {node} gpuprov.io/rollout-
        - kubectl uncordon {node}
      state:    gpuprov-k8s-state {node}      # `ready`, `cordoned <reason>` or `down <why>`
      timeout: 120                 # seconds each command may take (default 120)

(docs/rollout-schedulers.md has the scripts and why the commands come in that order.)
A failed host's new reason is written by running `cordon` again with it (cordon hooks must be idempotent:
`kubectl annotate --overwrite`, `kubectl cordon` of a cordoned node).

A command is split like a shell would (shlex.split) and run without one. `{node}` and `{reason}` are replaced
inside the words that split gives, so a value is always part of one argument, whatever it holds; a placeholder may
be a whole word or part of one (`gpuprov.io/rollout={reason}`). Nothing else is replaced: kubectl's
`-o jsonpath={.spec}` passes as written. Neither value can read as an option: a reason starts with REASON_PREFIX
and a node name is a plain name (gpuprov.rollout.slurm.NODE_NAME).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable

from gpuprov.core.busy import running_work
from gpuprov.core.controller import checked_node, node_name
from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.core.local import run_bounded
from gpuprov.rollout.scheduler import Job, NodeState
from gpuprov.rollout.slurm import checked_reason

REQUIRED = ("cordon", "busy", "uncordon", "state")   # state: what tells gpuprov's cordon from an admin's
DEFAULT_TIMEOUT_S = 120
STEPS = {"cordon": "rollout.drain", "busy": "rollout.jobs", "uncordon": "rollout.resume", "state": "rollout.nodes"}


def check_hook(host: str, hook: str, value) -> None:
    """InputError unless `value` is a command or a list of commands, each with {node}, and {reason} in one of a
    cordon's commands."""
    templates = [value] if isinstance(value, str) else value
    if not templates or not isinstance(templates, list) or not all(
            isinstance(item, str) and item.strip() for item in templates):
        raise InputError(f"scheduler.{hook}: give a command or a list of commands (--drain hook needs "
                         f"{', '.join('scheduler.' + name for name in REQUIRED)})", host=host, step=STEPS[hook])
    for template in templates:
        if "{node}" not in template:
            raise InputError(f"scheduler.{hook}: {literal(template)!r} lacks {{node}}", host=host, step=STEPS[hook])
        try:
            shlex.split(template)
        except ValueError as exc:   # an unclosed quote
            raise InputError(f"scheduler.{hook}: {literal(template)!r}: {exc}", host=host, step=STEPS[hook]) from None
    if hook == "cordon" and not any("{reason}" in template for template in templates):
        raise InputError("scheduler.cordon lacks {reason}: gpuprov tells its cordon from an admin's by the reason "
                         "the cordon records", host=host, step=STEPS[hook],
                         hint="record it where the state hook reads it, e.g. kubectl annotate node {node} "
                              "gpuprov.io/rollout={reason} --overwrite")


def parse_state(node: str, text: str) -> NodeState:
    """A state hook's answer: `ready`, `cordoned <reason>` or `down <why>` (its first line)."""
    line = text.strip().split("\n", 1)[0].strip()
    word, _, rest = line.partition(" ")
    if word == "ready" and not rest:
        return NodeState(node, state="ready")
    if word in ("cordoned", "down"):
        return NodeState(node, drained=word == "cordoned", down=word == "down", reason=rest.strip(), state=word)
    raise ValueError(f"the state hook printed {line!r}: expected `ready`, `cordoned <reason>` or `down <why>`")


def parse_busy(text: str) -> list[Job]:
    """A busy hook's answer, one workload a line: `job ID USER SECONDS|- [NAME]` is a job with its time left; any
    other line is a workload named by the line itself (`pod ns/name`), its user `-`."""
    jobs = []
    for line in (line.strip() for line in text.split("\n")):
        words = line.split(" ", 4)
        if len(words) >= 4 and words[0] == "job" and (words[3] == "-" or words[3].isdigit()):
            jobs.append(Job(words[1], words[2], words[4] if len(words) == 5 else "",
                            None if words[3] == "-" else int(words[3])))
        elif line:
            jobs.append(Job(line, "-"))
    return jobs


def expand(template: str, values: dict[str, str]) -> list[str]:
    """argv from a template: shlex.split, then each placeholder replaced inside the words it is part of."""
    argv = []
    for word in shlex.split(template):
        for placeholder, value in values.items():
            word = word.replace(placeholder, value)
        argv.append(word)
    return argv


class HookScheduler:
    """The Scheduler protocol over the inventory's hook commands (see the module's text)."""

    kind = "hook"

    def nodes(self, hosts: list) -> dict[str, NodeState]:
        """Each host's `state` hook."""
        states = {}
        for host in hosts:
            node = checked_node(host, "rollout.nodes")
            out = self._call(host, "state", node)
            try:
                states[host.name] = parse_state(node, out)
            except ValueError as exc:
                raise GpuprovError(str(exc), host=host.name, step="rollout.nodes", output=out,
                                   hint="make the state hook print one of those lines") from None
        return states

    def jobs(self, host) -> list[Job]:
        return parse_busy(self._call(host, "busy", checked_node(host, "rollout.jobs")))

    def drain(self, host, reason: str) -> None:
        node = checked_node(host, "rollout.drain")
        reason = checked_reason(host, reason, "rollout.drain")
        state = self._ours(host, "rollout.drain")
        if not (state.drained and state.reason == reason):
            self._call(host, "cordon", node, reason)

    def set_reason(self, host, reason: str) -> None:
        node = checked_node(host, "rollout.set_reason")
        reason = checked_reason(host, reason, "rollout.set_reason")
        self._ours(host, "rollout.set_reason")
        self._call(host, "cordon", node, reason)

    def resume(self, host) -> None:
        node = checked_node(host, "rollout.resume")
        if not self._ours(host, "rollout.resume").drained:
            return
        self._call(host, "uncordon", node)

    def _ours(self, host, step: str) -> NodeState:
        """The node's state, refused when someone other than gpuprov cordoned it."""
        state = self.nodes([host])[host.name]
        if state.drained and not state.drained_by():
            raise GpuprovError(f"node {state.node} was cordoned by someone else ({state.reason or 'no reason'}): "
                               "gpuprov leaves it as it is", host=host.name, step=step,
                               hint="uncordon it yourself when it may take work again")
        return state

    def _templates(self, host, hook: str) -> list[str]:
        """The hook's commands, all the host's hooks checked first."""
        settings = host.vars.get("scheduler") or {}
        for name in STEPS:
            check_hook(host.name, name, settings.get(name))
        value = settings.get(hook)
        return [value] if isinstance(value, str) else value

    def _call(self, host, hook: str, node: str, reason: str = "") -> str:
        """Run each of the hook's commands in turn; the last one's stdout."""
        step = STEPS[hook]
        timeout = float((host.vars.get("scheduler") or {}).get("timeout") or DEFAULT_TIMEOUT_S)
        out = ""
        for template in self._templates(host, hook):
            out = run_hook(expand(template, {"{node}": node, "{reason}": reason}), timeout, host.name, step, hook)
        return out


def run_hook(argv: list[str], timeout: float, host: str, step: str, hook: str) -> str:
    """Run one hook command on this machine, without a shell, in its own process group (killed whole at the
    timeout); its stdout, or GpuprovError naming the host, step, command, exit code and output."""
    command = shlex.join(argv)
    try:
        done = run_bounded(argv, timeout, text=True, errors="replace")
    except OSError as exc:
        raise GpuprovError(f"the {hook} hook could not start: {exc.strerror}", host=host, step=step, command=command,
                           hint=f"install {argv[0]} on this machine or fix scheduler.{hook}") from None
    except subprocess.TimeoutExpired as exc:
        raise GpuprovError(f"the {hook} hook ran past {timeout:g} s and was stopped", host=host, step=step,
                           command=command, output=(exc.stdout or "") + (exc.stderr or ""),
                           hint="raise scheduler.timeout, or make the hook answer sooner") from None
    out, err = done.stdout, done.stderr
    if done.returncode != 0:
        raise GpuprovError(f"the {hook} hook failed (exit {done.returncode})", host=host, step=step,
                           command=command, output=out + err,
                           hint=f"run it by hand on this machine: {command}")
    return out


class NoScheduler:
    """No scheduler: nothing to drain; a host's work is what its facts show (gpuprov.core.busy.running_work)."""

    kind = "none"

    def __init__(self, facts_of: Callable[[object], dict]):
        self._facts_of = facts_of

    def nodes(self, hosts: list) -> dict[str, NodeState]:
        return {host.name: NodeState(node_name(host), state="no scheduler") for host in hosts}

    def jobs(self, host) -> list[Job]:
        return [Job(work, "-") for work in running_work(self._facts_of(host))]

    def drain(self, host, reason: str) -> None:
        """Nothing to drain."""

    def resume(self, host) -> None:
        """Nothing to resume."""

    def set_reason(self, host, reason: str) -> None:
        """Nothing keeps a reason."""
