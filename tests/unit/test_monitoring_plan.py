"""monitoring.deploy's plan: what a bare Debian host needs, what a host already in state needs (nothing), the
dcgm-exporter's mode, and the files and units judged by outside tools (systemd-analyze, the shell)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import stat
import subprocess
from importlib import resources

import pytest
import yaml
from helpers.local_host import LocalConn

from gpuprov.core.errors import GpuprovError
from gpuprov.core.operations import OpContext
from gpuprov.monitoring import dcgm_data, deploy, exporters, timers
from gpuprov.monitoring.policy import MonitoringPolicy

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
                    words[:1] == ["mkdir"] and "printf" in words:   # gpuprov.core.operations.write_file
                files[words[-1]] = words[words.index("%s") + 1]
    units = ("prometheus-node-exporter", "gpuprov-drift.timer", "gpuprov-validate-idle.timer", *extra_services)
    done = ctx(packages=packages, files=files,
               services={u: {"exists": True, "enabled": True, "active": True} for u in units})
    # as stat and dpkg-statoverride describe root:root 0755 folders (see test_the_textfile_folder_commands_...)
    done.facts["textfile_dir"] = {"folder": "directory root:root 755", "package_dir": "directory root:root 755",
                                  "override": "root root 755 /var/lib/prometheus"}
    return done


def test_a_bare_host_gets_node_exporter_and_the_timers():
    bare = ctx(services={"docker": {"active": False}})
    changes = deploy.plan_changes(bare, POLICY)
    found = components(changes)
    # /var/lib/prometheus stays root's: the statoverride comes before the package, whose postinst reads it
    assert found[0] == ("node-exporter", "keep /var/lib/prometheus root:root 0755 (a dpkg-statoverride: Debian's "
                                         "prometheus-node-exporter would give it to the prometheus user)")
    assert found[1] == ("node-exporter", "install prometheus-node-exporter (the distribution's package)")
    assert found[2] == ("node-exporter", "create /var/lib/prometheus/node-exporter root:root 0755 (only root writes "
                                         "this host's metrics)")
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


DIGEST = "sha256:" + "ab" * 32
PINNED = dataclasses.replace(POLICY, dcgm_exporter_digests={"4.2.3-4.1.3-ubuntu22.04": DIGEST})


def test_dcgm_exporter_as_a_container_where_docker_runs_by_its_pinned_digest_without_capabilities():
    host = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.2.3-1"}, services={"docker": {"active": True}})
    assert exporters.dcgm_mode(host, PINNED) == "container"
    run = list(exporters.dcgm_exporter(host, PINNED))[-1]
    assert run.commands[0] == f"docker pull nvcr.io/nvidia/k8s/dcgm-exporter@{DIGEST}"
    docker_run = shlex.split(run.commands[2])
    assert docker_run[:2] == ["docker", "run"]
    for flag, value in (("--gpus", "all"), ("--network", "host"), ("--name", "gpuprov-dcgm-exporter"),
                        ("--restart", "unless-stopped"), ("-a", "10.20.0.11:9400"), ("--cap-drop", "ALL"),
                        ("--security-opt", "no-new-privileges"), ("--env", "NO_SETCAP=1")):
        assert docker_run[docker_run.index(flag) + 1] == value
    assert "--cap-add" not in docker_run and "--privileged" not in docker_run
    assert f"nvcr.io/nvidia/k8s/dcgm-exporter@{DIGEST}" in docker_run
    # running with the same arguments: nothing to do
    line = " ".join(shlex.quote(w) for w in exporters.docker_run_args(
        PINNED, f"nvcr.io/nvidia/k8s/dcgm-exporter@{DIGEST}")) + "\n"
    running = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.2.3-1"}, services={"docker": {"active": True}},
                  containers=[{"name": "gpuprov-dcgm-exporter", "image": "x"}],
                  files={exporters.CONTAINER_ARGS: line, exporters.COUNTERS: exporters.counters()})
    assert list(exporters.dcgm_exporter(running, PINNED)) == []


def test_the_counters_collect_no_profiling_field_so_the_container_needs_no_sys_admin():
    """NVIDIA's image wants SYS_ADMIN only for the profiling (DCGM_FI_PROF_*) fields (its entrypoint's warning)."""
    fields = [line.split(",")[0].strip() for line in exporters.counters().splitlines()
              if line.strip() and not line.startswith("#")]
    assert fields and not [f for f in fields if f.startswith("DCGM_FI_PROF_")]


def test_no_unpinned_image_runs():
    """The data records no digest as confirmed: an unconfirmed one is never used, `auto` runs NVIDIA's package where
    no digest is pinned, and `container` without one is refused with what to do."""
    data = yaml.safe_load(resources.files("gpuprov.data").joinpath("dcgm_exporter.yaml").read_text())
    assert {entry["status"] for entry in data["image_digests"].values()} == {"unconfirmed"}
    assert [r.image_digest for r in dcgm_data.releases()] == [None, None]
    host = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.4.1-1"}, services={"docker": {"active": True}})
    assert exporters.dcgm_mode(host, POLICY) == "service"
    assert exporters.dcgm_mode(host, PINNED) == "service"          # a pin for another tag
    forced = dataclasses.replace(POLICY, dcgm_exporter="container")
    with pytest.raises(GpuprovError, match=r"runs by digest only, and nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-"
                                           r"ubuntu22.04 has no digest") as refused:
        list(exporters.dcgm_exporter(host, forced))
    assert refused.value.host == "gpu01" and refused.value.step == "dcgm-exporter"
    assert "monitoring.dcgm_exporter_digests: {4.4.1-4.6.0-ubuntu22.04: sha256:...}" in refused.value.hint


def test_a_confirmed_digest_in_the_data_is_used(monkeypatch):
    confirmed = [dataclasses.replace(r, image_digest=DIGEST) for r in dcgm_data.releases()]
    monkeypatch.setattr(dcgm_data, "releases", lambda: confirmed)
    host = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.4.1-1"}, services={"docker": {"active": True}})
    assert exporters.dcgm_mode(host, POLICY) == "container"
    assert list(exporters.dcgm_exporter(host, POLICY))[-1].commands[0] == \
        f"docker pull nvcr.io/nvidia/k8s/dcgm-exporter@{DIGEST}"


@pytest.mark.parametrize("state, summary", [
    (None, "create /var/lib/prometheus/node-exporter root:root 0755"),
    ("directory prometheus:prometheus 755", "make (directory prometheus:prometheus 755 now) "
                                            "/var/lib/prometheus/node-exporter root:root 0755"),
    ("directory root:root 777", "make (directory root:root 777 now) /var/lib/prometheus/node-exporter root:root 0755"),
])
def test_the_textfile_folder_is_made_root_only(state, summary):
    host = ctx()
    host.facts["textfile_dir"] = {"folder": state}
    (change,) = exporters.textfile_dir(host, POLICY)
    assert change.summary.startswith(summary)


@pytest.mark.parametrize("state", ["symbolic link root:root 777", "regular file root:root 644",
                                   "directory root:root 1777"])
def test_a_textfile_path_that_is_no_plain_folder_is_refused(state):
    host = ctx()
    host.facts["textfile_dir"] = {"folder": state}
    with pytest.raises(GpuprovError, match="is not a plain folder gpuprov may own") as refused:
        list(exporters.textfile_dir(host, POLICY))
    assert refused.value.host == "gpu01" and "validate.textfile_dir" in refused.value.hint


def on_here(command: str, tmp_path) -> subprocess.CompletedProcess:
    """A host command run here, with PACKAGE_DIR and dpkg's statoverride database moved into tmp_path."""
    command = command.replace(exporters.PACKAGE_DIR, str(tmp_path / "var-lib-prometheus")).replace(
        "dpkg-statoverride ", f"dpkg-statoverride --admindir {tmp_path / 'dpkg'} ")
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


@pytest.mark.root
@pytest.mark.tool
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("dpkg-statoverride") is None,
                    reason="chown to root needs root; dpkg-statoverride is Debian's")
def test_the_textfile_folder_commands_on_real_folders(tmp_path):
    """stat, dpkg-statoverride and the shell judge: the commands make the folders root:root 0755 with the
    statoverride, the state probe then reads exactly what the plan wants, and a link, a file or a sticky folder is
    refused and left as it was."""
    (tmp_path / "dpkg").mkdir()
    package = tmp_path / "var-lib-prometheus"
    folder = package / "node-exporter"
    policy = dataclasses.replace(POLICY, textfile_dir=f"{exporters.PACKAGE_DIR}/node-exporter")

    def state() -> dict:   # as the host would print it, at PACKAGE_DIR
        output = on_here(exporters.state_command(policy), tmp_path).stdout
        return exporters.parse_state(output.replace(str(package), exporters.PACKAGE_DIR))

    def planned() -> list:
        host = ctx()
        host.facts["textfile_dir"] = state()
        return [*exporters.package_dir(host, policy), *exporters.textfile_dir(host, policy)]

    assert state() == {"folder": None, "package_dir": None, "override": None}
    for prepare in (lambda: None, lambda: (package.mkdir(0o777), os.chown(package, 65534, 65534), folder.mkdir(0o777),
                                           os.chmod(folder, 0o777), os.chown(folder, 65534, 65534))):
        shutil.rmtree(package, ignore_errors=True)
        (tmp_path / "dpkg" / "statoverride").unlink(missing_ok=True)
        prepare()
        changes = planned()
        assert len(changes) == 2
        for change in changes:
            done = on_here(change.commands[0], tmp_path)
            assert done.returncode == 0, done.stderr
        for path in (package, folder):
            info = path.lstat()
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), stat.S_ISDIR(info.st_mode)) == (
                0, 0, 0o755, True), path
        listed = on_here(f"dpkg-statoverride --list {exporters.PACKAGE_DIR}", tmp_path).stdout.split()
        assert listed == ["root", "root", "755", str(package)]
        assert planned() == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(0o700)
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere)
    sticky = tmp_path / "shared"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    plain = tmp_path / "file"
    plain.write_text("")
    for path in (folder, sticky, plain):
        before = path.lstat()
        done = subprocess.run(["sh", "-c", exporters.textfile_dir_command(str(path))], capture_output=True, text=True)
        assert done.returncode == 1 and "refused" in done.stderr
        assert path.lstat() == before
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o700
    assert state()["folder"].startswith("symbolic link ")
    with pytest.raises(GpuprovError, match="is not a plain folder gpuprov may own"):
        planned()


def test_a_textfile_folder_elsewhere_leaves_the_package_folder_alone():
    host = ctx()
    host.facts["textfile_dir"] = {"folder": "directory root:root 755"}
    assert list(exporters.package_dir(host, dataclasses.replace(POLICY, textfile_dir="/srv/textfiles"))) == []


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


@pytest.mark.tool
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
    pinned = dataclasses.replace(POLICY, dcgm_exporter_digests={"4.4.1-4.6.0-ubuntu22.04": DIGEST})
    first = list(exporters.dcgm_exporter(was_service, pinned))[0]
    assert first.commands == ("systemctl disable --now nvidia-dcgm-exporter",)
    was_container = ctx(packages={"datacenter-gpu-manager-4-core": "1:4.4.1-1"},
                        containers=[{"name": "gpuprov-dcgm-exporter", "image": "x"}])
    first = list(exporters.dcgm_exporter(was_container, POLICY))[0]
    assert first.commands[0] == "docker rm --force gpuprov-dcgm-exporter"
    none = MonitoringPolicy(host="gpu01", address="10.0.0.1", dcgm_exporter="none")
    assert [c.summary for c in exporters.dcgm_exporter(was_container, none)] == [
        "remove the gpuprov-dcgm-exporter container (dcgm-exporter: none)"]


def answering(stdout: str) -> LocalConn:
    """A host whose one command prints `stdout` (what the address check finds there)."""
    return LocalConn(answer=lambda command, stdin: stdout)


@pytest.mark.parametrize("found, message", [
    ("", "the monitoring address 10.20.0.11: it is not an address of this host"),
    ("127.0.1.1\n", "the monitoring address 10.20.0.11: it is only loopback (127.0.1.1)"),
])
def test_a_monitoring_address_the_host_cannot_listen_on_is_refused_before_anything_changes(found, message):
    with pytest.raises(GpuprovError) as info:
        deploy.check_address(answering(found), POLICY)
    assert info.value.message.startswith(message) and info.value.host == "gpu01"
    assert "set monitoring_address" in info.value.hint
    deploy.check_address(answering("10.20.0.11\n"), POLICY)   # its own address: fine


@pytest.mark.tool
@pytest.mark.skipif(shutil.which("ip") is None or shutil.which("getent") is None, reason="needs ip and getent")
def test_the_address_check_runs_in_sh_and_finds_loopback_here():
    out = subprocess.run(["sh", "-c", deploy.address_check_command("127.0.0.1")], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and out.stdout.split() == ["127.0.0.1"]
