"""The commit-confirmed guard's shell, run for real with /bin/sh in a temporary folder (this machine has no systemd
as PID 1, so the revert is the detached background job): the host reverts by itself unless confirmed in time, a
step slower than the timer is undone once it ends, a step after the decision never runs, a reboot inside the window
is reverted at boot, a second run is refused while the first is undecided, and the controller reports only what the
host says."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.local_host import LocalConn

from gpuprov.core.apply import batch_script, parse_steps
from gpuprov.core.errors import GpuprovError
from gpuprov.core.operations import Change
from gpuprov.harden.confirm import confirm
from gpuprov.harden.guard import MARK, Guard, boot_unit, outcome, undecided_script

OWNER = "run run-1 from controller 10.0.0.9 (op@ctl)"


def sh(script: str, ok: bool = True) -> str:
    proc = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 or not ok, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture
def managed(tmp_path) -> dict[str, Path]:
    conf, link, absent = tmp_path / "sshd.conf", tmp_path / "wants.service", tmp_path / "new.conf"
    conf.write_text("PasswordAuthentication yes\n")
    os.symlink("/etc/hostname", link)
    return {"conf": conf, "link": link, "absent": absent, "base": tmp_path / "guards", "log": tmp_path / "reload",
            "systemd": tmp_path / "systemd"}


def guard_of(managed, seconds: int, run_id: str = "run-1", owner: str = OWNER) -> Guard:
    return Guard(run_id, seconds, (str(managed["conf"]), str(managed["link"]), str(managed["absent"])), False,
                 (f"echo reloaded >> {managed['log']}",), base=str(managed["base"]), owner=owner,
                 systemd_dir=str(managed["systemd"]))


def arm(managed, seconds: int, run_id: str = "run-1", owner: str = OWNER) -> Guard:
    guard = guard_of(managed, seconds, run_id, owner)
    steps = parse_steps([guard.arm()], sh(batch_script([guard.arm()])))
    assert [s.status for s in steps] == ["done"], steps
    return guard


def change_everything(managed) -> None:
    managed["conf"].write_text("PasswordAuthentication no\n")
    managed["link"].unlink()
    managed["absent"].write_text("created by the change\n")


def restored(managed) -> bool:
    return (managed["conf"].read_text() == "PasswordAuthentication yes\n" and managed["link"].is_symlink()
            and os.readlink(managed["link"]) == "/etc/hostname" and not managed["absent"].exists())


def wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), path


def test_unconfirmed_change_is_reverted_by_the_host(managed):
    guard = arm(managed, 2)
    change_everything(managed)
    wait_for(managed["base"] / "run-1" / "reverted")
    assert restored(managed)
    assert managed["log"].read_text() == "reloaded\n"
    answer = outcome(sh(guard.status_script()))
    assert (answer.word, answer.by) == ("reverted", "timer") and answer.when.endswith("Z")
    assert f"restored {managed['conf']}" in answer.log
    # the record stays, the snapshots and the mark of an undecided run go
    assert sorted(os.listdir(managed["base"] / "run-1")) == ["decided", "owner", "pid", "revert.log", "revert.sh",
                                                               "reverted"]


def test_confirmed_change_stays(managed):
    guard = arm(managed, 3)
    change_everything(managed)
    assert outcome(sh(guard.confirm_script())).word == "confirmed"
    time.sleep(4)
    assert managed["conf"].read_text() == "PasswordAuthentication no\n" and managed["absent"].exists()
    assert not managed["log"].exists() and not (managed["base"] / "run-1" / "armed").exists()


def test_late_confirmation_learns_the_host_reverted(managed):
    guard = arm(managed, 1)
    change_everything(managed)
    wait_for(managed["base"] / "run-1" / "reverted")
    answer = outcome(sh(guard.confirm_script()))
    assert (answer.word, answer.by) == ("reverted", "timer") and restored(managed) and "restored" in answer.log


def test_revert_now_puts_everything_back_at_once(managed):
    guard = arm(managed, 60)
    change_everything(managed)
    answer = outcome(sh(guard.revert_now_script()))
    assert (answer.word, answer.by) == ("reverted", "gpuprov") and restored(managed)


def test_status_before_the_deadline_is_pending_and_a_repeated_confirmation_reads_the_decision(managed):
    guard = arm(managed, 30)
    assert outcome(sh(guard.status_script())).word == "pending"
    assert outcome(sh(guard.confirm_script())).word == "confirmed"
    assert outcome(sh(guard.confirm_script())).word == "confirmed"   # a retry after a lost reply
    assert outcome(sh(guard_of(managed, 30, "never-armed").confirm_script())).word == "missing"


def test_a_step_slower_than_the_timer_is_undone_once_it_ends(managed):
    """The reproduction: a 2 s timer, a 4 s guarded step. The revert waits for the step, then undoes it; a later
    guarded step either ran before the revert (and is undone with it) or refuses to run."""
    guard = guard_of(managed, 2)
    slow = Change("ssh", "slow", ("sleep 4", f"printf 'PasswordAuthentication no\\n' > {managed['conf']}"))
    later = Change("firewall", "later", (f"echo later > {managed['absent']}",))
    changes = [guard.arm(), guard.guarded(slow), guard.guarded(later)]
    steps = parse_steps(changes, sh(batch_script(changes), ok=False))
    assert [s.status for s in steps][:2] == ["done", "done"]
    assert steps[2].status == "done" or "refused: the host already reverted run run-1" in steps[2].output
    answer = outcome(sh(guard.confirm_script()))
    assert (answer.word, answer.by) == ("reverted", "timer"), answer
    assert managed["conf"].read_text() == "PasswordAuthentication yes\n" and not managed["absent"].exists()


def test_no_guarded_step_runs_once_the_run_is_decided(managed):
    guard = arm(managed, 60)
    assert outcome(sh(guard.revert_now_script())).word == "reverted"
    step = guard.guarded(Change("firewall", "load", (f"echo new > {managed['absent']}",)))
    (result,) = parse_steps([step], sh(batch_script([step]), ok=False))
    assert result.status == "failed" and "refused: the host already reverted run run-1" in result.output
    assert re.search(r"\(\d{4}-\d\d-\d\dT[\d:]+Z gpuprov\)", result.output) and not managed["absent"].exists()


def boot(unit: str) -> str:
    """The boot unit's ExecStart as systemd runs it: /bin/sh -c with `$$` unescaped."""
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    match = re.fullmatch(r"ExecStart=/bin/sh -c '(.*)'", line)
    return match.group(1).replace("$$", "$")


def test_a_reboot_inside_the_window_is_reverted_at_boot(managed):
    guard = arm(managed, 60)
    change_everything(managed)
    os.kill(int((managed["base"] / "run-1" / "pid").read_text()), signal.SIGKILL)   # the reboot: the timer is gone
    subprocess.run(["sh", "-c", boot(boot_unit(str(managed["base"])))], check=True, timeout=60)
    assert restored(managed) and not managed["log"].exists()   # nothing to reload: nothing runs yet at boot
    answer = outcome(sh(guard.status_script()))
    assert (answer.word, answer.by) == ("reverted", "boot")
    subprocess.run(["sh", "-c", boot(boot_unit(str(managed["base"])))], check=True, timeout=60)   # next boot
    assert outcome(sh(guard.status_script())).when == answer.when


@pytest.mark.tool
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_boot_unit(tmp_path):
    path = tmp_path / "gpuprov-harden-boot-revert.service"
    path.write_text(boot_unit())
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "gpuprov" not in proc.stderr, proc.stderr


def test_a_second_run_is_refused_while_the_first_is_undecided_and_names_it(managed):
    first = arm(managed, 60)
    assert sh(undecided_script(str(managed["base"]))).startswith(f"{MARK}busy {OWNER}, started 20")
    second = guard_of(managed, 60, "run-2", "run run-2 from controller 10.0.0.8 (other@ctl2)")
    (step,) = parse_steps([second.arm()], sh(batch_script([second.arm()]), ok=False))
    assert step.status == "failed" and re.search(
        r"refused: another harden run's guard is still undecided on this host: run run-1 from controller 10\.0\.0\.9 "
        r"\(op@ctl\), started \d{4}-\d\d-\d\dT[\d:]+Z", step.output), step.output
    assert not (managed["base"] / "run-2").exists()
    assert outcome(sh(first.confirm_script())).word == "confirmed"
    assert sh(undecided_script(str(managed["base"]))) == ""
    arm(managed, 60, "run-2")


def lossy_host(lose: int = 1) -> LocalConn:
    """This machine as the host, its scripts run with sh; the first `lose` replies are lost after the command ran."""
    lost = [lose]

    def answer(command: str, stdin: str | None) -> str:
        stdout = sh(stdin)
        if lost[0]:
            lost[0] -= 1
            raise GpuprovError("the connection dropped", host="gpu01")
        return stdout

    return LocalConn(name="gpu01", answer=answer)


def test_a_lost_confirmation_reply_is_still_confirmed(managed):
    guard = arm(managed, 30)
    result = confirm(lossy_host(), guard, time.monotonic())
    assert result.result == "confirmed" and not result.hint


def test_a_missing_guard_is_unknown_and_the_hint_names_the_guard_folder(managed):
    guard = guard_of(managed, 30)
    result = confirm(lossy_host(lose=0), guard, time.monotonic())
    assert result.result == "unknown" and "no guard folder for this run" in result.detail
    assert f"ls {guard.directory}" in result.hint and f"sh {guard.directory}/revert.sh" in result.hint


def test_run_ids_are_plain():
    with pytest.raises(ValueError):
        Guard("x; reboot", 60, (), False)
