"""The lab side of `invoke validate`: simulated GPU faults seen over real SSH, and GPU containers through Docker's
`--gpus` on a lab host (the stand-in NVIDIA container runtime hook and runtime), before and after the NVIDIA
Container Toolkit is provisioned.

The tests run in file order on the session's hgx-h100 host: driver, fabric manager and Docker first (no toolkit),
then the whole stack. Expected outputs are the real tools' (tests/fixtures/, moby's and nvidia-container-cli's
messages), never the simulation's own data.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from labutil import invoke, on_host

from gpuprov.lab import faults as lab_faults
from gpuprov.lab.nested import ensure_image

pytestmark = pytest.mark.lab
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NVLINK_H100 = (FIXTURES / "nvidia-smi-nvlink/h100-sxm5-80gb_nvlink-s_590.48.01.txt").read_text().splitlines()
NVLINK_INACTIVE = (FIXTURES / "errors/a100-sxm4-80gb_nvlink-s_all-links-inactive.txt").read_text().splitlines()
LIST_LINE = re.compile(r"GPU \d: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)")  # as the H100 capture's
# dockerd without a GPU device driver (moby daemon/errors.go); `docker run` exits 125 on daemon errors
NO_GPU_DRIVER = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'
CLI_MISMATCH = "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch"
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"


@pytest.fixture(scope="module")
def reports_env(tmp_path_factory) -> dict:
    """Reports and locks of this module's provisioning runs go to a temporary folder, not the checkout's."""
    folder = tmp_path_factory.mktemp("validate-lab")
    return {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}


@pytest.fixture(scope="module")
def gpu_host(lab, reports_env):
    """The session's hgx-h100 host with the driver, fabric manager and Docker, not yet the container toolkit, and
    a nested image made from its own files; its name and the image tag."""
    name = next(h.name for h in lab.hosts if h.profile == "hgx-h100")
    started = time.monotonic()
    invoke("provision", "--inventory", str(lab.inventory), "--host", name, "--only",
           "sources,kernel,driver,engine,fabricmanager", env=reports_env)
    print(f"driver, fabric manager and Docker on {name}: {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    image = ensure_image(lab.host(name))
    print(f"nested image {image}: {time.monotonic() - started:.1f} s")
    return name, image


def ssh(lab, name: str, command: str) -> tuple[int, str]:
    """`command` on the host over real SSH (the lab's key and known_hosts), as the suite runs there."""
    host = lab.host(name)
    proc = subprocess.run(["ssh", "-i", str(lab.key), "-p", str(host.port), "-o", "BatchMode=yes",
                           "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                           f"root@{host.address}", command], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def query(lab, name: str, fields: str) -> list[list[str]]:
    rc, out = ssh(lab, name, f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits")
    assert rc == 0, out
    return [line.split(", ") for line in out.splitlines()]


# --------------------------------------------------------------------------------------------------- faults

def test_a_healthy_host_answers_every_query_the_suite_makes(lab, gpu_host):
    name, _ = gpu_host
    rc, out = ssh(lab, name, "nvidia-smi -L")
    assert rc == 0 and len(out.splitlines()) == 8 and all(LIST_LINE.fullmatch(line) for line in out.splitlines())
    rows = query(lab, name, "pcie.link.width.current,pcie.link.width.max,clocks_event_reasons.hw_slowdown,"
                            "ecc.errors.uncorrected.volatile.total,remapped_rows.pending,fabric.state")
    # the H100 capture's values (x16 of x16, no slowdown, no errors, fabric Completed once fabric manager ran)
    assert rows == [["16", "16", "Not Active", "0", "No", "Completed"]] * 8
    rc, out = ssh(lab, name, "nvidia-smi nvlink -s")
    assert rc == 0 and out.splitlines()[1:len(NVLINK_H100)] == NVLINK_H100[1:]
    rc, out = ssh(lab, name, "nvidia-smi -q -x")
    assert rc == 0 and out.count("<gpu id=") == 8 and "<current_link_width>16x</current_link_width>" in out


FAULT_CASES = [
    ("ecc-uncorrectable 2", "ecc.errors.uncorrected.volatile.total", {2: "1"}, "0"),
    ("row-remap-pending 1", "remapped_rows.pending", {1: "Yes"}, "No"),
    ("throttle 3", "clocks_event_reasons.hw_slowdown", {3: "Active"}, "Not Active"),
    ("pcie-x8 0", "pcie.link.width.current", {0: "8"}, "16"),
]


@pytest.mark.parametrize("fault,field,faulty,healthy", FAULT_CASES)
def test_each_fault_shows_over_ssh_on_its_gpu_only(lab, gpu_host, fault, field, faulty, healthy):
    name, _ = gpu_host
    with lab_faults.injected(lab.host(name), fault):
        values = [row[0] for row in query(lab, name, field)]
    assert values == [faulty.get(i, healthy) for i in range(8)]
    assert [row[0] for row in query(lab, name, field)] == [healthy] * 8  # cleared again


def test_gpu_missing_nvlink_down_and_a_gpu_process_over_ssh(lab, gpu_host):
    name, _ = gpu_host
    host = lab.host(name)
    with lab_faults.injected(host, "gpu-missing", "nvlink-down 1", "gpu-process 4"):
        rc, out = ssh(lab, name, "nvidia-smi -L")
        assert rc == 0 and len(out.splitlines()) == 7
        assert {row[0] for row in query(lab, name, "count")} == {"7"}
        rc, out = ssh(lab, name, "nvidia-smi nvlink -s")
        blocks = out.splitlines()
        assert blocks[len(NVLINK_H100) + 1] == NVLINK_INACTIVE[1]
        rc, out = ssh(lab, name, "nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                                 "--format=csv,noheader,nounits")
        assert (rc, out) == (0, "4242, python3, 1024\n")
    assert ssh(lab, name, "nvidia-smi --query-compute-apps=pid --format=csv,noheader")[1] == ""


def test_driver_mismatch_over_ssh_and_faults_set_through_ssh(lab, gpu_host):
    name, _ = gpu_host
    rc, out = ssh(lab, name, lab_faults.write_command(["driver-mismatch"]))
    assert rc == 0, out
    try:
        assert lab_faults.get_faults(lab.host(name)) == [lab_faults.Fault("driver-mismatch")]
        rc, out = ssh(lab, name, "nvidia-smi --query-gpu=name --format=csv,noheader")
        assert rc == 18 and out.splitlines()[0] == MISMATCH
        assert ssh(lab, name, "nvidia-smi -q -x")[0] == 18
    finally:
        assert ssh(lab, name, lab_faults.write_command([]))[0] == 0
    assert ssh(lab, name, "nvidia-smi -L")[0] == 0


# --------------------------------------------------------------------------------------------- containers

def docker(lab, name: str, args: str) -> tuple[int, str]:
    proc = subprocess.run(["docker", "exec", lab.host(name).container_id, "sh", "-c", f"docker {args} 2>&1"],
                          capture_output=True, text=True, timeout=180)
    return proc.returncode, proc.stdout


def test_gpu_containers_fail_before_the_toolkit_is_configured(lab, gpu_host):
    name, image = gpu_host
    assert on_host(lab, name, "command -v nvidia-container-runtime-hook || echo none").strip() == "none"
    rc, out = docker(lab, name, f"run --rm --gpus all {image} nvidia-smi -L")
    # the daemon's refusal; the docker CLI may add its own line after it ("error waiting for container: context
    # canceled", a race of --rm with a container that never started), which says nothing about the GPUs
    assert (rc, out.strip().splitlines()[0]) == (125, NO_GPU_DRIVER)
    # the image itself has no nvidia-smi: what a GPU container shows comes from the hook
    rc, out = docker(lab, name, f"run --rm {image} nvidia-smi -L")
    assert rc != 0 and "executable file not found" in out


def test_a_provisioned_host_runs_gpu_containers(lab, gpu_host, reports_env):
    name, image = gpu_host
    invoke("provision", "--inventory", str(lab.inventory), "--host", name, env=reports_env)
    host_list = ssh(lab, name, "nvidia-smi -L")[1]
    rc, out = docker(lab, name, f"run --rm --gpus all {image} nvidia-smi -L")
    assert (rc, out) == (0, host_list)  # every GPU, with the host's UUIDs
    rc, out = docker(lab, name, f"run --rm --gpus '\"device=1,3\"' {image} nvidia-smi "
                                "--query-gpu=index,pci.bus_id --format=csv,noheader")
    buses = [row[0] for row in query(lab, name, "pci.bus_id")]
    assert (rc, out.splitlines()) == (0, [f"0, {buses[1]}", f"1, {buses[3]}"])
    # the configured "nvidia" runtime, as `docker run --runtime nvidia` uses it
    rc, out = docker(lab, name, f"run --rm --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all {image} nvidia-smi -L")
    assert (rc, out) == (0, host_list)
    # a container without GPUs is untouched
    assert docker(lab, name, f"run --rm {image} python3 -c 'import os; print(os.path.exists(\"/usr/bin/nvidia-smi\"))'"
                  ) == (0, "False\n")


def test_gpu_containers_see_the_hosts_faults_and_fail_on_a_driver_mismatch(lab, gpu_host):
    name, image = gpu_host
    host = lab.host(name)
    with lab_faults.injected(host, "gpu-missing", "throttle 2"):
        rc, out = docker(lab, name, f"run --rm --gpus all {image} nvidia-smi --query-gpu="
                                    "clocks_event_reasons.hw_slowdown --format=csv,noheader")
        assert (rc, out.splitlines()) == (0, ["Not Active", "Not Active", "Active"] + ["Not Active"] * 4)
    with lab_faults.injected(host, "driver-mismatch"):
        rc, out = docker(lab, name, f"run --rm --gpus all {image} nvidia-smi -L")
        assert rc == 125 and "error running hook #0" in out and f"{CLI_MISMATCH}: unknown." in out
    rc, out = docker(lab, name, f"run --rm --gpus all {image} nvidia-smi -L")
    assert rc == 0 and len(out.splitlines()) == 8
