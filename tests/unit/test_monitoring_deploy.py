"""monitoring's host jobs on the fleet runtime, one host at a time: DeployJob (the monitoring address checked before
the facts, the plan, the batched apply, the exporters read after it; an exporter that does not serve is failing)
and ServerJob (monitoring.server: the address checked, Prometheus planned; monitoring.targets --server: the targets
only). The host is a MonitoredHost: a connection answering what the jobs send, recording what it was sent."""

from __future__ import annotations

import copy

import pytest
from helpers.monitoring import BARE_DEBIAN, MonitoredHost, answer_facts

from gpuprov.core.errors import GpuprovError
from gpuprov.inventory.model import Host
from gpuprov.monitoring.deploy import DeployJob, ServerJob

GPU01 = Host("gpu01", "192.0.2.11", vars={"monitoring_address": "10.20.0.11", "hardware": {"count": 8}})
PROM = Host("prom01", "192.0.2.5", vars={"monitoring_address": "10.20.0.5"})
TARGETS = {"gpuprov-node": [{"targets": ["10.20.0.11:9100"], "labels": {"host": "gpu01"}}], "gpuprov-dcgm": []}
WITH_DCGM = {**copy.deepcopy(BARE_DEBIAN), "packages": {"datacenter-gpu-manager-4-core": "1:4.4.1-1"}}
NODE_EXPORTER = "install prometheus-node-exporter (the distribution's package)"
NODE_DEFAULTS = "create /etc/default/prometheus-node-exporter (listen on 10.20.0.11:9100)"
PROMETHEUS = "install prometheus (the distribution's package, port 9090)"
TARGET_WRITES = ["write /etc/prometheus/gpuprov/targets/node.json (1 gpuprov-node targets)",
                 "write /etc/prometheus/gpuprov/targets/dcgm.json (0 gpuprov-dcgm targets)"]


@pytest.fixture(autouse=True)
def gathered(monkeypatch):
    answer_facts(monkeypatch)


def run(job, conn) -> tuple[object, list[str]]:
    said: list[str] = []
    return job.run_host(conn, said.append), said


def failure(job, conn) -> GpuprovError:
    with pytest.raises(GpuprovError) as caught:
        job.run_host(conn, lambda what: None)
    return caught.value


def summaries(record) -> list[str]:
    return [change["summary"] for change in record.plan]


def test_a_deploy_dry_run_plans_and_changes_nothing():
    conn = MonitoredHost(GPU01)
    record, said = run(DeployJob(dry_run=True), conn)
    assert (record.status, record.address, record.dcgm_exporter, record.endpoints) == (
        "planned", "10.20.0.11", "none", {})
    assert NODE_EXPORTER in summaries(record) and NODE_DEFAULTS in summaries(record)
    # the address first (nothing is asked of a host that could not serve there); no apply, no probe
    assert conn.sent == ["address", "facts", "textfile"] and said == ["facts"]
    assert record.steps == []


def test_a_deploy_applies_in_one_batch_then_reads_the_exporters():
    conn = MonitoredHost(GPU01)
    job = DeployJob()
    record, said = run(job, conn)
    assert conn.sent == ["address", "facts", "textfile", "apply", "probe"]
    assert said == ["facts", f"apply {len(record.plan)} changes", "read the exporters"]
    assert record.status == "changed" and record.endpoints == {"node-exporter": "serving"}
    assert [step.summary for step in record.steps] == summaries(record)
    assert {step.status for step in record.steps} == {"done"}
    entry = record.to_dict()
    assert (entry["address"], entry["dcgm_exporter"], entry["endpoints"]) == (
        "10.20.0.11", "none", {"node-exporter": "serving"})
    assert not job.failing(entry)


@pytest.mark.parametrize(("facts", "metrics", "endpoints"), [
    (BARE_DEBIAN, {"node-exporter": 0}, {"node-exporter": "no node_* metrics at http://10.20.0.11:9100/metrics"}),
    (WITH_DCGM, {"node-exporter": 40, "dcgm-exporter": 0},
     {"node-exporter": "serving", "dcgm-exporter": "no DCGM_FI_* metrics at http://10.20.0.11:9400/metrics"}),
    (WITH_DCGM, {"node-exporter": 40, "dcgm-exporter": 9},
     {"node-exporter": "serving", "dcgm-exporter": "serving"}),
])
def test_an_exporter_that_does_not_serve_is_failing(facts, metrics, endpoints):
    job = DeployJob()
    record, _ = run(job, MonitoredHost(GPU01, facts=facts, metrics=metrics))
    assert record.endpoints == endpoints
    assert job.failing(record.to_dict()) is (set(endpoints.values()) != {"serving"})
    assert record.dcgm_exporter == ("service" if "dcgm-exporter" in endpoints else "none")


def test_a_failed_apply_keeps_the_plan_and_the_steps_so_far():
    conn = MonitoredHost(GPU01, fail_step=1)
    error = failure(DeployJob(), conn)
    record = error.run
    assert record.status == "failed" and record.address == "10.20.0.11" and record.dcgm_exporter == "none"
    assert [(step.summary, step.status) for step in record.steps] == [(summaries(record)[0], "done"),
                                                                      (summaries(record)[1], "failed")]
    assert len(record.plan) > 2 and record.endpoints == {}
    assert "rerun monitoring.deploy" in error.hint and error.host == "gpu01"
    assert conn.sent == ["address", "facts", "textfile", "apply"]


@pytest.mark.parametrize("own", [(), ("127.0.1.1",)])
def test_a_monitoring_address_that_is_not_the_hosts_own_stops_before_the_facts(own):
    conn = MonitoredHost(GPU01, own=own)
    error = failure(DeployJob(), conn)
    assert error.message.startswith("the monitoring address 10.20.0.11: it is ")
    assert error.run.status == "failed" and error.run.plan == [] and conn.sent == ["address"]


def test_a_server_dry_run_plans_prometheus_and_changes_nothing():
    conn = MonitoredHost(PROM)
    job = ServerJob(TARGETS, prometheus=True, dry_run=True)
    record, said = run(job, conn)
    assert job.kind == "monitoring-server"
    assert record.status == "planned" and record.address == "192.0.2.5"
    assert summaries(record) == [PROMETHEUS, *TARGET_WRITES,
                                 "create /etc/prometheus/gpuprov/gpuprov.rules.yml (gpuprov's alert rules)",
                                 "create /etc/prometheus/prometheus.yml (scrape the inventory's exporters, evaluate "
                                 "gpuprov's rules)",
                                 "create /etc/default/prometheus (listen on 10.20.0.5:9090 only)",
                                 "enable and (re)start prometheus"]
    assert conn.sent == ["address", "facts"] and said == ["facts"] and record.steps == []


def test_the_targets_job_writes_the_targets_only_and_asks_no_address():
    conn = MonitoredHost(PROM)
    job = ServerJob(TARGETS, prometheus=False)
    record, _ = run(job, conn)
    assert job.kind == "monitoring-targets"
    assert record.status == "changed" and summaries(record) == TARGET_WRITES
    assert conn.sent == ["facts", "apply"] and record.endpoints == {}
    assert "/etc/prometheus/gpuprov/targets/node.json" in conn.batches[0]


def test_prometheus_on_an_address_that_is_not_the_hosts_own_is_refused_before_anything_changes():
    conn = MonitoredHost(PROM, own=("127.0.1.1",))
    error = failure(ServerJob(TARGETS, prometheus=True), conn)
    assert error.message.startswith("the monitoring address 10.20.0.5: it is only loopback (127.0.1.1)")
    assert error.run.status == "failed" and conn.sent == ["address"]


@pytest.mark.parametrize(("prometheus", "task"), [(True, "rerun monitoring.server"),
                                                  (False, "rerun monitoring.targets --server")])
def test_a_failed_server_apply_names_the_task_to_rerun(prometheus, task):
    error = failure(ServerJob(TARGETS, prometheus=prometheus), MonitoredHost(PROM, fail_step=0))
    assert task in error.hint and error.run.status == "failed"
    assert [step.status for step in error.run.steps] == ["failed"]


def test_the_row_shows_each_exporter_and_the_dcgm_mode_or_the_error():
    job = DeployJob()
    assert job.row({"host": "gpu01", "status": "changed", "plan": [{}, {}], "dcgm_exporter": "service",
                    "endpoints": {"node-exporter": "serving", "dcgm-exporter": "no DCGM_FI_* metrics at x"}}) == {
        "host": "gpu01", "status": "changed", "changes": "2",
        "exporters": "node-exporter serving, dcgm-exporter no DCGM_FI_* metrics at x",
        "detail": "dcgm-exporter: service"}
    assert job.row({"host": "gpu02", "status": "failed", "plan": None, "endpoints": {},
                    "error": {"error": "apt failed\nmore"}}) == {
        "host": "gpu02", "status": "failed", "changes": "0", "exporters": "-", "detail": "apt failed"}
