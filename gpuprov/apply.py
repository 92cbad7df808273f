"""Apply a host's plan: every change's commands in one batched SSH command, with per-step markers.

The batch stops at the first failing step; the markers tell which change failed, with its output tail,
how long each step took, and which steps had already completed.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpuprov.errors import GpuprovError

STEP = re.compile(r"^@@gpuprov:step (\d+) (start|rc=(\d+)) ([\d.]+)$", re.M)


@dataclass
class StepResult:
    """One change as applied: its exit status, duration and output."""

    component: str
    summary: str
    commands: list[str]
    rc: int | None
    duration: float
    output: str

    def to_dict(self) -> dict:
        return {"component": self.component, "summary": self.summary, "commands": self.commands,
                "rc": self.rc, "duration_s": round(self.duration, 3), "output_tail": self.output[-2000:]}


def batch_script(changes: list) -> str:
    """One shell script running each change's commands in order, stopping at the first failure."""
    lines = ["exec 2>&1", "now() { date +%s.%N; }"]
    for index, change in enumerate(changes):
        # a change that takes effect at the next boot says so the Debian way, so later runs still know
        body = "\n".join(change.commands + (("touch /run/reboot-required",) if change.reboot else ()))
        lines += [
            f"echo \"@@gpuprov:step {index} start $(now)\"",
            f"sh -ec {shlex.quote(body)}",
            "rc=$?",
            f"echo \"@@gpuprov:step {index} rc=$rc $(now)\"",
            '[ "$rc" -eq 0 ] || exit "$rc"',
        ]
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


def apply_changes(conn, changes: list) -> list[StepResult]:
    """Run the changes on the host as root; raise GpuprovError naming the failed step."""
    if not changes:
        return []
    script = batch_script(changes)
    result = conn.run(f"sh -c {shlex.quote(script)}", sudo=True)
    steps = parse_steps(changes, result.stdout)
    failed = next((step for step in steps if step.rc != 0), None)
    if failed is None and (result.rc != 0 or len(steps) != len(changes)):
        raise GpuprovError(f"the batch ended with exit code {result.rc} before all steps ran",
                           host=conn.host.name, step="apply", output=result.stdout + result.stderr,
                           hint="rerun provision: every step is idempotent and the run converges")
    if failed is not None:
        error = GpuprovError(
            f"{failed.component}: {failed.summary} failed with exit code {failed.rc}",
            host=conn.host.name, step=failed.component, command="\n".join(failed.commands),
            output=failed.output or result.stderr,
            hint="fix the cause shown above, then rerun provision; completed steps are not repeated")
        error.steps = steps
        raise error
    return steps
