"""What runs after deploy: the drift script's textfile, the suite's textfile, Prometheus's API through an SSH
tunnel, and the idle-GPU arithmetic. Metrics are read back with prometheus_client's parser (the outside judge)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import urllib.parse
from importlib import resources

import pytest
from helpers.local_host import LocalConn
from prometheus_client.parser import text_string_to_metric_families

from gpuprov.core.errors import GpuprovError
from gpuprov.inventory.model import Host
from gpuprov.monitoring.idle import IdleHost, find_idle, window
from gpuprov.monitoring.policy import MonitoringPolicy
from gpuprov.monitoring.query import Prometheus, through_ssh
from gpuprov.monitoring.timers import env_file
from gpuprov.smoke.textfile import validation_textfile


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_drift_script_writes_a_textfile_prometheus_reads(tmp_path):
    policy = MonitoringPolicy(host='gpu"01\\x', address="10.0.0.1", gpu_count=8, cost_per_hour=32.5, currency="EUR")
    env = tmp_path / "monitoring.env"
    env.write_text(env_file(policy).replace("/var/lib/prometheus/node-exporter", str(tmp_path)))
    script = resources.files("gpuprov.monitoring").joinpath("drift.sh").read_text()
    subprocess.run(["sh", "-c", script], env={"GPUPROV_MONITORING_ENV": str(env)}, check=True, timeout=60)
    found = samples((tmp_path / "gpuprov-drift.prom").read_text())
    host = (("host", 'gpu"01\\x'),)
    # this machine has no NVIDIA driver: no mismatch, and an empty stack
    assert found[("gpuprov_driver_library_mismatch", host)] == 0
    assert found[("gpuprov_gpus_expected", host)] == 8
    assert found[("gpuprov_cost_per_hour", (("currency", "EUR"), *host))] == 32.5
    info = [key for key in found if key[0] == "gpuprov_stack_info"]
    assert info == [("gpuprov_stack_info", (("cuda", ""), ("driver", ""), *host, ("nccl", ""), ("toolkit", "")))]
    assert found[("gpuprov_drift_timestamp_seconds", host)] > 1.7e9
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # no temporary file left


# NVRM lines as NVIDIA's kernel modules print them (the proprietary and the open module's forms)
NVRM = {"535.183.01": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n",
        "570.148.08": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.148.08  Release Build  "
                      "(dvs-builder@U16-I3-B03-4-3)  Thu May  1 04:12:55 UTC 2025\n"
                      "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"}


@pytest.mark.parametrize("version", sorted(NVRM))
def test_drift_reads_the_loaded_modules_version_from_both_nvrm_forms(tmp_path, version):
    nvrm = tmp_path / "version"
    nvrm.write_text(NVRM[version])
    env = tmp_path / "monitoring.env"
    env.write_text(env_file(MonitoringPolicy(host="gpu01", address="10.0.0.1")).replace(
        "/var/lib/prometheus/node-exporter", str(tmp_path)))
    script = resources.files("gpuprov.monitoring").joinpath("drift.sh").read_text()
    subprocess.run(["sh", "-c", script], env={"GPUPROV_MONITORING_ENV": str(env), "GPUPROV_NVRM_FILE": str(nvrm)},
                   check=True, timeout=60)
    found = samples((tmp_path / "gpuprov-drift.prom").read_text())
    (info,) = [dict(key[1]) for key in found if key[0] == "gpuprov_stack_info"]
    # no libnvidia-ml here to compare with: the module alone is no mismatch
    assert info["driver"] == version and found[("gpuprov_driver_library_mismatch", (("host", "gpu01"),))] == 0


RESULTS = [
    {"check": "host.ecc", "status": "fail", "reason": "x"},
    {"check": "train.compile", "status": "skip", "reason": "no compiler"},
    {"check": "perf.matmul", "status": "pass", "reason": "ok",
     "figures": {"per_gpu": {"0": {"bf16_tflops": 700.0}, "1": {"bf16_tflops": 650.5}}},
     "thresholds": {"threshold_pct": 80, "expected": {"bf16_tflops": 989.4}}},
    {"check": "perf.copy", "status": "skip", "reason": "cpu", "figures": {"d2d_gbs": 12.0}},
]


def test_validation_textfile_has_status_and_thresholds():
    found = samples(validation_textfile("gpu01", RESULTS, 1.5e9))
    status = {key[1]: value for key, value in found.items() if key[0] == "gpuprov_check_status"}
    assert status[(("check", "host.ecc"), ("host", "gpu01"), ("status", "fail"))] == 1
    assert status[(("check", "host.ecc"), ("host", "gpu01"), ("status", "pass"))] == 0
    assert status[(("check", "train.compile"), ("host", "gpu01"), ("status", "skip"))] == 1
    assert sum(status.values()) == len(RESULTS)          # one status per check
    # 80 % of the expected 989.4 TFLOP/s
    line = found[("gpuprov_matmul_threshold_tflops", (("dtype", "bf16"), ("gpu", "1"), ("host", "gpu01")))]
    assert line == pytest.approx(791.52)
    assert found[("gpuprov_matmul_tflops", (("dtype", "bf16"), ("gpu", "1"), ("host", "gpu01")))] == 650.5
    # no expected figure recorded: no threshold line
    assert not [k for k in found if k[0] == "gpuprov_copy_threshold_gbps"]
    assert found[("gpuprov_copy_gbps", (("direction", "d2d"), ("gpu", "all"), ("host", "gpu01")))] == 12.0


class FakePrometheus(http.server.BaseHTTPRequestHandler):
    """A Prometheus API stand-in: answers /api/v1/query from ANSWERS by the query text."""

    answers: dict[str, list] = {}
    hosts: list[str] = []     # the Host header of each request

    def do_GET(self):  # noqa: N802 - http.server's name
        self.hosts.append(self.headers.get("Host"))
        parts = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(parts.query).get("query", [""])[0]
        if query not in self.answers:
            body, code = {"status": "error", "errorType": "bad_data", "error": f"parse error in {query}"}, 400
        else:
            body = {"status": "success", "data": {"resultType": "vector", "result": self.answers[query]}}
            code = 200
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def tunnel(port: int, address: str = "192.0.2.9", variables: dict | None = None) -> LocalConn:
    """The monitoring host, whose tunnel is a plain TCP socket to the fake server (as a direct-tcpip channel)."""
    host = Host("prom01", address, vars={"monitoring_address": "10.20.0.5"} if variables is None else variables)
    return LocalConn(host, tunnel_port=port)


def test_queries_travel_through_the_ssh_tunnel_to_the_monitoring_address(fake_server):
    """Prometheus listens on the monitoring host's monitoring address only: the tunnel goes there, not to
    127.0.0.1 (nothing listens there)."""
    FakePrometheus.answers = {"up": [{"metric": {"host": "a"}, "value": [1.0, "1"]}]}
    conn = tunnel(fake_server.server_address[1])
    prom = through_ssh(conn)
    assert prom.query("up") == [{"metric": {"host": "a"}, "value": 1.0}]
    assert conn.tunnels == [("10.20.0.5", 9090)]
    assert FakePrometheus.hosts[-1] == "10.20.0.5:9090"
    with pytest.raises(GpuprovError, match=r"prom01 \(10.20.0.5:9090 through SSH\) refused .*parse error in up\)"):
        prom.query("up)")
    # no monitoring_address: the inventory address, bracketed in the Host header where it is IPv6
    conn = tunnel(fake_server.server_address[1], "fd00::9", variables={})
    through_ssh(conn).query("up")
    assert conn.tunnels == [("fd00::9", 9090)] and FakePrometheus.hosts[-1] == "[fd00::9]:9090"


def test_a_refused_tunnel_names_prometheus_and_what_to_do():
    import paramiko

    class Refused(LocalConn):
        def open_tunnel(self, port, address="127.0.0.1", timeout=None):
            raise paramiko.ChannelException(2, "Connect failed")

    with pytest.raises(GpuprovError, match=r"did not answer /api/v1/query\?query=up: the SSH tunnel to "
                                           r"10.20.0.5:9090 was refused \(Connect failed\)") as info:
        through_ssh(Refused(tunnel(1).host)).query("up")
    assert "invoke monitoring.server" in info.value.hint


def test_an_unreachable_prometheus_is_named():
    def fetch(path):
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(GpuprovError, match="Prometheus at prom:9090 did not answer /api/v1/query") as info:
        Prometheus(fetch, "prom:9090").query("up")
    assert "invoke monitoring.server" in info.value.hint


def vector(*rows) -> list[dict]:
    return [{"metric": labels, "value": [1.7e9, str(value)]} for labels, value in rows]


def test_idle_gpus_cost_their_share_of_the_host(fake_server):
    from gpuprov.monitoring.idle import idle_queries

    queries = idle_queries(6, 5)
    FakePrometheus.answers = {
        queries["idle"]: vector(({"host": "gpu01", "gpu": "3"}, 0), ({"host": "gpu01", "gpu": "1"}, 0),
                                ({"host": "gpu02", "gpu": "0"}, 2)),
        # gpu01 GPU 1 was last busy 10 h ago, GPU 3 has never been busy and was first seen 30 h ago
        queries["last_busy"]: vector(({"host": "gpu01", "gpu": "1"}, 36000), ({"host": "gpu03", "gpu": "0"}, 60)),
        queries["first_seen"]: vector(({"host": "gpu01", "gpu": "1"}, 108000), ({"host": "gpu01", "gpu": "3"}, 108000),
                                      ({"host": "gpu02", "gpu": "0"}, 7200)),
        queries["gpus"]: vector(({"host": "gpu01"}, 8), ({"host": "gpu02"}, 4), ({"host": "gpu03"}, 4)),
    }
    prom = through_ssh(tunnel(fake_server.server_address[1]))
    found = find_idle(prom, 6, 5, {"gpu01": (98.32, "USD"), "gpu02": (None, "USD")})
    assert [h.host for h in found] == ["gpu01", "gpu02"]
    one, two = found
    assert one.gpus == ("1", "3") and one.gpu_count == 8
    # the shorter idle time of the two GPUs: 10 h; 2 of 8 GPUs of a 98.32/h host: 24.58/h, 245.80 in 10 h
    assert one.idle_hours == pytest.approx(10.0)
    assert one.to_dict()["idle_cost_per_hour"] == 24.58 and one.to_dict()["idle_cost"] == 245.8
    # first seen 2 h ago, never busy: at least the window (6 h); no cost in the inventory
    assert two.idle_hours == 6 and two.idle_cost is None
    assert window(0.01) == "36s" and window(0.0001) == "1s"


def test_an_idle_host_without_gpu_count_uses_its_idle_gpus():
    assert IdleHost("h", ("0",), 0, 7.0, 10.0, "USD").idle_cost is None


@pytest.mark.tool
@pytest.mark.lab
def test_promtool_parses_the_idle_queries(tmp_path):
    """promtool (Debian's prometheus package) judges the PromQL monitoring.idle sends."""
    import shutil

    import yaml

    from gpuprov.monitoring.idle import idle_queries
    from gpuprov.monitoring.promtool import promtool_path

    if not shutil.which("promtool") and os.geteuid() != 0:
        pytest.skip("promtool is not on PATH and installing Debian's prometheus package needs root")
    queries = idle_queries(0.5, 7.5)
    path = tmp_path / "idle.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "idle", "rules": [
        {"record": f"gpuprov_idle:{name}", "expr": expr} for name, expr in queries.items()]}]}))
    done = subprocess.run([promtool_path(install=True), "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and f"SUCCESS: {len(queries)} rules found" in done.stdout, done.stdout + done.stderr
