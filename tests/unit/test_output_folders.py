"""No result is lost: the reports and locks folders (gpuprov.reports, gpuprov.locks) are checked before any host is
contacted (a file, an unwritable folder or an uncreatable one is exit 2 naming the setting, the path and what to
do; a missing one is created when written, and said), and a run that fails midway (a host raising, a gpuprov bug
in one host's worker, Ctrl-C) still writes its report with what completed.

Hosts are stand-ins: `gpuprov.core.executor.connect` is replaced, so nothing leaves this machine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers.tasks import INVENTORY, config, exit_code, host_runs

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.executor import RunInterrupted, Settings, run_on_hosts
from gpuprov.core.report import check_folder
from gpuprov.inventory import Host
from gpuprov.provision.run import ProvisionRecord
from gpuprov.tasks import provision as provision_tasks
from gpuprov.tasks import stack as stack_tasks


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under a folder with its bytes (None for a folder): to show that nothing changed."""
    return {str(p): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def report_of(folder: Path) -> dict:
    return json.loads((folder / "provision-latest.json").read_text())


# --------------------------------------------------------------------------------- folders, checked first

def test_a_reports_setting_that_is_a_file_is_exit_2_before_any_host(tmp_path, capsys, contacted):
    (tmp_path / "reports").write_text("not a folder\n")
    c = config(tmp_path)
    before = snapshot(tmp_path)
    code, err = exit_code(provision_tasks.provision, c, capsys, host=["gpu01"])
    assert code == 2
    assert err == (f"error: gpuprov.reports: {tmp_path / 'reports'} is a file, not a folder\n"
                   "  next: move the file away, or point gpuprov.reports at another folder (invoke.yaml, or "
                   "INVOKE_GPUPROV_REPORTS=PATH)\n")
    assert contacted == [] and snapshot(tmp_path) == before


def test_a_reports_folder_under_a_file_is_exit_2(tmp_path, capsys, contacted):
    (tmp_path / "state").write_text("")
    code, err = exit_code(provision_tasks.provision, config(tmp_path, reports=tmp_path / "state" / "reports"),
                          capsys, host=["gpu01"])
    assert code == 2
    assert err.splitlines()[0] == (f"error: gpuprov.reports: cannot create the folder {tmp_path}/state/reports: "
                                   f"{tmp_path}/state is a file, not a folder")
    assert contacted == []


def test_a_broken_link_as_reports_folder_is_exit_2(tmp_path, capsys, contacted):
    (tmp_path / "reports").symlink_to(tmp_path / "gone")
    code, err = exit_code(provision_tasks.provision, config(tmp_path), capsys, host=["gpu01"])
    assert code == 2
    assert err.splitlines()[0] == (f"error: gpuprov.reports: {tmp_path}/reports is a broken symbolic link (to "
                                   f"{tmp_path}/gone)")
    assert contacted == [] and not (tmp_path / "gone").exists()


def test_an_unwritable_reports_folder_is_exit_2(tmp_path, capsys, contacted, monkeypatch):
    (tmp_path / "reports").mkdir()
    # as root every folder is writable; what the check asks the system is answered "no" here
    monkeypatch.setattr(os, "access", lambda path, mode: not mode & os.W_OK)
    code, err = exit_code(provision_tasks.provision, config(tmp_path), capsys, host=["gpu01"])
    assert code == 2
    assert err == (f"error: gpuprov.reports: cannot write into the folder {tmp_path}/reports (permission denied)\n"
                   "  next: give this user access to it, or point gpuprov.reports at another folder (invoke.yaml, "
                   "or INVOKE_GPUPROV_REPORTS=PATH)\n")
    assert contacted == [] and list((tmp_path / "reports").iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_folder_is_found_for_real(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir(mode=0o555)
    with pytest.raises(InputError, match="cannot write into the folder"):
        check_folder("gpuprov.reports", folder, write=True)


def test_a_missing_reports_folder_is_created_and_said(tmp_path, capsys, contacted, monkeypatch):
    host_runs(monkeypatch, lambda host: ProvisionRecord(host.name))
    reports = tmp_path / "out" / "reports"
    provision_tasks.provision(config(tmp_path, reports=reports), host=["gpu01"])
    captured = capsys.readouterr()
    assert f"created the folder {reports} (gpuprov.reports)\n" in captured.err
    assert report_of(reports)["hosts"][0]["host"] == "gpu01"


@pytest.mark.parametrize(("task", "kwargs"), [
    (provision_tasks.provision, {}), (stack_tasks.check, {}), (stack_tasks.lock, {"os": "debian-12"}),
])
def test_a_locks_setting_that_is_a_file_is_exit_2_before_any_host(tmp_path, capsys, contacted, task, kwargs):
    (tmp_path / "locks").write_text("")
    c = config(tmp_path)
    before = snapshot(tmp_path)
    code, err = exit_code(task, c, capsys, host=["gpu01"], **kwargs)
    assert code == 2
    assert err == (f"error: gpuprov.locks: {tmp_path / 'locks'} is a file, not a folder\n"
                   "  next: move the file away, or point gpuprov.locks at another folder (invoke.yaml, or "
                   "INVOKE_GPUPROV_LOCKS=PATH)\n")
    assert contacted == [] and snapshot(tmp_path) == before


def test_an_unreadable_locks_folder_is_exit_2(tmp_path, capsys, contacted, monkeypatch):
    (tmp_path / "locks").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    code, err = exit_code(stack_tasks.check, config(tmp_path), capsys, host=["gpu01"])
    assert code == 2
    assert err.splitlines()[0] == (f"error: gpuprov.locks: cannot read the folder {tmp_path}/locks (permission "
                                   "denied)")
    assert contacted == []


def test_a_locks_folder_with_a_line_break_is_exit_2_naming_the_setting(tmp_path, capsys):
    locks = tmp_path / "new\nforged:1:1: x" / "locks"
    before = snapshot(tmp_path)
    code, err = exit_code(stack_tasks.lock, config(tmp_path, locks=locks), capsys, group=["hgx"], os="ubuntu-22.04")
    assert code == 2
    assert err == (f"error: gpuprov.locks: must be a path (a non-empty string) without control characters (a line "
                   f"break, a tab, NUL), not {str(locks)!r}\n")
    assert snapshot(tmp_path) == {**before, str(tmp_path / "inventory.yaml"): INVENTORY.encode()}


def test_stack_lock_creates_a_missing_locks_folder_and_says_so(tmp_path, capsys):
    locks = tmp_path / "new" / "locks"
    stack_tasks.lock(config(tmp_path, locks=locks), group=["hgx"], os="ubuntu-22.04")
    captured = capsys.readouterr()
    assert captured.err == f"created the folder {locks} (gpuprov.locks)\n"
    assert [p.name for p in locks.iterdir()] == ["hgx.lock.yaml"]


def test_stack_lock_into_an_uncreatable_folder_is_exit_2_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "state").write_text("")
    code, err = exit_code(stack_tasks.lock, config(tmp_path, locks=tmp_path / "state" / "locks"), capsys,
                          group=["hgx"], os="ubuntu-22.04")
    assert code == 2
    assert err.splitlines()[0] == (f"error: gpuprov.locks: cannot create the folder {tmp_path}/state/locks: "
                                   f"{tmp_path}/state is a file, not a folder")


# ------------------------------------------------------------------------------------ no result is lost

def test_a_host_that_fails_midway_is_in_the_report_with_the_others(tmp_path, capsys, contacted, monkeypatch):
    def behave(host):
        if host.name == "gpu02":
            raise GpuprovError("apt-get failed", host=host.name, step="apply")
        return ProvisionRecord(host.name)

    host_runs(monkeypatch, behave)
    code, _ = exit_code(provision_tasks.provision, config(tmp_path), capsys, group=["hgx"])
    assert code == 1
    hosts = {run["host"]: run for run in report_of(tmp_path / "reports")["hosts"]}
    assert hosts["gpu01"]["status"] == "unchanged"
    assert hosts["gpu02"]["status"] == "failed" and hosts["gpu02"]["error"]["error"] == "apt-get failed"


@pytest.mark.parametrize("exc", [ValueError("boom"), SystemExit(3)])
def test_a_gpuprov_bug_in_one_worker_is_that_hosts_failure(tmp_path, capsys, contacted, monkeypatch, exc):
    def behave(host):
        if host.name == "gpu01":
            raise exc
        return ProvisionRecord(host.name)

    host_runs(monkeypatch, behave)
    code, _ = exit_code(provision_tasks.provision, config(tmp_path), capsys, group=["hgx"])
    assert code == 1
    runs = report_of(tmp_path / "reports")["hosts"]
    assert [run["status"] for run in runs] == ["failed", "unchanged"]
    expected = "internal error: ValueError: boom" if isinstance(exc, ValueError) else "internal error: SystemExit: 3"
    assert runs[0]["error"]["error"] == expected
    assert "Traceback" in runs[0]["error"]["output"]


def interrupt_main() -> None:
    """Ctrl-C: SIGINT delivered to the main thread, as the terminal does."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_ctrl_c_finishes_the_hosts_in_progress_and_writes_the_report(tmp_path, capsys, contacted, monkeypatch):
    def behave(host):
        time.sleep(0.3)  # the run is waiting for its hosts by now
        interrupt_main()
        time.sleep(0.3)
        return ProvisionRecord(host.name)

    host_runs(monkeypatch, behave)
    code, err = exit_code(provision_tasks.provision, config(tmp_path), capsys, all=True, parallel="1")
    assert code == 130
    report = report_of(tmp_path / "reports")
    assert report["interrupted"] is True
    assert [(run["host"], run["status"]) for run in report["hosts"]] == [
        ("gpu01", "unchanged"), ("gpu02", "skipped"), ("gpu03", "skipped")]
    assert report["hosts"][1]["error"]["error"] == "not started: interrupted (Ctrl-C)"
    assert contacted == ["gpu01"]
    assert "interrupted: no new host starts; waiting for the hosts in progress (1)" in err
    assert "interrupted (Ctrl-C): the report " in err


def hosts(*names: str) -> list[Host]:
    return [Host(name=name, address="192.0.2.1") for name in names]


def test_a_second_ctrl_c_stops_waiting_and_closes_the_connections(tmp_path, contacted):
    finished = threading.Event()

    def work(conn):
        time.sleep(0.3)  # the run is waiting for its hosts by now
        interrupt_main()
        time.sleep(0.3)
        interrupt_main()
        closed = conn.closed.wait(10)  # the second Ctrl-C closed it
        finished.set()
        return closed

    with pytest.raises(RunInterrupted) as caught:
        run_on_hosts(hosts("a", "b"), work, Settings(known_hosts=tmp_path / "kh", parallel=1))
    assert finished.wait(10)
    first, second = caught.value.outcomes
    assert first.error.message == "interrupted (Ctrl-C) while in progress: the host may be part-way through a step"
    assert second.skipped and second.error.message == "not started: interrupted (Ctrl-C)"
    assert contacted == ["a"]


def test_the_report_names_stay_unique(tmp_path, contacted, monkeypatch, capsys):
    host_runs(monkeypatch, lambda host: ProvisionRecord(host.name))
    monkeypatch.setattr("gpuprov.core.report._stamp", lambda: "20260101T000000Z")
    for _ in range(2):
        provision_tasks.provision(config(tmp_path), host=["gpu01"])
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [
        "provision-20260101T000000Z-2.json", "provision-20260101T000000Z.json", "provision-latest.json"]
