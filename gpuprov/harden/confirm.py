"""The controller's side of commit-confirmed changes: after the guarded batch, a NEW SSH connection cancels the
host's revert; when no new connection gets through in time, the host reverts by itself and gpuprov, once the
deadline has passed, connects again to read what was put back."""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuprov.errors import GpuprovError
from gpuprov.harden.guard import Guard, outcome

MARGIN_S = 5          # the last new connection starts this long before the host's deadline
AFTER_REVERT_S = 5    # how long after the deadline gpuprov looks again
RECONNECT_S = 120     # how long gpuprov tries to reach a host that reverted


@dataclass
class GuardOutcome:
    """What became of one guarded batch."""

    guard: Guard
    result: str = "pending"          # confirmed | rolled back by the host | reverted by gpuprov
    detail: str = ""
    reverted_at: str = ""
    log: str = ""

    @property
    def rolled_back(self) -> bool:
        return self.result != "confirmed"

    def to_dict(self) -> dict:
        return {"run_id": self.guard.run_id, "seconds": self.guard.seconds, "result": self.result,
                "detail": self.detail, "reverted_at": self.reverted_at, "log": self.log}


def _run_fresh(conn, script: str, connect_timeout: int, timeout: int = 180):
    fresh = conn.fresh(connect_timeout=max(1, connect_timeout), retries=0)
    try:
        fresh.open()
        return fresh.run("sh -s", sudo=True, stdin=script, timeout=timeout)
    finally:
        fresh.close()


def confirm(conn, guard: Guard, armed_before: float) -> GuardOutcome:
    """Cancel the revert over a new connection, trying until shortly before the host's deadline (counted from
    `armed_before`, a monotonic time taken before the batch started, so never later than the host's own)."""
    result = GuardOutcome(guard)
    deadline = armed_before + guard.seconds - MARGIN_S
    failure = "no attempt"
    while time.monotonic() < deadline:
        try:
            answer = _run_fresh(conn, guard.confirm_script(), min(conn.connect_timeout,
                                                                  int(deadline - time.monotonic()) + 1))
        except GpuprovError as exc:
            failure = exc.message.splitlines()[0]
            time.sleep(1)
            continue
        word, when, log = outcome(answer.stdout)
        if word == "confirmed":
            result.result, result.detail = "confirmed", "a new SSH connection got through; the revert is cancelled"
            return result
        result.result, result.reverted_at, result.log = "rolled back by the host", when, log
        result.detail = f"the host reverted before gpuprov could confirm ({word})"
        return result
    return _after_deadline(conn, guard, armed_before, result,
                           f"no new SSH connection got through within {guard.seconds}s ({failure})")


def _after_deadline(conn, guard: Guard, armed_before: float, result: GuardOutcome, why: str) -> GuardOutcome:
    """Wait out the host's revert, then reach it again and read what it put back."""
    time.sleep(max(0.0, armed_before + guard.seconds + AFTER_REVERT_S - time.monotonic()))
    give_up = time.monotonic() + RECONNECT_S
    failure = ""
    while time.monotonic() < give_up:
        try:
            answer = _run_fresh(conn, guard.status_script(), conn.connect_timeout)
        except GpuprovError as exc:
            failure = exc.message.splitlines()[0]
            time.sleep(3)
            continue
        word, when, log = outcome(answer.stdout)
        if word == "pending":
            time.sleep(2)
            continue
        result.result, result.reverted_at, result.log = "rolled back by the host", when, log
        result.detail = f"{why}; the host put the previous configuration back by itself and SSH works again"
        return result
    raise GpuprovError(f"{why}, and the host still does not answer {RECONNECT_S}s after its revert deadline "
                       f"({failure})", host=conn.host.name, step="confirm",
                       hint=f"use the host's console: the revert script is {guard.directory}/revert.sh")


def revert_now(conn, guard: Guard, armed_before: float, why: str) -> GuardOutcome:
    """Put the previous configuration back at once (a guarded step failed, or its result was not the policy)."""
    result = GuardOutcome(guard, detail=why)
    try:
        answer = _run_fresh(conn, guard.revert_now_script(), conn.connect_timeout)
    except GpuprovError as exc:
        return _after_deadline(conn, guard, armed_before, result,
                               f"{why}; gpuprov could not reach the host to revert ({exc.message.splitlines()[0]})")
    word, when, log = outcome(answer.stdout)
    result.result = "reverted by gpuprov" if word == "reverted" else f"revert: {word}"
    result.reverted_at, result.log = when, log
    return result
