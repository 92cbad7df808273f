"""The Prometheus host's plan and configuration: Prometheus listens on the monitoring address only, and a host's
exporters cannot speak for another host (no honor_labels; the target's labels win). Judged by promtool and by a
real Prometheus (Debian's prometheus package, installed by the test as root when missing) scraping a stand-in
exporter on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import http.server
import os
import shlex
import shutil
import socket
import subprocess
import threading

import pytest
import yaml

from gpuprov.core.operations import OpContext
from gpuprov.monitoring import server
from gpuprov.monitoring.policy import MonitoringPolicy
from gpuprov.monitoring.promtool import promtool_path
from gpuprov.monitoring.query import at_url
from gpuprov.monitoring.targets import file_sd_text, prometheus_config, scrape_configs

POLICY = MonitoringPolicy(host="prom01", address="10.20.0.5", scrape_interval_s=15)
JOBS = {"gpuprov-node": [{"targets": ["10.20.0.11:9100"], "labels": {"host": "gpu01"}}], "gpuprov-dcgm": []}


def ctx(files=None, installed=True, running=True) -> OpContext:
    facts = {"os": {"family": "debian", "key": "debian-12"}, "held": [], "files": files or {},
             "packages": {"prometheus": "2.42.0+ds-5+deb12u1"} if installed else {},
             "services": {"prometheus": {"exists": True, "enabled": running, "active": running}}}
    return OpContext("prom01", facts, stack={}, repo=None)


def sourced_args(text: str) -> str:
    """ARGS as the package's unit gets it: the defaults file read by the shell (systemd's EnvironmentFile reads the
    same double-quoted assignment)."""
    return subprocess.run(["sh", "-c", '. "$1"; printf %s "$ARGS"', "sh", "/dev/stdin"], input=text,
                          capture_output=True, text=True, check=True).stdout


def test_prometheus_listens_on_the_monitoring_address_only():
    assert sourced_args(server.defaults_text(POLICY)) == "--web.listen-address=10.20.0.5:9090"
    six = dataclasses.replace(POLICY, address="fd00::5")
    assert sourced_args(server.defaults_text(six)) == "--web.listen-address=[fd00::5]:9090"
    config = yaml.safe_load(server.config_text(POLICY))
    # Prometheus scrapes itself where it listens (localhost would find nothing)
    assert config["scrape_configs"][0] == {"job_name": "prometheus",
                                           "static_configs": [{"targets": ["10.20.0.5:9090"]}]}


def test_a_bare_monitoring_host_then_one_in_state_then_a_new_address():
    changes = list(server.server_changes(ctx(installed=False, running=False), JOBS, POLICY))
    summaries = [c.summary for c in changes]
    assert summaries[0] == "install prometheus (the distribution's package, port 9090)"
    assert "create /etc/default/prometheus (listen on 10.20.0.5:9090 only)" in summaries
    assert changes[-1].commands == ("systemctl enable prometheus", "systemctl restart prometheus")
    files = {server.CONFIG: server.config_text(POLICY), server.RULES: server.rules_text(),
             server.DEFAULTS: server.defaults_text(POLICY),
             **{path: file_sd_text(JOBS[job]) for job, path in server.target_paths().items()}}
    assert list(server.server_changes(ctx(files), JOBS, POLICY)) == []
    # a new monitoring address: the listen address changes, which needs a restart (a reload keeps the old one)
    moved = dataclasses.replace(POLICY, address="10.20.0.6")
    changes = list(server.server_changes(ctx(files), JOBS, moved))
    assert [c.summary for c in changes][-2:] == ["update /etc/default/prometheus (listen on 10.20.0.6:9090 only)",
                                                 "enable and (re)start prometheus"]
    assert not [c for c in changes if "reload" in " ".join(c.commands)]


def test_no_scrape_job_honours_the_labels_a_host_serves():
    for job in scrape_configs():
        assert "honor_labels" not in job and "honor_timestamps" not in job
    assert "honor_labels" not in server.config_text(POLICY)


@pytest.fixture(scope="module")
def promtool() -> str:
    if not shutil.which("promtool") and os.geteuid() != 0:
        pytest.skip("promtool is not on PATH and installing Debian's prometheus package needs root")
    return promtool_path(install=True)


def server_folder(folder, listen: str, scrape_interval_s: int, node_targets: list[dict]):
    """The monitoring host's files under `folder` as monitoring.server lays them out; the configuration's path."""
    (folder / "targets").mkdir(parents=True)
    (folder / "gpuprov.rules.yml").write_text(server.rules_text())
    (folder / "targets" / "node.json").write_text(file_sd_text(node_targets))
    (folder / "targets" / "dcgm.json").write_text(file_sd_text([]))
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(scrape_interval_s, listen, str(folder)), sort_keys=False))
    return config


@pytest.mark.tool
@pytest.mark.lab
def test_promtool_accepts_the_configuration(promtool, tmp_path):
    config = server_folder(tmp_path, POLICY.prometheus_listen, 15, JOBS["gpuprov-node"])
    done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "15 rules found" in done.stdout


# What a host's node_exporter serves: its own textfile series (host = its own name), a series that claims to be
# another host's, and drift's stack info (the installed stack, where the target's labels are the inventory's).
SERVED = """\
gpuprov_validate_timestamp_seconds{host="gpu01"} 1.7e+09
gpuprov_check_ok{host="other",groups=",admin,"} 0
gpuprov_stack_info{cuda="12.8",driver="570.148.08",host="gpu01",nccl="2.26.5",toolkit="1.17.8"} 1
node_load1 0.5
"""


class Exporter(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = SERVED.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.tool
@pytest.mark.lab
def test_a_real_prometheus_listens_where_told_and_stores_every_series_under_its_targets_host(promtool, tmp_path):
    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    # the defaults file's ARGS for a monitoring address of 127.0.0.1 (the only address this test may use), on a free
    # port instead of 9090, which something else here may hold
    port = free_port()
    args = shlex.split(sourced_args(server.defaults_text(dataclasses.replace(POLICY, address="127.0.0.1"))))
    assert args == ["--web.listen-address=127.0.0.1:9090"]
    listen = f"127.0.0.1:{port}"
    labels = {"host": "gpu01", "groups": ",hgx,", "driver": "570", "cuda": "12.8", "nccl": "2.26"}
    config = server_folder(tmp_path / "etc", listen, 1, [
        {"targets": [f"127.0.0.1:{exporter.server_address[1]}"], "labels": labels}])
    binary = shutil.which("prometheus") or pytest.fail("Debian's prometheus package has no prometheus on PATH")
    process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                args[0].replace(":9090", f":{port}")],
                               stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        prom = at_url(f"http://{listen}", timeout=5)

        def scraped() -> bool:
            try:
                ups = {row["metric"]["job"]: row["value"] for row in prom.query("up")}
            except Exception:   # not listening yet
                return False
            return ups == {"prometheus": 1.0, "gpuprov-node": 1.0}

        prom.wait_for("both jobs scraped", scraped, timeout=90)
        listening = subprocess.run(["ss", "-Htln"], capture_output=True, text=True, check=True).stdout
        local = {line.split()[3] for line in listening.splitlines() if line.split()[3].endswith(f":{port}")}
        assert local == {listen}, listening          # not 0.0.0.0, *, [::]
        series = {row["metric"]["__name__"]: row["metric"] for row in prom.query('{job="gpuprov-node"}')
                  if row["metric"]["__name__"].startswith(("gpuprov_", "node_load1"))}
        assert set(series) == {"gpuprov_validate_timestamp_seconds", "gpuprov_check_ok", "gpuprov_stack_info",
                               "node_load1"}
        # every series is the target's host's, with the target's labels; what the host claimed is gone
        for name, metric in series.items():
            assert metric["host"] == "gpu01" and metric["groups"] == ",hgx,", (name, metric)
            assert not [key for key in metric if key.startswith("exported_")], (name, metric)
        assert prom.query('{host="other"}') == [] and prom.query('{groups=",admin,"}') == []
        # drift's stack info keeps the host's own report; every other series has the inventory's driver
        assert {k: series["gpuprov_stack_info"][k] for k in ("driver", "cuda", "nccl", "toolkit")} == {
            "driver": "570.148.08", "cuda": "12.8", "nccl": "2.26.5", "toolkit": "1.17.8"}
        assert series["node_load1"]["driver"] == "570"
    finally:
        process.terminate()
        process.wait(timeout=60)
        exporter.shutdown()


def run_steps(change, promtool: str) -> subprocess.CompletedProcess:
    """A change's commands as the apply batch runs a step (`set -e`), with this promtool first on PATH."""
    path = f"{os.path.dirname(promtool)}:{os.environ['PATH']}"
    return subprocess.run(["sh", "-ec", "\n".join(change.commands)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": path})


@pytest.mark.tool
def test_promtool_judges_a_file_before_it_replaces_the_old_one(promtool, tmp_path):
    rules, config = tmp_path / "gpuprov.rules.yml", tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    accepted = server.checked_file(ctx(), str(rules), server.rules_text(), "promtool check rules %s", "rules")
    done = run_steps(accepted, promtool)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rules.read_text() == server.rules_text()
    broken = "global:\n  scrape_interval: soon\n"
    rejected = server.checked_file(ctx({str(config): config.read_text()}), str(config), broken,
                                   "promtool check config %s", "configuration")
    done = run_steps(rejected, promtool)
    assert done.returncode != 0 and f"promtool check config rejected {config}" in done.stderr
    assert config.read_text() == "global:\n  scrape_interval: 15s\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gpuprov.rules.yml", "prometheus.yml"]
