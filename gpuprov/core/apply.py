"""Apply a host's plan: every change's commands in one batched SSH command, with per-step markers.

The batch travels on stdin (never on the command line, which every user of the host can read in
/proc/PID/cmdline). It stops at the first failing step; the markers tell which change failed, with its output
tail, how long each step took, and which steps had already completed. A disruptive step first checks, on
the host, that no work runs there (unless the operator said --disrupt): a refused step ends with
`REFUSED_RC` and the batch goes on. After the last step the batch gathers the host's facts again, so
verification costs no extra round trip.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from gpuprov.core.busy import REFUSED_MARK, REFUSED_RC, guard
from gpuprov.core.errors import GpuprovError

STEP = re.compile(r"^@@gpuprov:step (\d+) (start|rc=(\d+)) ([\d.]+)$", re.M)
FACTS_MARK = "@@gpuprov-batch:facts"
REBOOT_PENDING = "/run/gpuprov/reboot-pending"


@dataclass
class StepResult:
    """One change as applied: its exit status, duration and output."""

    component: str
    summary: str
    commands: list[str]
    rc: int | None
    duration: float
    output: str

    @property
    def status(self) -> str:
        if self.rc == REFUSED_RC and REFUSED_MARK in self.output:  # the guard's, not a command's own 75
            return "refused"
        return {0: "done", None: "cut off"}.get(self.rc, "failed")

    def to_dict(self) -> dict:
        return {"component": self.component, "summary": self.summary, "commands": self.commands,
                "status": self.status, "rc": self.rc, "duration_s": round(self.duration, 3),
                "output_tail": self.output[-2000:]}


def step_body(change, disrupt: bool) -> str:
    """A change's commands, behind the busy guard when it is disruptive; a change that takes effect at the
    next boot records that (gpuprov's own mark, and the Debian one other tools read)."""
    lines = list(change.commands)
    if change.disruptive and not disrupt:
        lines.insert(0, guard(change.disruptive))
    if change.reboot:
        why = shlex.quote(f"{change.component}: {change.summary}"[:300])
        lines += [f"mkdir -p {shlex.quote(REBOOT_PENDING.rsplit('/', 1)[0])}",
                  f"printf '%s\\n' {why} >> {shlex.quote(REBOOT_PENDING)}", "touch /run/reboot-required"]
    return "\n".join(lines)


def batch_script(changes: list, *, disrupt: bool = False, facts_command: str | None = None) -> str:
    """One shell script running each change in order, stopping at the first failure (a refused step is
    not a failure); `facts_command`, when given, runs at the end."""
    lines = ["exec 2>&1", "now() { date +%s.%N; }"]
    for index, change in enumerate(changes):
        # a subshell, not `sh -c BODY`: file contents (credentials) never reach a command line, and nothing a
        # step runs can read the rest of this script from stdin
        lines += [
            f"echo \"@@gpuprov:step {index} start $(now)\"",
            f"( set -e\n{step_body(change, disrupt)}\n) </dev/null",
            "rc=$?",
            f"echo \"@@gpuprov:step {index} rc=$rc $(now)\"",
            f'[ "$rc" -eq 0 ] || [ "$rc" -eq {REFUSED_RC} ] || exit "$rc"',
        ]
    if facts_command:
        lines += [f"echo {FACTS_MARK}", f"{facts_command} </dev/null"]
    return "\n".join(lines) + "\n"


def parse_steps(changes: list, output: str) -> list[StepResult]:
    """Per-step results from the batch's output (steps that never started are left out)."""
    starts: dict[int, tuple[float, int]] = {}
    results: list[StepResult] = []
    for match in STEP.finditer(output):
        index, stamp = int(match.group(1)), float(match.group(4))
        if match.group(2) == "start":
            starts[index] = (stamp, match.end())
            continue
        begun, offset = starts.pop(index)
        change = changes[index]
        results.append(StepResult(change.component, change.summary, list(change.commands),
                                  int(match.group(3)), stamp - begun, output[offset:match.start()].strip("\n")))
    for index, (_begun, offset) in starts.items():  # started, never finished: the connection dropped
        change = changes[index]
        results.append(StepResult(change.component, change.summary, list(change.commands), None, 0.0,
                                  output[offset:].strip("\n")))
    return results


def apply_changes(conn, changes: list, *, disrupt: bool = False, managed_files: tuple[str, ...] = (),
                  facts: tuple[str, Callable] | None = None, known: dict | None = None,
                  task: str = "provision") -> tuple[list[StepResult], dict]:
    """Run the changes on the host as root, then gather its facts in the same command: the base facts, or
    `facts` = (the command that gathers them, parse(conn, stdout, stderr)). With `known` (the base facts before
    the batch), only the facts the changes can alter are gathered again when every change says which
    (gpuprov.facts.gather.affected). `task` is what the hints say to rerun.

    Returns the step results and the facts after; raises GpuprovError naming the failed step."""
    if facts is None:
        from gpuprov.facts.gather import affected, facts_command, parse_gathered, regather

        names = affected(changes) if known is not None else None
        facts = (facts_command(managed_files), parse_gathered) if names is None else (
            regather(known, names, managed_files))
    command, parse_gathered = facts
    script = batch_script(changes, disrupt=disrupt, facts_command=command)
    result = conn.run("sh -s", sudo=True, stdin=script)
    output, _, facts_output = result.stdout.partition(f"\n{FACTS_MARK}\n")
    steps = parse_steps(changes, output)
    failed = next((step for step in steps if step.status in ("failed", "cut off")), None)
    if failed is None and (result.rc != 0 or len(steps) != len(changes)):
        raise GpuprovError(f"the batch ended with exit code {result.rc} before all steps ran",
                           host=conn.host.name, step="apply", output=result.stdout + result.stderr,
                           hint=f"rerun {task}: every step is idempotent and the run converges")
    if failed is not None:
        error = GpuprovError(
            f"{failed.component}: {failed.summary} failed with exit code {failed.rc}",
            host=conn.host.name, step=failed.component, command="\n".join(failed.commands),
            output=failed.output or result.stderr,
            hint=f"fix the cause shown above, then rerun {task}; completed steps are not repeated")
        error.steps = steps
        raise error
    return steps, parse_gathered(conn, facts_output, result.stderr)
