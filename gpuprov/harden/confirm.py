"""The controller's side of commit-confirmed changes: after the guarded batch, a NEW SSH connection cancels the
host's revert; when no new connection gets through in time, the host reverts by itself and gpuprov, once the
deadline has passed, connects again to read what was put back.

Only what the host says is reported: confirmed, or reverted (by its timer, at boot, or by gpuprov). Anything else
(a lost reply, a guard folder that is gone, a lock that stays taken) is "unknown", with where to look on the host."""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuprov.core.errors import GpuprovError
from gpuprov.harden.guard import Answer, Guard, outcome

MARGIN_S = 5          # the last new connection starts this long before the host's deadline
AFTER_REVERT_S = 5    # how long after the deadline gpuprov looks again
RECONNECT_S = 120     # how long gpuprov tries to reach a host that reverted
BY_HOST = "rolled back by the host"
REVERTED = {"timer": (BY_HOST, "the host's revert timer ran first"),
            "boot": (BY_HOST, "the host rebooted inside the confirm window and put the previous configuration back "
                              "at boot"),
            "gpuprov": ("reverted by gpuprov", "")}


@dataclass
class GuardOutcome:
    """What became of one guarded batch."""

    guard: Guard
    result: str = "pending"          # confirmed | rolled back by the host | reverted by gpuprov | unknown
    detail: str = ""
    reverted_at: str = ""
    log: str = ""
    hint: str = ""                   # for "unknown": where to look on the host

    @property
    def rolled_back(self) -> bool:
        return self.result != "confirmed"

    def to_dict(self) -> dict:
        return {"run_id": self.guard.run_id, "seconds": self.guard.seconds, "result": self.result,
                "detail": self.detail, "reverted_at": self.reverted_at, "log": self.log, "hint": self.hint}


def console_hint(guard: Guard) -> str:
    """Where an operator at the host's console learns what became of the run, and how to revert by hand."""
    d = guard.directory
    return (f"on the host's console: ls {d} (confirmed or reverted says what was decided, and when; revert.log "
            f"what was put back); while {d}/armed exists nothing was decided and sh {d}/revert.sh reverts it; "
            f"no {d} at all means this run never armed its guard there")


def _unknown(result: GuardOutcome, why: str) -> GuardOutcome:
    result.result, result.detail, result.hint = "unknown", why, console_hint(result.guard)
    return result


def _decided(result: GuardOutcome, answer: Answer, why: str = "") -> GuardOutcome:
    """The outcome the host's answer says; "unknown" for anything but confirmed or reverted."""
    if answer.word == "confirmed":
        result.result, result.detail = "confirmed", "a new SSH connection got through; the revert is cancelled"
        return result
    if answer.word != "reverted" or answer.by not in REVERTED:
        what = {"missing": "the host has no guard folder for this run",
                "busy": "the host's harden lock stayed taken",
                "pending": "the host's guard is decided but neither confirmed nor reverted"}.get(
                    answer.word, "the host's answer names no decision")
        return _unknown(result, "; ".join(filter(None, (why, what))))
    result.result, detail = REVERTED[answer.by]
    result.detail = "; ".join(filter(None, (why, detail)))
    result.reverted_at, result.log = answer.when, answer.log
    return result


def _run_fresh(conn, script: str, connect_timeout: int, timeout: int = 420):
    fresh = conn.fresh(connect_timeout=max(1, connect_timeout), retries=0)
    try:
        fresh.open()
        return fresh.run("sh -s", sudo=True, stdin=script, timeout=timeout)
    finally:
        fresh.close()


def confirm(conn, guard: Guard, armed_before: float) -> GuardOutcome:
    """Cancel the revert over a new connection, trying until shortly before the host's deadline (counted from
    `armed_before`, a monotonic time taken before the batch started, so never later than the host's own). A retry
    after a lost reply reads the decision the first attempt made."""
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
        return _decided(result, outcome(answer.stdout))
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
        found = outcome(answer.stdout)
        if found.word == "pending":
            time.sleep(2)
            continue
        return _decided(result, found, f"{why}; SSH works again")
    raise GpuprovError(f"{why}, and the host still does not answer {RECONNECT_S}s after its revert deadline "
                       f"({failure}): the outcome is unknown", host=conn.host.name, step="confirm",
                       hint=console_hint(guard))


def revert_now(conn, guard: Guard, armed_before: float, why: str) -> GuardOutcome:
    """Put the previous configuration back at once (a guarded step failed, or its result was not the policy)."""
    result = GuardOutcome(guard, detail=why)
    try:
        answer = _run_fresh(conn, guard.revert_now_script(), conn.connect_timeout)
    except GpuprovError as exc:
        return _after_deadline(conn, guard, armed_before, result,
                               f"{why}; gpuprov could not reach the host to revert ({exc.message.splitlines()[0]})")
    return _decided(result, outcome(answer.stdout), why)
