"""What an operator of a busy fleet meets, on provisioned lab hosts over real SSH: running work is never
disrupted without --disrupt, locks reproduce, versions are checked first, credentials stay secret.

The module provisions its own two hosts once; each test leaves them provisioned and idle.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from labutil import ROOT, copy_inventory, invoke, invoke_json, on_host, snapshot

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts
PROFILES = ["hgx-h100", "l40s"]
COMPUTE_APPS = "/etc/gpuprov-lab/compute-apps.csv"  # what the lab's nvidia-smi reports as compute apps
NVIDIA = re.compile(r"^Inst (nvidia|libnvidia|cuda|libcuda|libnccl|datacenter-gpu-manager|xserver-xorg-video-nvidia)",
                    re.M)


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """Two hosts provisioned from bare (Docker included), and the environment every CLI call uses."""
    import gpuprov.lab

    state = gpuprov.lab.up(len(PROFILES), PROFILES, paths=lab.paths, fresh=True)
    folder = tmp_path_factory.mktemp("busy")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    provision(env, "--all")
    return state, env


def provision(env, *args, check_code=0, inventory=None) -> dict:
    from gpuprov.lab.state import LabPaths

    return invoke_json("provision", "--inventory", str(inventory or LabPaths(ROOT).inventory), *args,
                       check_code=check_code, env=env)


def one(report: dict) -> dict:
    [run] = report["hosts"]
    return run


def name_of(state, profile: str) -> str:
    return next(h.name for h in state.hosts if h.profile == profile)


def started(state, name: str) -> str:
    """PID 1's start time: changes with every (lab) reboot."""
    return on_host(state, name, "cut -d' ' -f22 /proc/1/stat").strip()


def pinned(state, tmp_path: Path, name: str, branch: str) -> Path:
    def edit(document):
        document["hosts"][name].setdefault("vars", {})["stack"] = {"driver": branch}
    return copy_inventory(state, tmp_path, edit=edit)


def older_branch(state, name: str) -> str:
    """A stable branch below the newest that the lab mirror carries for the host's profile."""
    from gpuprov.lab.profiles import load_profiles
    from gpuprov.lab.standins import lab_stacks

    profile = load_profiles()[state.host(name).profile]
    branches = [s["driver"]["branch"] for s in lab_stacks([profile])]
    return branches[1]


def test_os_reboot_required_alone_is_reported_not_acted_on(fleet):
    state, env = fleet
    name = name_of(state, "l40s")
    on_host(state, name, "echo linux-image-6.1.0-28-amd64 > /var/run/reboot-required.pkgs && "
                         "touch /var/run/reboot-required")
    before = started(state, name)
    run = one(provision(env, "--host", name))
    assert (run["status"], run["reboot"]) == ("unchanged", "required by the OS")
    assert run["reboot_detail"] == "reboot required by the OS: linux-image-6.1.0-28-amd64"
    assert started(state, name) == before
    on_host(state, name, "rm -f /var/run/reboot-required /var/run/reboot-required.pkgs")
    run = one(provision(env, "--host", name, "--reboot", "always"))  # as its name says
    assert run["reboot"] == "done" and started(state, name) != before


def test_gpu_process_blocks_a_driver_change_until_disrupt(fleet, tmp_path):
    state, env = fleet
    name = name_of(state, "l40s")
    driver = one(provision(env, "--host", name, "--dry-run"))["stack"]["driver"]["version"]
    on_host(state, name, f"mkdir -p /etc/gpuprov-lab && echo '4242, python3, 30512' > {COMPUTE_APPS}")
    inventory = pinned(state, tmp_path, name, older_branch(state, name))
    before = started(state, name)
    try:
        run = one(provision(env, "--host", name, inventory=inventory, check_code=1))
        refused = [c for c in run["plan"]["changes"] if c.get("refused")]
        assert {c["component"] for c in refused} >= {"driver"}
        assert all(c["refused"] == ["GPU process 4242 python3 (30512 MiB)"] for c in refused)
        assert run["facts_after"]["nvidia_smi"]["driver_version"] == driver
        assert run["reboot"] != "done" and started(state, name) == before
        run = one(provision(env, "--host", name, "--disrupt", inventory=inventory))
        assert run["reboot"] == "done" and run["facts_after"]["nvidia_smi"]["driver_version"] != driver
    finally:
        on_host(state, name, f"rm -f {COMPUTE_APPS}")
    assert one(provision(env, "--host", name))["facts_after"]["nvidia_smi"]["driver_version"] == driver


def start_container(state, name: str) -> None:
    """A nested container from an image made on the host (nothing is pulled): sleeps until removed."""
    on_host(state, name, "docker image inspect lab-sleeper >/dev/null 2>&1 || "
                         "tar -ch /bin/sh /bin/sleep /lib/x86_64-linux-gnu/libc.so.6 /lib64/ld-linux-x86-64.so.2 "
                         "2>/dev/null | docker import - lab-sleeper >/dev/null")
    on_host(state, name, "docker run -d --name trainer lab-sleeper /bin/sleep 3600 >/dev/null")


def runtimes(state, name: str) -> str:
    return on_host(state, name, "docker info --format '{{json .Runtimes}}'")


def test_running_container_blocks_the_docker_restart_until_disrupt(fleet):
    state, env = fleet
    name = name_of(state, "hgx-h100")
    assert '"nvidia"' in runtimes(state, name)
    # the runtime is missing again (a package reinstall put back the distribution's file), a user key kept
    on_host(state, name, "echo '{\"log-level\": \"warn\"}' > /etc/docker/daemon.json && systemctl restart docker")
    start_container(state, name)
    try:
        run = one(provision(env, "--host", name, check_code=1))
        steps = {s["summary"].split(" ")[0]: s for s in run["steps"] if s["component"] == "container_toolkit"}
        assert steps["add"]["status"] == "done" and '+    "log-level": "warn",' in steps["add"]["output_tail"]
        [restart] = [c for c in run["plan"]["changes"] if c["summary"].startswith("restart Docker")]
        assert restart["disruptive"] == "Docker restart" and restart["refused"] == ["container trainer (lab-sleeper)"]
        daemon = yaml.safe_load(on_host(state, name, "cat /etc/docker/daemon.json"))
        assert daemon["log-level"] == "warn" and "nvidia" in daemon["runtimes"]
        assert on_host(state, name, "docker ps --format '{{.Names}}'").split() == ["trainer"]
        assert '"nvidia"' not in runtimes(state, name)
        run = one(provision(env, "--host", name, "--disrupt"))
        assert [s["status"] for s in run["steps"] if s["summary"].startswith("restart Docker")] == ["done"]
        assert '"nvidia"' in runtimes(state, name)
    finally:
        on_host(state, name, "docker rm -f trainer >/dev/null 2>&1", check=False)
    assert one(provision(env, "--host", name))["status"] == "unchanged"


def test_a_newer_point_release_on_the_mirror_is_not_upgraded_to(fleet):
    state, env = fleet
    name = name_of(state, "hgx-h100")
    run = one(provision(env, "--host", name))
    driver_pkg = run["stack"]["driver"]["packages"][-1]["name"]
    versions = on_host(state, name, f"apt-get update -qq && apt-cache madison {driver_pkg}")
    assert len(versions.strip().splitlines()) >= 2, f"the mirror must carry a newer release:\n{versions}"
    simulated = on_host(state, name, "apt-get -s dist-upgrade")
    assert NVIDIA.findall(simulated) == [], simulated
    simulated = on_host(state, name, "apt-get -s upgrade")
    assert NVIDIA.findall(simulated) == [], simulated


def test_a_lock_written_before_the_data_moved_on_is_reproduced(fleet, tmp_path):
    state, env = fleet
    name = name_of(state, "l40s")
    older = older_branch(state, name)
    invoke("stack.lock", "--host", name, "--inventory", str(pinned(state, tmp_path, name, older)), env=env)
    lock = Path(env["INVOKE_GPUPROV_LOCKS"]) / f"{name}.lock.yaml"
    locked = yaml.safe_load(lock.read_text())["stack"]["driver"]["version"]
    try:
        run = one(provision(env, "--host", name))  # the inventory as it is now resolves the newest branch
        assert run["lock"] == str(lock) and run["stack"]["driver"]["version"] == locked
        assert run["facts_after"]["nvidia_smi"]["driver_version"] == locked
        assert any("--update-lock" in notice for notice in run["notices"])
        assert invoke_json("stack.check", "--host", name, env=env)[name]["mismatches"] == []
    finally:
        lock.unlink()
    assert one(provision(env, "--host", name))["stack"]["driver"]["branch"] != older


def test_a_version_missing_from_the_mirror_is_named_before_anything_changes(fleet, tmp_path):
    state, env = fleet
    name = name_of(state, "l40s")
    invoke("stack.lock", "--host", name, env=env)
    lock = Path(env["INVOKE_GPUPROV_LOCKS"]) / f"{name}.lock.yaml"
    doc = yaml.safe_load(lock.read_text())
    nccl = doc["stack"]["nccl"]["packages"][0]
    real, nccl["version"] = nccl["version"], "2.99.9-1+cuda12.9"
    lock.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = snapshot(state, name)
    try:
        proc = invoke("provision", "--host", name, env=env, check_code=2)
        text = proc.stdout + proc.stderr
        assert f"{nccl['name']}=2.99.9-1+cuda12.9" in text and real in text and str(lock) in text
        assert snapshot(state, name) == before
    finally:
        lock.unlink()


def test_mirror_credentials_stay_secret(fleet, tmp_path):
    state, env = fleet
    name = name_of(state, "l40s")
    secret = "s3cr3t-Pa55w0rd"

    def with_credentials(document):
        mirror = dict(document["groups"]["lab"]["vars"]["mirror"])
        mirror["url"] = mirror["url"].replace("http://", f"http://gpuadmin:{secret}@")
        document["hosts"][name].setdefault("vars", {})["mirror"] = mirror

    inventory = copy_inventory(state, tmp_path, edit=with_credentials)
    proc = invoke("provision", "--host", name, "--inventory", str(inventory), "--json", env=env)
    report = Path(yaml.safe_load(proc.stdout)["report"])
    try:
        assert secret not in proc.stdout + proc.stderr and secret not in report.read_text()
        auth = on_host(state, name, "stat -c '%a %U' /etc/apt/auth.conf.d/gpuprov-nvidia.conf").strip()
        assert auth == "600 root"
        assert "gpuadmin" in on_host(state, name, "cat /etc/apt/auth.conf.d/gpuprov-nvidia.conf")
        assert on_host(state, name, f"grep -rls {secret} /etc/apt/sources.list.d || true").strip() == ""
        seen = subprocess.run(["docker", "exec", "-u", "nobody", state.host(name).container_id, "sh", "-c",
                               f"grep -rs {secret} /etc /var/lib/apt /run /tmp; true"],
                              capture_output=True, text=True, timeout=60).stdout
        assert seen == ""
        assert one(provision(env, "--host", name, inventory=inventory))["status"] == "unchanged"
    finally:
        provision(env, "--host", name)
    assert on_host(state, name, "ls /etc/apt/auth.conf.d/gpuprov-nvidia.conf 2>/dev/null || true").strip() == ""
