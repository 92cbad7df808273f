"""monitoring.deploy's plan: what a bare Debian host needs, what a host already in state needs (nothing), the
dcgm-exporter's mode, and the files and units judged by outside tools (systemd-analyze, the shell)."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.monitoring import deploy, exporters, timers
from gpuprov.monitoring.policy import MonitoringPolicy
from gpuprov.ops.base import OpContext

POLICY = MonitoringPolicy(host="gpu01", address="10.20.0.11", cost_per_hour=98.32, currency="EUR")


def facts(packages=None, services=None, files=None, containers=None) -> dict:
    return {"os": {"family": "debian", "key": "debian-12"}, "packages": packages or {}, "held": [],
            "services": services or {}, "files": files or {}, "containers": containers or []}


def ctx(**kwargs) -> OpContext:
    return OpContext("gpu01", facts(**kwargs), stack={}, repo=None)


def components(changes) -> list[tuple[str, str]]:
    return [(c.component, c.summary) for c in changes]


def in_state(changes, packages: dict, extra_services: tuple[str, ...] = ()) -> OpContext:
    """The facts of a host on which `changes` were applied: their files written, packages and units up."""
    files = {}
    for change in changes:
        for command in change.commands:
            words = shlex.split(command)
            if words[:1] == ["mkdir"] and "printf" in words and words[-3:-1] == ["-f", words[-3 + 1]] or \
                    words[:1] == ["mkdir"] and "printf" in words:   # gpuprov.ops.base.write_file
                files[words[-1]] = words[words.index("%s") + 1]
    units = ("prometheus-node-exporter", "gpuprov-drift.timer", "gpuprov-validate-idle.timer", *extra_services)
    return ctx(packages=packages, files=files,
               services={u: {"exists": True, "enabled": True, "active": True} for u in units})


def test_a_bare_host_gets_node_exporter_and_the_timers():
    bare = ctx(services={"docker": {"active": False}})
    changes = deploy.plan_changes(bare, POLICY)
    found = components(changes)
    assert found[0] == ("node-exporter", "install prometheus-node-exporter (the distribution's package)")
    assert ("node-exporter", "create /etc/default/prometheus-node-exporter (listen on 10.20.0.11:9100)") in found
    assert ("node-exporter", "enable and start prometheus-node-exporter") in found
    assert not [c for c in found if c[0] == "dcgm-exporter"]          # no DCGM installed: auto is none
    assert found[-1][0] == "timers" and "write the drift metrics now" in found[-1][1]
    defaults = bare_file(changes, "/etc/default/prometheus-node-exporter")
    assert 'ARGS="--web.listen-address=10.20.0.11:9100 --collector.textfile.directory=' \
           '/var/lib/prometheus/node-exporter"' in defaults
    # the second run changes nothing
    again = in_state(changes, {"prometheus-node-exporter": "1.5.0-1+b6"})
    assert deploy.plan_changes(again, POLICY) == []


def bare_file(changes, path: str) -> str:
    return in_state(changes, {}).file(path)


def test_dcgm_exporter_as_nvidias_service_where_docker_does_not_run():
    host = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.4.1-1"})
    assert exporters.dcgm_mode(host, POLICY) == "service"
    changes = list(exporters.dcgm_exporter(host, POLICY))
    assert [c.summary for c in changes][:1] == ["create /etc/dcgm-exporter/gpuprov-counters.csv (the DCGM fields "
                                                "gpuprov's rules and dashboard read)"]
    install = changes[1]
    # NVIDIA's package at the exporter paired with DCGM 4.4.1 (gpuprov/data/dcgm_exporter.yaml: 4.4.1-4.6.0)
    assert "datacenter-gpu-manager-exporter=4.6.0-1" in " ".join(install.commands)
    dropin = changes[2]
    assert dropin.summary.startswith("create /etc/systemd/system/nvidia-dcgm-exporter.service.d/gpuprov.conf")
    assert "ExecStart=\nExecStart=/usr/bin/dcgm-exporter -a 10.20.0.11:9400 -f /etc/dcgm-exporter/gpuprov-counters" \
           ".csv\n" in dropin.diff.replace("+", "")
    assert changes[-1].commands == ("systemctl enable --now nvidia-dcgm-exporter",)


def test_dcgm_exporter_as_a_container_where_docker_runs():
    host = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.2.3-1"}, services={"docker": {"active": True}})
    assert exporters.dcgm_mode(host, POLICY) == "container"
    run = list(exporters.dcgm_exporter(host, POLICY))[-1]
    assert run.commands[0] == "docker pull nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
    docker_run = shlex.split(run.commands[2])
    assert docker_run[:2] == ["docker", "run"]
    for flag, value in (("--gpus", "all"), ("--network", "host"), ("--name", "gpuprov-dcgm-exporter"),
                        ("--restart", "unless-stopped"), ("-a", "10.20.0.11:9400")):
        assert docker_run[docker_run.index(flag) + 1] == value
    # running with the same arguments: nothing to do
    line = " ".join(shlex.quote(w) for w in exporters.docker_run_args(
        POLICY, "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04")) + "\n"
    running = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.2.3-1"}, services={"docker": {"active": True}},
                  containers=[{"name": "gpuprov-dcgm-exporter", "image": "x"}],
                  files={exporters.CONTAINER_ARGS: line, exporters.COUNTERS: exporters.counters()})
    assert list(exporters.dcgm_exporter(running, POLICY)) == []


def test_an_unknown_dcgm_release_is_named():
    host = ctx(packages={"datacenter-gpu-manager-4-core": "1:3.3.9-1"})
    with pytest.raises(GpuprovError, match=r"no dcgm-exporter paired with DCGM 3\.3\.9 \(it knows DCGM 4\.2\.3, "
                                           r"4\.4\.1"):
        list(exporters.dcgm_exporter(host, POLICY))


def test_a_forced_exporter_without_dcgm_says_to_provision():
    with pytest.raises(GpuprovError, match="needs DCGM, which is not installed") as info:
        list(exporters.dcgm_exporter(ctx(), MonitoringPolicy(host="gpu01", address="10.0.0.1",
                                                             dcgm_exporter="service")))
    assert "invoke provision" in info.value.hint


def test_rhel_is_refused_with_what_to_do():
    host = type("H", (), {"name": "r1", "vars": {}})()
    with pytest.raises(GpuprovError, match="supports Debian and Ubuntu hosts, not rhel"):
        deploy.context(host, {"os": {"family": "rhel"}})


def test_the_validate_timer_goes_when_its_schedule_is_never():
    never = MonitoringPolicy(host="gpu01", address="10.0.0.1", validate_schedule="never")
    host = ctx(services={"gpuprov-validate-idle.timer": {"exists": True, "enabled": True, "active": True}})
    changes = list(timers.changes(host, never))
    # disabled first, while its unit file is still there; then the files go
    assert changes[0].commands == ("systemctl disable --now gpuprov-validate-idle.timer",)
    assert timers.unit_files(never)["/etc/systemd/system/gpuprov-validate-idle.timer"] is None


def test_env_file_is_sourced_by_the_shell_as_written(tmp_path):
    """The scripts source the env file: a value with shell characters stays one literal value."""
    policy = MonitoringPolicy(host="gpu$(touch x)'01", address="10.0.0.1", cost_per_hour=1.25, currency="USD")
    env = tmp_path / "monitoring.env"
    env.write_text(timers.env_file(policy))
    out = subprocess.run(["sh", "-c", f'. {shlex.quote(str(env))}; printf "%s|%s|%s" "$GPUPROV_HOST" '
                                      '"$GPUPROV_COST_PER_HOUR" "$GPUPROV_TEXTFILE_DIR"'],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out == "gpu$(touch x)'01|1.25|/var/lib/prometheus/node-exporter"
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_pass_systemd_analyze_verify(tmp_path):
    for path, content in timers.unit_files(POLICY).items():
        (tmp_path / path.rsplit("/", 1)[1]).write_text(content)
    units = sorted(str(p) for p in tmp_path.iterdir())
    result = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True,
                            env={"SYSTEMD_LOG_LEVEL": "warning", "PATH": "/usr/bin:/bin"})
    # the scripts live on the host, not here: the only complaint allowed is their absence
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "/usr/local/lib/gpuprov/" not in line]
    assert not problems, problems


def test_switching_modes_retires_the_other_exporter():
    """Both exporters would want the monitoring address's port 9400: the one of the other mode goes first."""
    was_service = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.4.1-1"},
                      services={"docker": {"active": True},
                                "nvidia-dcgm-exporter": {"exists": True, "enabled": True, "active": True}})
    first = list(exporters.dcgm_exporter(was_service, POLICY))[0]
    assert first.commands == ("systemctl disable --now nvidia-dcgm-exporter",)
    was_container = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.4.1-1"},
                        containers=[{"name": "gpuprov-dcgm-exporter", "image": "x"}])
    first = list(exporters.dcgm_exporter(was_container, POLICY))[0]
    assert first.commands[0] == "docker rm --force gpuprov-dcgm-exporter"
    none = MonitoringPolicy(host="gpu01", address="10.0.0.1", dcgm_exporter="none")
    assert [c.summary for c in exporters.dcgm_exporter(was_container, none)] == [
        "remove the gpuprov-dcgm-exporter container (dcgm-exporter: none)"]


class AnsweringConn:
    """A connection whose one command prints `stdout` (what the address check finds on the host)."""

    def __init__(self, stdout: str):
        self.stdout = stdout

    def run(self, command, *, sudo=False, timeout=None, stdin=None):
        return type("R", (), {"stdout": self.stdout, "stderr": "", "rc": 0})()


@pytest.mark.parametrize("found, message", [
    ("", "the monitoring address 10.20.0.11: it is not an address of this host"),
    ("127.0.1.1\n", "the monitoring address 10.20.0.11: it is only loopback (127.0.1.1)"),
])
def test_a_monitoring_address_the_host_cannot_listen_on_is_refused_before_anything_changes(found, message):
    with pytest.raises(GpuprovError) as info:
        deploy.check_address(AnsweringConn(found), POLICY)
    assert info.value.message.startswith(message) and info.value.host == "gpu01"
    assert "set monitoring_address" in info.value.hint
    deploy.check_address(AnsweringConn("10.20.0.11\n"), POLICY)   # its own address: fine


@pytest.mark.skipif(shutil.which("ip") is None or shutil.which("getent") is None, reason="needs ip and getent")
def test_the_address_check_runs_in_sh_and_finds_loopback_here():
    out = subprocess.run(["sh", "-c", deploy.address_check_command("127.0.0.1")], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and out.stdout.split() == ["127.0.0.1"]
