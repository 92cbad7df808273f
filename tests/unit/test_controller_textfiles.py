"""The controller's Prometheus textfiles (validate's per-host file, the rollout state) written through
prometheus_client: read back with prometheus_client's own text parser and checked by `promtool check metrics`
(the outside judges), against the figures given and the host-side standard-library writer's output."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuprov.core import secrets
from gpuprov.rollout.journal import STATES
from gpuprov.rollout.status import metric_text
from gpuprov.smoke.textfile import validation_textfile
from gpuprov.validation.report import prometheus_textfile, write_prometheus_textfile

HOST = {"host": "gpu01", "results": [
    {"check": "host.ecc", "status": "fail", "reason": "2 uncorrectable"},
    {"check": "host.fabric", "status": "skip", "reason": "no NVSwitch"},
    {"check": "perf.matmul", "status": "pass",
     "figures": {"bf16_tflops": 700.5, "per_gpu": {"0": {"bf16_tflops": 712.0}, "1": {"bf16_tflops": 700.5}}},
     "thresholds": {"expected": {"bf16_tflops": 989.0}, "threshold_pct": 60}},
    {"check": "perf.copy", "status": "warn", "figures": {"h2d_gbs": 55.6, "d2d_gbs": 2600.0}},
    {"check": "perf.allreduce", "status": "pass", "figures": {"busbw_gbs": 451.3}},
]}


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed")
    return found


def test_the_written_file_parses_with_the_figures_given(tmp_path):
    path = write_prometheus_textfile(tmp_path / "textfile" / "gpu01.prom", HOST, 1788256845.0)
    assert path == tmp_path / "textfile" / "gpu01.prom"
    found = samples(path.read_text())
    assert found[("gpuprov_check_ok", (("check", "host.ecc"), ("host", "gpu01")))] == 0
    assert found[("gpuprov_check_ok", (("check", "perf.matmul"), ("host", "gpu01")))] == 1
    assert found[("gpuprov_check_status", (("check", "host.fabric"), ("host", "gpu01"), ("status", "skip")))] == 1
    assert found[("gpuprov_check_status", (("check", "host.fabric"), ("host", "gpu01"), ("status", "pass")))] == 0
    assert found[("gpuprov_matmul_tflops", (("dtype", "bf16"), ("gpu", "1"), ("host", "gpu01")))] == 700.5
    assert found[("gpuprov_matmul_threshold_tflops", (("dtype", "bf16"), ("gpu", "0"), ("host", "gpu01")))] \
        == pytest.approx(989.0 * 0.6)
    assert found[("gpuprov_copy_gbps", (("direction", "h2d"), ("gpu", "all"), ("host", "gpu01")))] == 55.6
    assert found[("gpuprov_allreduce_busbw_gbps", (("host", "gpu01"),))] == 451.3
    assert found[("gpuprov_validate_timestamp_seconds", (("host", "gpu01"),))] == 1788256845.0
    assert not any(name == "gpuprov_copy_threshold_gbps" for name, _ in found)   # no threshold recorded


def test_same_metrics_as_the_host_side_writer():
    for host in (HOST, {"host": "gpu02", "error": {"error": "unreachable"}, "results": []}):
        controller = samples(prometheus_textfile(host, 1.5))
        assert controller == samples(validation_textfile(host["host"], host.get("results") or [], 1.5,
                                                         failed_run=bool(host.get("error"))))
    assert controller[("gpuprov_check_ok", (("check", "validation"), ("host", "gpu02")))] == 0


def test_the_file_is_replaced_whole_and_nothing_else_is_left(tmp_path):
    path = tmp_path / "gpu01.prom"
    path.write_text("stale_metric 1\n")
    write_prometheus_textfile(path, HOST, 2.0)
    assert [p.name for p in tmp_path.iterdir()] == ["gpu01.prom"]
    assert "stale_metric" not in path.read_text() and path.read_text().endswith("\n")


def test_a_registered_secret_in_a_label_is_masked(tmp_path):
    secrets.register("pw-in-a-check-name")
    host = {"host": "gpu01", "results": [{"check": "x-pw-in-a-check-name", "status": "pass"}]}
    text = write_prometheus_textfile(tmp_path / "gpu01.prom", host, 1.0).read_text()
    assert "pw-in-a-check-name" not in text
    assert samples(text)[("gpuprov_check_ok", (("check", "x-***"), ("host", "gpu01")))] == 1


@pytest.mark.tool
def test_promtool_accepts_the_written_file(tmp_path):
    path = write_prometheus_textfile(tmp_path / "gpu01.prom", HOST, 1788256845.0)
    checked = subprocess.run([promtool(), "check", "metrics"], stdin=path.open(), capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rollout_metric_has_one_state_at_1():
    found = samples(metric_text('a1b2c3d4-1"x\\', "draining", 1764748800.4))
    run = 'a1b2c3d4-1"x\\'
    assert {state: found[("gpuprov_rollout_state", (("run", run), ("state", state)))] for state in STATES} \
        == {state: float(state == "draining") for state in STATES}
    assert found[("gpuprov_rollout_state_since_seconds", (("run", run),))] == 1764748800.0


@pytest.mark.tool
def test_promtool_accepts_the_rollout_metric():
    checked = subprocess.run([promtool(), "check", "metrics"], input=metric_text("r-1", "resumed", 1.0),
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_validate_metrics_the_alert_rules_use_are_written():
    rules = (Path(__file__).parents[2] / "gpuprov/monitoring/prometheus/gpuprov.rules.yml").read_text()
    written = {name for name, _ in samples(prometheus_textfile(HOST, 1.0))}
    assert {"gpuprov_check_status", "gpuprov_validate_timestamp_seconds"} <= written
    assert all(name in rules for name in ("gpuprov_check_status", "gpuprov_validate_timestamp_seconds"))
