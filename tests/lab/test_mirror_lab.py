"""The lab mirror against a real lab host container: signed flat repository, apt installs of stand-ins at
exact versions, the simulated nvidia-smi, a branch upgrade without reboot (version mismatch) and a reboot;
Debian's docker.io from the mirror running a nested container; the driver metapackage pulling its libraries;
the newer point release a held stack ignores; compute processes a test plants for nvidia-smi.

The apt work happens on dedicated throwaway hosts (not the session's shared hosts) so other lab tests see
clean hosts.
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
import shlex
import tarfile
import time

import pytest

from gpuprov.facts.parsers import parse_nvidia_smi_xml

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


@contextlib.contextmanager
def throwaway_host(lab, name: str = TEST_HOST, profile_name: str = PROFILE):
    """A throwaway lab host of `profile_name` on the lab network, removed afterwards."""
    import docker

    from gpuprov.lab.hosts import RUN_OPTIONS
    from gpuprov.lab.labels import LABELS, NETWORK
    from gpuprov.lab.profiles import load_profiles

    client = docker.from_env()
    for old in client.containers.list(all=True, filters={"name": f"^/{name}$"}):
        old.remove(force=True)
    profile = load_profiles()[profile_name]
    container = client.containers.create(lab.image, name=name, hostname=name, detach=True,
                                         labels=dict(LABELS), network="bridge", **RUN_OPTIONS)
    try:
        container.put_archive("/", _files({
            "etc/gpuprov-lab/profile": f"{profile_name}\n".encode(),
            "etc/gpuprov-lab/devices.json": json.dumps(profile.devices).encode()}))
        client.networks.get(lab.network or NETWORK).connect(container)
        container.start()
        wait_booted(container)
        yield container
    finally:
        container.remove(force=True)


@pytest.fixture
def mirror_host(lab):
    """A throwaway lab host (hgx-h100 profile) on the lab network, removed afterwards."""
    with throwaway_host(lab) as container:
        yield container


@pytest.fixture(scope="module")
def mirror(lab):
    from gpuprov.lab.mirror import ensure_mirror

    return ensure_mirror(lab, paths=lab.paths, progress=print)


def trust_mirror(host, info) -> None:
    """What provisioning's sources step does, by hand: the mirror's keyring and its flat-repository list."""
    key = info.key_file.read_text(encoding="utf-8")
    ok(host, f"printf %s {shlex.quote(key)} | gpg --dearmor > {KEYRING}")
    ok(host, f"echo {shlex.quote(f'deb [signed-by={KEYRING}] {info.url} /')} > {LIST}")
    out = ok(host, f"apt-get {APT_ONLY_MIRROR} update 2>&1")
    assert "W:" not in out and "NO_PUBKEY" not in out, out


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
    assert mirror_vars(info) == {"url": info.url, "key_file": str(info.key_file), "fingerprint": info.fingerprint,
                                 "label": "gpuprov-lab"}
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
    trust_mirror(host, info)

    pins = [f"{old.name}={old.version}", f"{fabric[old_branch].name}={fabric[old_branch].version}",
            f"{ctk.name}={ctk.version}", f"{dcgm.name}={dcgm.version}", f"linux-headers-{kernel}"]
    ok(host, "apt-get install -y " + " ".join(shlex.quote(p) for p in pins))
    installed = ok(host, f"dpkg-query -W -f='${{Version}}' {old.name}")
    assert installed == old.version

    rc, text = sh(host, "nvidia-smi -q -x")
    smi = parse_nvidia_smi_xml(text, rc)
    assert rc == 0, text
    assert smi["driver_version"] == old.upstream
    assert vkey(smi["cuda_version"]) >= (12,)
    assert [g["name"] for g in smi["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert len({g["uuid"] for g in smi["gpus"]}) == 8
    csv = ok(host, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert csv.splitlines() == [f"NVIDIA H100 80GB HBM3, {old.upstream}"] * 8

    assert f"version is : {old.upstream}" in ok(host, "nv-fabricmanager --version")
    # started, and past its driver check: its main process is the `sleep` the stand-in execs once the loaded
    # driver matches (polled, bounded: it refuses by exiting, so "active" alone may be seen before it exits)
    main = "cat /proc/$(systemctl show -p MainPID --value nvidia-fabricmanager)/comm 2>/dev/null"
    ok(host, f"systemctl start nvidia-fabricmanager && for i in $(seq 100); do [ \"$({main})\" = sleep ] && break; "
             f"sleep 0.1; done; systemctl is-active nvidia-fabricmanager && [ \"$({main})\" = sleep ]")
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
    rc, text = sh(host, "nvidia-smi -q -x")
    assert rc == 18 and "error" in parse_nvidia_smi_xml(text, rc)

    # A reboot (container restart: /run is tmpfs) loads the new driver.
    host.restart(timeout=10)
    wait_booted(host)
    rc, text = sh(host, "nvidia-smi -q -x")
    assert rc == 0, text
    assert parse_nvidia_smi_xml(text, rc)["driver_version"] == new.upstream


# ------------------------------------------------------------------------------------------- Docker

# A container image made on the lab host itself, nothing pulled: a root file system of dash and its libraries.
TINY_IMAGE = ("cd / && tar -chf /tmp/tiny.tar usr/bin/dash lib/x86_64-linux-gnu/libc.so.6 lib64/ld-linux-x86-64.so.2 "
              "&& docker import /tmp/tiny.tar gpuprov-lab/tiny:1")


def test_docker_io_from_the_mirror_installs_and_runs_a_nested_container(lab, mirror, mirror_host):
    from gpuprov.lab.debian import DEBIAN_PACKAGES

    host = mirror_host
    assert {"docker.io", "containerd", "runc", "iptables", "prometheus-node-exporter"} <= {d.name for d in
                                                                                          mirror.debian}
    assert set(DEBIAN_PACKAGES) == {"docker.io", "prometheus-node-exporter", "prometheus", "unattended-upgrades",
                                    "lynis"}
    trust_mirror(host, mirror)
    assert sh(host, "command -v dockerd")[0] != 0
    # as the engine step installs it (no Debian mirror on the host: everything comes from the lab mirror)
    started = time.monotonic()
    ok(host, "apt-get -y -q install --no-install-recommends docker.io && systemctl enable --now docker")
    print(f"docker.io install + start on a lab host: {time.monotonic() - started:.1f} s")
    docker_version = next(d.version for d in mirror.debian if d.name == "docker.io")
    assert ok(host, "dpkg-query -W -f='${Version}' docker.io") == docker_version
    info = json.loads(ok(host, "docker info --format '{{json .}}'"))
    assert info["ServerVersion"] and info["OperatingSystem"].startswith("Debian GNU/Linux 12")
    ok(host, TINY_IMAGE)
    assert ok(host, "docker run --rm gpuprov-lab/tiny:1 /usr/bin/dash -c 'echo nested-ok'").strip() == "nested-ok"
    # the same through Docker's bridge network (iptables rules, a veth) and after a daemon restart
    ok(host, "systemctl restart docker")
    out = ok(host, "docker run --rm --network bridge gpuprov-lab/tiny:1 /usr/bin/dash -c 'echo bridged-ok'")
    assert out.strip() == "bridged-ok"
    assert ok(host, "systemctl is-enabled docker").strip() == "enabled"
    # node exporter comes from the mirror too and serves metrics
    ok(host, "apt-get -y -q install --no-install-recommends prometheus-node-exporter")
    metrics = ok(host, "for i in $(seq 50); do curl -fsS http://127.0.0.1:9100/metrics && break; sleep 0.2; done")
    assert "node_exporter_build_info" in metrics


# ------------------------------------------------------------------------ driver packages, point release

STACK_HOST = "gpuprov-mirrortest-stack"


@pytest.fixture(scope="module")
def stack_host(lab, mirror):
    """A throwaway hgx-h100 host that trusts the mirror, shared by the tests below (in file order)."""
    with throwaway_host(lab, STACK_HOST) as host:
        trust_mirror(host, mirror)
        yield host


@pytest.fixture(scope="module")
def newest_stack():
    """The stack the hgx-h100 profile resolves by default (what provisioning installs there)."""
    from gpuprov.lab.profiles import load_profiles
    from gpuprov.stack.resolve import resolve

    hw = load_profiles()[PROFILE].hardware
    return resolve(hw["gpu"], "debian-12", gpus=hw["count"], nvswitch=hw["nvswitch"]).to_dict()


def driver_pins(version: str) -> str:
    """apt preferences like provisioning's: the driver's packages at the driver's version."""
    return ("Package: nvidia-* libnvidia-* xserver-xorg-video-nvidia*\n"
            f"Pin: version {version}-*\nPin-Priority: 1001\n")


def installed(host) -> dict[str, str]:
    lines = ok(host, "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n'").splitlines()
    return {line.split()[1]: line.split()[2] for line in lines if line.startswith(("ii", "hi"))}


def test_the_driver_metapackage_pulls_its_libraries_at_its_version(stack_host, newest_stack):
    host = stack_host
    driver = newest_stack["driver"]
    assert driver["branch"] >= "590"  # unversioned names and a pinning package
    wanted = [f"{p['name']}={p['version']}" for p in driver["packages"]]
    assert any(w.startswith("nvidia-open=") for w in wanted)
    # the mirror also carries a newer point release of this branch: alone, the older metapackage cannot install
    rc, out = sh(host, "apt-get -s install " + " ".join(shlex.quote(w) for w in wanted))
    assert rc != 0 and "is to be installed" in out, out
    # so, as provisioning does, the driver's packages are pinned at its version first
    ok(host, f"printf %s {shlex.quote(driver_pins(driver['version']))} > /etc/apt/preferences.d/gpuprov-nvidia")
    ok(host, "apt-get -y -q install --no-install-recommends " + " ".join(shlex.quote(w) for w in wanted))
    version = next(p["version"] for p in driver["packages"] if p["name"] == "nvidia-open")
    now = installed(host)
    # NVIDIA's names from 590 on (no branch), each at exactly the metapackage's version
    for name in ("nvidia-driver-open", "nvidia-dkms-open", "nvidia-kernel-source-open", "nvidia-kernel-common",
                 "libnvidia-compute", "nvidia-utils", "nvidia-compute-utils", "libnvidia-gl",
                 "xserver-xorg-video-nvidia", f"nvidia-firmware-{driver['version']}"):
        assert now.get(name) == version, (name, now.get(name))
    assert now.get("dkms")
    rc, text = sh(host, "nvidia-smi -q -x")
    assert rc == 0, text
    assert parse_nvidia_smi_xml(text, rc)["driver_version"] == driver["version"]
    # nvidia-smi belongs to nvidia-utils, the driver version to libnvidia-compute (as in NVIDIA's packages)
    assert ok(host, "dpkg -S /usr/bin/nvidia-smi").split(":")[0] == "nvidia-utils"
    assert ok(host, "dpkg -S /usr/lib/gpuprov-lab/driver-version").split(":")[0] == "libnvidia-compute"


def test_the_newer_point_release_is_on_the_mirror_and_a_held_stack_ignores_it(mirror, stack_host, newest_stack):
    from gpuprov.lab.standins import newer_point_release

    host = stack_host
    point = {s.name: s.version for s in newer_point_release(newest_stack)}
    assert {(s.name, s.version) for s in mirror.point_release} >= set(point.items())
    bumped, current = point["nvidia-open"], installed(host)["nvidia-open"]
    assert bumped.startswith(newest_stack["driver"]["branch"] + ".999.")
    assert ok(host, f"dpkg --compare-versions {bumped} gt {current} && echo newer").strip() == "newer"
    # both releases are in the mirror's one index, as NVIDIA's repository keeps every point release
    madison = ok(host, "apt-cache madison nvidia-open libnvidia-compute nvidia-fabricmanager")
    for name in ("nvidia-open", "libnvidia-compute", "nvidia-fabricmanager"):
        versions = {line.split("|")[1].strip() for line in madison.splitlines() if line.split("|")[0].strip() == name}
        assert versions >= {current, bumped}, madison
    # the stack as provisioning leaves it: installed at its versions and held, the pins dropped here to show
    # that the holds alone keep it (the metapackage depends on its parts at exactly its version)
    stack_pkgs = [p for key in ("driver", "fabricmanager") for p in (newest_stack[key] or {"packages": []})["packages"]]
    ok(host, "apt-get -y -q install --no-install-recommends "
       + " ".join(shlex.quote(f"{p['name']}={p['version']}") for p in stack_pkgs))
    ok(host, "apt-mark hold " + " ".join(p["name"] for p in stack_pkgs) + " >/dev/null")
    ok(host, "mv /etc/apt/preferences.d/gpuprov-nvidia /root/pins")
    before = installed(host)
    simulated = ok(host, "apt-get -s dist-upgrade")
    moved = [line for line in simulated.splitlines() if line.startswith(("Inst ", "Remv "))]
    assert moved == [], simulated
    assert ok(host, "apt-get -s upgrade").count("\nInst ") == 0
    assert installed(host) == before
    # without holds and pins it is a real upgrade for apt
    unheld = ok(host, "apt-mark unhold " + " ".join(p["name"] for p in stack_pkgs) + " >/dev/null; "
                "apt-get -s dist-upgrade")
    assert f"Inst nvidia-open [{current}] ({bumped} " in unheld
    ok(host, "apt-mark hold " + " ".join(p["name"] for p in stack_pkgs) + " >/dev/null && "
       "mv /root/pins /etc/apt/preferences.d/gpuprov-nvidia")


def test_compute_apps_file_makes_nvidia_smi_report_a_process(stack_host):
    from gpuprov.facts.parsers import parse_gpu_processes

    host = stack_host
    query = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits"
    assert ok(host, query) == ""
    host.put_archive("/", _files({"etc/gpuprov-lab/compute-apps.csv": b"12345, python, 40960\n"}))
    out = ok(host, query)
    assert out == "12345, python, 40960\n"
    assert parse_gpu_processes(ok(host, "nvidia-smi -q -x"), 0) == [{"pid": 12345, "process_name": "python",
                                                                     "used_memory_mib": 40960}]
    uuid = ok(host, "nvidia-smi --query-gpu=uuid --format=csv,noheader").splitlines()[0]
    assert ok(host, "nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader") == f"{uuid}, 12345\n"
    assert "python" in ok(host, "nvidia-smi")
    ok(host, "rm /etc/gpuprov-lab/compute-apps.csv")
    assert ok(host, query) == ""
