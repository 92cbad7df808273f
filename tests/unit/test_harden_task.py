"""`invoke harden` on the fleet runtime: the exit code run_fleet gives each way a host can end (a lockout refused, a
guarded change rolled back or not known to have stayed, a failing control, a dry run's failing controls, bad input
on every host), the report (harden or harden-check) with each host's entry and the run's options, and what is
printed. Hosts are stand-ins: the connection is a LocalConn answering nothing and each host's run is the record it
is given."""

from __future__ import annotations

import json

import pytest
from helpers.tasks import config
from invoke.exceptions import Exit

import gpuprov.harden.run
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.harden.confirm import GuardOutcome
from gpuprov.harden.guard import Guard
from gpuprov.harden.run import HardenRecord
from gpuprov.tasks import harden as harden_tasks

PASS = {"id": "ssh-macs", "area": "ssh", "status": "pass", "observed": ["hmac-sha2-512-etm@openssh.com"],
        "expected": ["hmac-sha2-512-etm@openssh.com"]}
FAIL = {"id": "firewall-loaded", "area": "firewall", "status": "fail", "observed": None, "expected": "loaded"}
GUARD = Guard("20261202T020000-ab12cd34", 60, ("/etc/ssh/sshd_config.d/10-gpuprov.conf",), False, ())


def record(name: str, status: str, controls: tuple = (PASS,), guard: str | None = None) -> HardenRecord:
    return HardenRecord(name, status=status, controls=list(controls),
                        guard=GuardOutcome(GUARD, guard, "no new SSH connection got through") if guard else None)


def hosts_end(monkeypatch, behave) -> None:
    """Each host's harden run replaced by `behave(host)`: a HardenRecord, or an error raised."""
    monkeypatch.setattr(gpuprov.harden.run.HardenJob, "run_host", lambda job, conn, say: behave(conn.host))


def report(tmp_path, kind: str = "harden") -> dict:
    return json.loads((tmp_path / "reports" / f"{kind}-latest.json").read_text())


def run(tmp_path, capsys, **flags) -> tuple[int, str]:
    try:
        harden_tasks.harden(config(tmp_path), group=["hgx"], **flags)
    except Exit as stop:
        return stop.code, capsys.readouterr().out
    return 0, capsys.readouterr().out


@pytest.mark.parametrize(("second", "flags", "code"), [
    (record("gpu02", "unchanged"), {}, 0),
    (record("gpu02", "changed"), {}, 0),
    (record("gpu02", "refused", controls=()), {}, 1),
    (record("gpu02", "rolled back", guard="rolled back by the host"), {}, 1),
    (record("gpu02", "unknown", guard="unknown"), {}, 1),
    (record("gpu02", "changed", controls=(PASS, FAIL)), {}, 1),
    (record("gpu02", "unchanged", controls=(FAIL,)), {}, 1),
    (record("gpu02", "planned", controls=(PASS, FAIL)), {"dry_run": True}, 0),
    (record("gpu02", "refused", controls=()), {"dry_run": True}, 1),
])
def test_the_exit_code_of_each_way_a_host_ends(tmp_path, capsys, contacted, monkeypatch, second, flags, code):
    hosts_end(monkeypatch, lambda host: record("gpu01", "changed") if host.name == "gpu01" else second)
    assert run(tmp_path, capsys, **flags)[0] == code
    entries = {entry["host"]: entry for entry in report(tmp_path)["hosts"]}
    assert entries["gpu02"]["status"] == second.status and entries["gpu01"]["status"] == "changed"
    assert contacted == ["gpu01", "gpu02"]


def test_check_reports_as_harden_check_and_a_failing_control_exits_1(tmp_path, capsys, contacted, monkeypatch):
    hosts_end(monkeypatch, lambda host: record(host.name, "checked", controls=(PASS, FAIL)))
    code, out = run(tmp_path, capsys, check=True)
    assert code == 1
    document = report(tmp_path, "harden-check")
    assert (document["check"], document["dry_run"], document["only"], document["interrupted"]) == (
        True, False, ["firewall", "ssh", "updates"], False)
    assert [entry["controls"] for entry in document["hosts"]] == [[PASS, FAIL], [PASS, FAIL]]
    assert not (tmp_path / "reports" / "harden-latest.json").exists()
    assert "harden --check" in out and "firewall-loaded" in out           # the controls table
    assert "1 pass, 1 fail, 0 waived" in out                                 # the summary's row


def test_every_host_failing_on_bad_input_is_exit_2(tmp_path, capsys, contacted, monkeypatch):
    def behave(host):
        raise InputError("variable firewall: bad", host=host.name, step="policy")

    hosts_end(monkeypatch, behave)
    assert run(tmp_path, capsys)[0] == 2
    assert [(e["host"], e["status"], e["error"]["error"]) for e in report(tmp_path)["hosts"]] == [
        ("gpu01", "failed", "variable firewall: bad"), ("gpu02", "failed", "variable firewall: bad")]


def test_a_host_failing_otherwise_is_exit_1_with_the_record_it_carried(tmp_path, capsys, contacted, monkeypatch):
    def behave(host):
        if host.name == "gpu01":
            raise InputError("variable firewall: bad", host=host.name, step="policy")
        error = GpuprovError("ssh: reload failed", host=host.name, step="ssh", hint="fix it")
        error.run = record(host.name, "failed", controls=(), guard="reverted by gpuprov")
        raise error

    hosts_end(monkeypatch, behave)
    code, out = run(tmp_path, capsys)
    assert code == 1
    failed = report(tmp_path)["hosts"][1]
    assert (failed["status"], failed["guard"]["result"], failed["error"]["hint"]) == (
        "failed", "reverted by gpuprov", "fix it")
    assert "gpu02: FAILED ssh: reload failed" in out


def test_the_run_level_fields_and_the_json_document(tmp_path, capsys, contacted, monkeypatch):
    hosts_end(monkeypatch, lambda host: record(host.name, "planned"))
    code, out = run(tmp_path, capsys, dry_run=True, only="ssh,firewall", confirm_timeout="45", json_=True)
    document = json.loads(out)
    assert code == 0
    assert (document["check"], document["dry_run"], document["only"], document["confirm_timeout"]) == (
        False, True, ["firewall", "ssh"], 45)
    assert document["report"] == str(sorted((tmp_path / "reports").glob("harden-2*.json"))[0])
    assert [entry["host"] for entry in document["hosts"]] == ["gpu01", "gpu02"]
    assert json.loads((tmp_path / "reports" / "harden-latest.json").read_text())["hosts"] == document["hosts"]
