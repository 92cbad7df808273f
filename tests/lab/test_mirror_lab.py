"""The lab mirror against a real lab host container: signed flat repository, apt installs of stand-ins at
exact versions, the simulated nvidia-smi, a branch upgrade without reboot (version mismatch) and a reboot.

The apt work happens on a dedicated throwaway host (not one of the session's shared hosts) so other lab
tests see clean hosts.
"""

from __future__ import annotations

import io
import json
import platform
import shlex
import tarfile
import time

import pytest

from gpuprov.facts.parsers import parse_nvidia_smi

pytestmark = pytest.mark.lab

TEST_HOST = "gpuprov-mirrortest"
PROFILE = "hgx-h100"
LIST = "/etc/apt/sources.list.d/gpuprov-nvidia.list"
KEYRING = "/usr/share/keyrings/gpuprov-nvidia.gpg"
APT_ONLY_MIRROR = f"-o Dir::Etc::sourcelist={LIST} -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"


def sh(container, script: str) -> tuple[int, str]:
    result = container.exec_run(["/bin/sh", "-c", script], environment={"DEBIAN_FRONTEND": "noninteractive"})
    return result.exit_code, result.output.decode(errors="replace")


def ok(container, script: str) -> str:
    rc, out = sh(container, script)
    assert rc == 0, f"{script!r} exited {rc}:\n{out}"
    return out


def _files(files: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def wait_booted(container, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        container.reload()
        if container.status == "running":
            state = container.exec_run(["systemctl", "is-system-running"]).output.decode().strip()
            if state in ("running", "degraded"):
                return
        time.sleep(0.5)
    raise AssertionError(f"{container.name} did not boot (systemd: {state})")


@pytest.fixture
def mirror_host(lab):
    """A throwaway lab host (hgx-h100 profile) on the lab network, removed afterwards."""
    import docker

    from gpuprov.lab.hosts import RUN_OPTIONS
    from gpuprov.lab.labels import LABELS, NETWORK
    from gpuprov.lab.profiles import load_profiles

    client = docker.from_env()
    for old in client.containers.list(all=True, filters={"name": f"^/{TEST_HOST}$"}):
        old.remove(force=True)
    profile = load_profiles()[PROFILE]
    container = client.containers.create(lab.image, name=TEST_HOST, hostname=TEST_HOST, detach=True,
                                         labels=dict(LABELS), network="bridge", **RUN_OPTIONS)
    try:
        container.put_archive("/", _files({
            "etc/gpuprov-lab/profile": f"{PROFILE}\n".encode(),
            "etc/gpuprov-lab/devices.json": json.dumps(profile.devices).encode()}))
        client.networks.get(lab.network or NETWORK).connect(container)
        container.start()
        wait_booted(container)
        yield container
    finally:
        container.remove(force=True)


def _driver(packages, role: str = "driver"):
    """Driver stand-ins by branch, oldest first."""
    found = sorted((p for p in packages if p.role == role), key=lambda p: tuple(map(int, p.upstream.split("."))))
    return {p.upstream.split(".")[0]: p for p in found}


def test_mirror_serves_standins_and_simulates_driver_upgrade(lab, mirror_host):
    from gpuprov.lab.mirror import ensure_mirror, mirror_vars
    from gpuprov.stack.data import vkey

    info = ensure_mirror(lab, paths=lab.paths, progress=print)
    again = ensure_mirror(lab, paths=lab.paths)
    assert again.url == info.url and again.fingerprint == info.fingerprint
    assert mirror_vars(info) == {"url": info.url, "key_file": str(info.key_file), "fingerprint": info.fingerprint}
    assert info.url.startswith("http://") and info.url.endswith("/")
    assert len(info.fingerprint) == 40

    host = mirror_host
    drivers = _driver(info.packages)
    fabric = _driver(info.packages, "fabricmanager")
    old_branch, new_branch = sorted(set(drivers) & set(fabric), key=int)[:2]
    old, new = drivers[old_branch], drivers[new_branch]
    by_name = {(p.name, p.role): p for p in info.packages}
    ctk = by_name[("nvidia-container-toolkit-base", "container_toolkit")]
    dcgm = next(p for p in info.packages if p.name == "datacenter-gpu-manager-4-core")
    kernel = platform.release()

    # The provisioning ops' way of trusting the mirror, by hand: keyring + flat-repository list.
    key = info.key_file.read_text(encoding="utf-8")
    ok(host, f"printf %s {shlex.quote(key)} | gpg --dearmor > {KEYRING}")
    ok(host, f"echo {shlex.quote(f'deb [signed-by={KEYRING}] {info.url} /')} > {LIST}")
    out = ok(host, f"apt-get {APT_ONLY_MIRROR} update 2>&1")
    assert "W:" not in out and "NO_PUBKEY" not in out, out

    pins = [f"{old.name}={old.version}", f"{fabric[old_branch].name}={fabric[old_branch].version}",
            f"{ctk.name}={ctk.version}", f"{dcgm.name}={dcgm.version}", f"linux-headers-{kernel}"]
    ok(host, "apt-get install -y " + " ".join(shlex.quote(p) for p in pins))
    installed = ok(host, f"dpkg-query -W -f='${{Version}}' {old.name}")
    assert installed == old.version

    rc, text = sh(host, "nvidia-smi -q")
    smi = parse_nvidia_smi(f"{text}\n@@rc={rc}\n")
    assert rc == 0, text
    assert smi["driver_version"] == old.upstream
    assert vkey(smi["cuda_version"]) >= (12,)
    assert [g["name"] for g in smi["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert len({g["uuid"] for g in smi["gpus"]}) == 8
    csv = ok(host, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert csv.splitlines() == [f"NVIDIA H100 80GB HBM3, {old.upstream}"] * 8

    assert f"version is : {old.upstream}" in ok(host, "nv-fabricmanager --version")
    ok(host, "systemctl start nvidia-fabricmanager && sleep 1 && systemctl is-active nvidia-fabricmanager")
    assert ok(host, "nvidia-ctk --version").startswith(f"NVIDIA Container Toolkit CLI version {ctk.upstream}")
    ok(host, "mkdir -p /etc/docker && echo '{\"log-driver\": \"json-file\"}' > /etc/docker/daemon.json")
    ok(host, "nvidia-ctk runtime configure --runtime=docker")
    daemon = json.loads(ok(host, "cat /etc/docker/daemon.json"))
    assert daemon == {"log-driver": "json-file",
                      "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    ok(host, "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml && grep -c '/dev/nvidia[0-9]' /etc/cdi/nvidia.yaml")
    assert f"version: {dcgm.upstream}" in ok(host, "dcgmi --version")
    ok(host, f"test -d /lib/modules/{kernel}/build && test -d /usr/src/linux-headers-{kernel}")
    assert ok(host, "systemctl is-enabled gpuprov-lab-nvidia-module.service").strip() == "enabled"

    # Another branch without a reboot: the "loaded module" is still the old one.
    ok(host, f"apt-get install -y {shlex.quote(f'{new.name}={new.version}')}")
    status = sh(host, f"dpkg-query -W -f='${{db:Status-Abbrev}}' {old.name}")[1]
    assert old.name == new.name or not status.startswith("ii"), f"{old.name} still installed: {status}"
    rc, text = sh(host, "nvidia-smi -q")
    assert rc == 18, text
    assert "Failed to initialize NVML: Driver/library version mismatch" in text
    assert "error" in parse_nvidia_smi(f"{text}\n@@rc={rc}\n")

    # A reboot (container restart: /run is tmpfs) loads the new driver.
    host.restart(timeout=10)
    wait_booted(host)
    rc, text = sh(host, "nvidia-smi -q")
    assert rc == 0, text
    assert parse_nvidia_smi(f"{text}\n@@rc=0\n")["driver_version"] == new.upstream
