"""Batches from the command line: --serial, --batch-window and --max-fail-percentage reach the executor through
open_fleet for every changing host job (provision, harden, monitoring.deploy); a bad value is exit 2 naming the flag
before any host is contacted. Hosts are stand-ins (`contacted`) and each host's work is the record it is given."""

from __future__ import annotations

import json
import threading

import pytest
from helpers.tasks import config, exit_code, host_runs

from gpuprov.core.errors import GpuprovError
from gpuprov.provision.run import ProvisionRecord
from gpuprov.tasks import harden as harden_tasks
from gpuprov.tasks import monitoring as monitoring_tasks
from gpuprov.tasks import provision as provision_tasks

ALL = ["gpu01", "gpu02", "gpu03"]   # the helpers' inventory, in its order


def report(tmp_path, kind: str = "provision") -> dict:
    return json.loads((tmp_path / "reports" / f"{kind}-latest.json").read_text())


@pytest.mark.parametrize(("task", "flag", "value"), [
    (provision_tasks.provision, "serial", "0"), (provision_tasks.provision, "serial", "101%"),
    (provision_tasks.provision, "serial", "1,,2"), (provision_tasks.provision, "batch_window", "-1"),
    (provision_tasks.provision, "max_fail_percentage", "nan"), (harden_tasks.harden, "serial", "x"),
    (monitoring_tasks.deploy, "max_fail_percentage", "150"),
])
def test_a_bad_batch_flag_is_exit_2_before_any_host(tmp_path, capsys, contacted, task, flag, value):
    code, err = exit_code(task, config(tmp_path), capsys, all=True, **{flag: value})
    assert code == 2 and contacted == []
    assert f"--{flag.replace('_', '-')} " in err
    assert not (tmp_path / "reports").exists() or list((tmp_path / "reports").iterdir()) == []


def overlap_recorder(monkeypatch) -> list[list[str]]:
    """Each host's work waits briefly for another host to start beside it and records who ran together."""
    running, seen = set(), []
    changed = threading.Condition()

    def behave(host):
        with changed:
            running.add(host.name)
            changed.notify_all()
            changed.wait_for(lambda: len(running) > 1, timeout=2)
            seen.append(sorted(running))
        with changed:
            running.discard(host.name)
        return ProvisionRecord(host.name, status="changed")

    host_runs(monkeypatch, behave)
    return seen


def test_serial_one_runs_the_hosts_one_batch_after_another(tmp_path, capsys, contacted, monkeypatch):
    seen = overlap_recorder(monkeypatch)
    provision_tasks.provision(config(tmp_path), all=True, serial="1")
    assert seen == [["gpu01"], ["gpu02"], ["gpu03"]] and contacted == ALL


def test_without_batches_the_hosts_run_together(tmp_path, capsys, contacted, monkeypatch):
    """The recorder sees hosts together when nothing holds them apart (the serial test above can fail)."""
    seen = overlap_recorder(monkeypatch)
    provision_tasks.provision(config(tmp_path), all=True)
    assert any(len(together) > 1 for together in seen)


def test_a_failed_batch_over_the_percentage_stops_the_run_and_skips_the_rest(tmp_path, capsys, contacted,
                                                                               monkeypatch):
    def behave(host):
        if host.name == "gpu01":
            raise GpuprovError("the driver did not install", host=host.name, step="apply")
        return ProvisionRecord(host.name, status="changed")

    host_runs(monkeypatch, behave)
    code, _ = exit_code(provision_tasks.provision, config(tmp_path), capsys, all=True, serial="2",
                        max_fail_percentage="25")
    entries = report(tmp_path)["hosts"]
    assert code == 1 and sorted(contacted) == ["gpu01", "gpu02"]
    assert [e["status"] for e in entries] == ["failed", "changed", "skipped"]
    assert "1 of 2 hosts failed in batch 1, more than --max-fail-percentage 25% allows" in entries[2]["error"]["error"]
