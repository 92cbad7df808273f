"""`invoke monitoring.deploy`, `monitoring.server` and `monitoring.targets --server` on the fleet runtime: the exit
code run_fleet gives each way a host ends (an exporter not serving, a failure, bad input on every host, Ctrl-C),
the report (its keys, the failed host's entry keeping what it had), the table, a dry run that changes nothing; and
`monitoring.idle --server`, a read through the fleet's connection. Hosts are MonitoredHosts (helpers.monitoring):
the jobs run for real against connections that answer what they send."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
from helpers.monitoring import MonitoredHost, answer_facts
from helpers.tasks import config, exit_code
from invoke.exceptions import Exit

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.tasks import monitoring as monitoring_tasks

ENTRY_KEYS = {"host", "status", "address", "dcgm_exporter", "plan", "steps", "endpoints"}
NODE_EXPORTER = "install prometheus-node-exporter (the distribution's package)"


@pytest.fixture
def monitored(monkeypatch) -> dict:
    """Each host the task connects to, as a MonitoredHost: `monitored["behave"][name]` are its keyword arguments
    (set before the run), `monitored[name]` the connection once made."""
    hosts: dict = {"behave": {}}

    def connect(host, *args, **kwargs):
        hosts[host.name] = MonitoredHost(host, **hosts["behave"].get(host.name, {}))
        return hosts[host.name]

    monkeypatch.setattr("gpuprov.core.executor.connect", connect)
    answer_facts(monkeypatch)
    return hosts


def report(tmp_path, kind: str = "monitoring-deploy") -> dict:
    return json.loads((tmp_path / "reports" / f"{kind}-latest.json").read_text())


def deploy(tmp_path, capsys, **flags) -> tuple[int, str, str]:
    """monitoring.deploy on the hgx group (gpu01, gpu02): the exit code, stdout and stderr."""
    try:
        monitoring_tasks.deploy(config(tmp_path), group=["hgx"], **flags)
    except Exit as stop:
        captured = capsys.readouterr()
        return stop.code, captured.out, captured.err
    captured = capsys.readouterr()
    return 0, captured.out, captured.err


@pytest.mark.parametrize(("second", "flags", "code", "status"), [
    ({}, {}, 0, "changed"),
    ({"metrics": {"node-exporter": 0}}, {}, 1, "changed"),              # an exporter not serving
    ({"fail_step": 0}, {}, 1, "failed"),
    ({"own": ()}, {}, 1, "failed"),                                     # a failure that is not bad input
    ({"metrics": {"node-exporter": 0}}, {"dry_run": True}, 0, "planned"),   # a dry run reads no exporter
])
def test_the_exit_code_of_each_way_a_deploy_ends(tmp_path, capsys, monitored, second, flags, code, status):
    monitored["behave"]["gpu02"] = second
    assert deploy(tmp_path, capsys, **flags)[0] == code
    first, other = report(tmp_path)["hosts"]
    assert (first["host"], first["status"], other["host"], other["status"]) == (
        "gpu01", "planned" if flags else "changed", "gpu02", status)
    assert first["endpoints"] == ({} if flags else {"node-exporter": "serving"})


def test_every_host_failing_on_bad_input_is_exit_2_and_with_another_failure_1(tmp_path, capsys, monitored,
                                                                               monkeypatch):
    def refused(ctx, policy):
        raise InputError("monitoring.dcgm_exporter_digests: not a digest", host=ctx.host, step="plan")

    monkeypatch.setattr("gpuprov.monitoring.deploy.plan_changes", refused)
    assert deploy(tmp_path, capsys)[0] == 2
    assert [(e["host"], e["status"], e["error"]["error"]) for e in report(tmp_path)["hosts"]] == [
        ("gpu01", "failed", "monitoring.dcgm_exporter_digests: not a digest"),
        ("gpu02", "failed", "monitoring.dcgm_exporter_digests: not a digest")]
    monitored["behave"]["gpu02"] = {"own": ("127.0.1.1",)}     # fails before the plan, and not on bad input
    assert deploy(tmp_path, capsys)[0] == 1


def test_the_failed_hosts_entry_keeps_what_it_had(tmp_path, capsys, monitored):
    monitored["behave"]["gpu02"] = {"fail_step": 1}
    code, out, _ = deploy(tmp_path, capsys)
    assert code == 1
    ok, failed = report(tmp_path)["hosts"]
    assert set(ok) >= ENTRY_KEYS and set(failed) >= ENTRY_KEYS | {"error"}
    assert (failed["status"], failed["address"], failed["dcgm_exporter"], failed["endpoints"]) == (
        "failed", "192.0.2.12", "none", {})
    summaries = [change["summary"] for change in failed["plan"]]
    assert NODE_EXPORTER in summaries
    assert [(step["summary"], step["status"]) for step in failed["steps"]] == [(summaries[0], "done"),
                                                                              (summaries[1], "failed")]
    assert failed["error"]["error"].endswith("failed with exit code 100")
    assert "rerun monitoring.deploy" in failed["error"]["hint"]
    assert "gpu02: FAILED" in out
    for column in ("host", "status", "changes", "exporters", "detail"):
        assert column in out
    assert "node-exporter serving" in out and "monitoring-deploy" in out


def test_ctrl_c_is_exit_130_and_the_report_has_what_completed(tmp_path, capsys, monitored):
    def ctrl_c():
        time.sleep(0.3)   # the run is waiting for its hosts by now
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)   # as the terminal delivers it
        time.sleep(0.3)

    monitored["behave"]["gpu01"] = {"on_probe": ctrl_c}
    code, _, err = deploy(tmp_path, capsys, parallel="1")
    assert code == 130
    document = report(tmp_path)
    assert document["interrupted"] is True
    assert [(e["host"], e["status"]) for e in document["hosts"]] == [("gpu01", "changed"), ("gpu02", "skipped")]
    assert document["hosts"][0]["endpoints"] == {"node-exporter": "serving"}
    assert document["hosts"][1]["error"]["error"] == "not started: interrupted (Ctrl-C)"
    assert "gpu02" not in monitored
    assert "interrupted (Ctrl-C): the report " in err


def test_the_json_document_and_the_report(tmp_path, capsys, monitored):
    code, out, _ = deploy(tmp_path, capsys, json_=True)
    document = json.loads(out)
    assert code == 0
    assert document["report"] == str(sorted((tmp_path / "reports").glob("monitoring-deploy-2*.json"))[0])
    assert (document["dry_run"], document["interrupted"]) == (False, False)
    assert report(tmp_path)["hosts"] == document["hosts"]
    assert [(e["host"], e["status"], e["endpoints"]) for e in document["hosts"]] == [
        ("gpu01", "changed", {"node-exporter": "serving"}), ("gpu02", "changed", {"node-exporter": "serving"})]


def test_a_server_dry_run_plans_and_changes_nothing(tmp_path, capsys, monitored):
    monitoring_tasks.server(config(tmp_path), host="gpu01", dry_run=True)
    out = capsys.readouterr().out
    (entry,) = report(tmp_path, "monitoring-server")["hosts"]
    assert entry["status"] == "planned" and entry["steps"] == []
    assert entry["plan"][0]["summary"] == "install prometheus (the distribution's package, port 9090)"
    assert "write /etc/prometheus/gpuprov/targets/node.json (3 gpuprov-node targets)" in [
        change["summary"] for change in entry["plan"]]
    assert monitored["gpu01"].sent == ["address", "facts"] and set(monitored) == {"behave", "gpu01"}
    assert "monitoring-server (dry run)" in out and "install prometheus" in out   # the plan is shown


def test_a_server_that_fails_is_exit_1_with_its_entry(tmp_path, capsys, monitored):
    monitored["behave"]["gpu01"] = {"fail_step": 2}
    code, _ = exit_code(monitoring_tasks.server, config(tmp_path), capsys, host="gpu01")
    (entry,) = report(tmp_path, "monitoring-server")["hosts"]
    assert code == 1 and entry["status"] == "failed" and len(entry["steps"]) == 3
    assert "rerun monitoring.server" in entry["error"]["hint"]


@pytest.mark.parametrize("flags", [{}, {"host": "gpu09"}, {"host": "gpu01,gpu02"}])
def test_the_monitoring_host_is_one_inventory_host_checked_before_any_host(tmp_path, capsys, monitored, flags):
    code, err = exit_code(monitoring_tasks.server, config(tmp_path), capsys, **flags)
    assert code == 2 and set(monitored) == {"behave"}
    assert ("--host is required" if not flags else f"unknown host {flags['host']!r}") in err


def test_targets_on_the_server(tmp_path, capsys, monitored):
    out_folder = tmp_path / "out"
    monitoring_tasks.targets(config(tmp_path), out=str(out_folder), server="gpu01")
    out = capsys.readouterr().out
    (entry,) = report(tmp_path, "monitoring-targets")["hosts"]
    assert entry["status"] == "changed" and [change["summary"] for change in entry["plan"]] == [
        "write /etc/prometheus/gpuprov/targets/node.json (3 gpuprov-node targets)",
        "write /etc/prometheus/gpuprov/targets/dcgm.json (3 gpuprov-dcgm targets)"]
    assert monitored["gpu01"].sent == ["facts", "apply"]
    assert sorted(p.name for p in (out_folder / "targets").iterdir()) == ["dcgm.json", "node.json"]
    assert f"targets: 3 gpuprov-node, 3 gpuprov-dcgm in {out_folder / 'targets'}" in out


def test_targets_on_a_server_that_fails_is_exit_1_and_says_no_more(tmp_path, capsys, monitored):
    monitored["behave"]["gpu01"] = {"fail_step": 0}
    code, _ = exit_code(monitoring_tasks.targets, config(tmp_path), capsys, out=str(tmp_path / "out"),
                        server="gpu01")
    assert code == 1 and report(tmp_path, "monitoring-targets")["hosts"][0]["status"] == "failed"
    assert "targets: " not in capsys.readouterr().out


def test_targets_on_an_unknown_server_writes_nothing(tmp_path, capsys, monitored):
    code, err = exit_code(monitoring_tasks.targets, config(tmp_path), capsys, out=str(tmp_path / "out"),
                          server="gpu01,gpu02")
    assert code == 2 and "unknown host 'gpu01,gpu02'" in err
    assert not (tmp_path / "out").exists() and set(monitored) == {"behave"}


def test_idle_asks_prometheus_through_the_servers_connection(tmp_path, capsys, contacted, monkeypatch):
    from gpuprov.monitoring.query import Prometheus

    asked = []

    def through_ssh(conn):
        asked.append(conn.host.name)
        return Prometheus(lambda path: b'{"status": "success", "data": {"resultType": "vector", "result": []}}',
                          "gpu01 (through SSH)")

    monkeypatch.setattr("gpuprov.monitoring.query.through_ssh", through_ssh)
    monitoring_tasks.idle(config(tmp_path), server="gpu01", json_=True)
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"hours": 6.0, "threshold_pct": 5.0, "prometheus": "gpu01 (through SSH)",
                                        "idle": []}
    assert contacted == ["gpu01"] and asked == ["gpu01"]
    assert captured.err == "" and not (tmp_path / "reports").exists()   # a read: no progress, no report


def test_idle_on_an_unreachable_server_is_its_error(tmp_path, capsys, monkeypatch):
    def refused(host, *args, **kwargs):
        raise GpuprovError("ssh: connection refused", host=host.name, step="connect", hint="check the host")

    monkeypatch.setattr("gpuprov.core.executor.connect", refused)
    code, err = exit_code(monitoring_tasks.idle, config(tmp_path), capsys, server="gpu01")
    assert code == 1 and "ssh: connection refused" in err
