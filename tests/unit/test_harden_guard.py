"""The commit-confirmed guard's shell, run for real with /bin/sh in a temporary folder (this machine has no systemd
as PID 1, so the revert is the detached background job): the host reverts by itself unless confirmed in time."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpuprov.apply import batch_script, parse_steps
from gpuprov.harden.guard import Guard, outcome


def sh(script: str) -> str:
    proc = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture
def managed(tmp_path) -> dict[str, Path]:
    conf, link, absent = tmp_path / "sshd.conf", tmp_path / "wants.service", tmp_path / "new.conf"
    conf.write_text("PasswordAuthentication yes\n")
    os.symlink("/etc/hostname", link)
    return {"conf": conf, "link": link, "absent": absent, "base": tmp_path / "guards", "log": tmp_path / "reload"}


def arm(managed, seconds: int, run_id: str = "run-1") -> Guard:
    guard = Guard(run_id, seconds, (str(managed["conf"]), str(managed["link"]), str(managed["absent"])), False,
                  (f"echo reloaded >> {managed['log']}",), base=str(managed["base"]))
    steps = parse_steps([guard.arm()], sh(batch_script([guard.arm()])))
    assert [s.status for s in steps] == ["done"]
    return guard


def change_everything(managed) -> None:
    managed["conf"].write_text("PasswordAuthentication no\n")
    managed["link"].unlink()
    managed["absent"].write_text("created by the change\n")


def restored(managed) -> bool:
    return (managed["conf"].read_text() == "PasswordAuthentication yes\n" and managed["link"].is_symlink()
            and os.readlink(managed["link"]) == "/etc/hostname" and not managed["absent"].exists())


def test_unconfirmed_change_is_reverted_by_the_host(managed):
    started = time.monotonic()
    guard = arm(managed, 2)
    change_everything(managed)
    while not (managed["base"] / "run-1" / "reverted").exists() and time.monotonic() - started < 15:
        time.sleep(0.2)
    assert restored(managed)
    assert managed["log"].read_text() == "reloaded\n"
    word, when, log = outcome(sh(guard.status_script()))
    assert word == "reverted" and when.endswith("Z") and f"restored {managed['conf']}" in log
    assert not (managed["base"] / "run-1").exists()   # read once, then cleared


def test_confirmed_change_stays(managed):
    guard = arm(managed, 3)
    change_everything(managed)
    assert outcome(sh(guard.confirm_script()))[0] == "confirmed"
    time.sleep(4)
    assert managed["conf"].read_text() == "PasswordAuthentication no\n" and managed["absent"].exists()
    assert not managed["log"].exists() and os.listdir(managed["base"]) == []


def test_late_confirmation_learns_the_host_reverted(managed):
    guard = arm(managed, 1)
    change_everything(managed)
    time.sleep(2.5)
    word, _, log = outcome(sh(guard.confirm_script()))
    assert word == "reverted" and restored(managed) and "restored" in log


def test_revert_now_puts_everything_back_at_once(managed):
    guard = arm(managed, 60)
    change_everything(managed)
    word, _, _ = outcome(sh(guard.revert_now_script()))
    assert word == "reverted" and restored(managed)


def test_status_before_the_deadline_is_pending(managed):
    guard = arm(managed, 30)
    assert outcome(sh(guard.status_script()))[0] == "pending"
    assert outcome(sh(guard.confirm_script()))[0] == "confirmed"
    assert outcome(sh(guard.confirm_script()))[0] == "missing"


def test_run_ids_are_plain():
    with pytest.raises(ValueError):
        Guard("x; reboot", 60, (), False)
