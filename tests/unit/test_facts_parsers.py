"""Fact parsers on captured command output (pyinfra style): real nvidia-smi and lspci outputs."""

import base64
import shlex

import pytest

from gpuprov.facts.gather import facts_command
from gpuprov.facts.parsers import (
    parse_facts,
    parse_lspci,
    parse_nvidia_smi,
    parse_nvrm,
    parse_os_release,
    parse_packages,
    parse_secure_boot,
    parse_services,
    split_sections,
)

SMI = "nvidia-smi-q/"


@pytest.mark.parametrize(("name", "driver", "cuda", "count", "gpu_name", "mem", "persistence", "ecc"), [
    ("h100-sxm5-80gb-hgx8_nvidia-smi-q_535.183.01.txt", "535.183.01", "12.2", 8, "NVIDIA H100 80GB HBM3",
     81559, True, True),
    ("h100-sxm5-80gb-hgx8_nvidia-smi-q_535.161.08_hw-slowdown-power-brake-active.txt", "535.161.08", "12.2", 8,
     "NVIDIA H100 80GB HBM3", 81559, True, True),
    ("h100-sxm5-80gb_nvidia-smi-q_590.48.01_load.txt", "590.48.01", "13.1", 1, "NVIDIA H100 80GB HBM3",
     81559, True, True),
    ("h200-sxm-141gb_nvidia-smi-q_590.48.01_idle.txt", "590.48.01", "13.1", 1, "NVIDIA H200", 143771, True, True),
    ("l40s_nvidia-smi-q_595.80_idle.txt", "595.80", "13.2", 1, "NVIDIA L40S", 46068, False, True),
    ("a10_nvidia-smi-q_535.129.03.txt", "535.129.03", "12.2", 1, "NVIDIA A10", 23028, True, True),
    ("rtx-4090-x8_nvidia-smi-q_535.154.05_sw-power-cap-active.txt", "535.154.05", "12.2", 8,
     "NVIDIA GeForce RTX 4090", 24564, True, False),
])
def test_nvidia_smi_q_fixtures(fixture_text, name, driver, cuda, count, gpu_name, mem, persistence, ecc):
    smi = parse_nvidia_smi(fixture_text(SMI + name) + "@@rc=0\n")
    assert smi["driver_version"] == driver
    assert smi["cuda_version"] == cuda
    assert len(smi["gpus"]) == count
    first = smi["gpus"][0]
    assert first["name"] == gpu_name
    assert first["memory_total_mib"] == mem
    assert first["persistence_mode"] is persistence
    assert first["ecc_mode"] is ecc
    assert first["uuid"].startswith("GPU-")
    assert [gpu["index"] for gpu in smi["gpus"]] == list(range(count))


def test_nvidia_smi_hgx_bus_ids_are_distinct(fixture_text):
    smi = parse_nvidia_smi(fixture_text(SMI + "h100-sxm5-80gb-hgx8_nvidia-smi-q_535.183.01.txt"))
    assert len({gpu["bus_id"] for gpu in smi["gpus"]}) == 8
    assert smi["gpus"][0]["bus_id"] == "00000000:53:00.0"


def test_nvidia_smi_failure_is_a_fact():
    smi = parse_nvidia_smi("Failed to initialize NVML: Driver/library version mismatch\n"
                           "NVML library version: 570.148\n@@rc=18\n")
    assert smi == {"error": "Failed to initialize NVML: Driver/library version mismatch; NVML library version: 570.148"}


def test_nvidia_smi_missing_is_null():
    assert parse_nvidia_smi("") is None


def test_lspci_a100_hgx_counts_gpus_and_nvswitches(fixture_text):
    gpus, nvswitches = parse_lspci(fixture_text("lspci/a100-sxm4-80gb-x8-azure-vm_lspci-nn.txt"))
    assert len(gpus) == 8
    assert nvswitches == 6
    assert {gpu["device_id"] for gpu in gpus} == {"20b2"}
    assert all(gpu["model"] for gpu in gpus)
    assert gpus[0]["slot"] == "0001:00:00.0"


def test_lspci_a10_ignores_other_vendors(fixture_text):
    gpus, nvswitches = parse_lspci(fixture_text("lspci/a10-vm_lspci-nn.txt"))
    assert [gpu["device_id"] for gpu in gpus] == ["2236"]
    assert gpus[0]["model"] is not None
    assert nvswitches == 0


def test_lspci_unknown_nvidia_device_has_no_model():
    gpus, _ = parse_lspci("0000:17:00.0 3D controller [0302]: NVIDIA Corporation Device [10de:ffff] (rev a1)")
    assert gpus == [{"slot": "0000:17:00.0", "device_id": "ffff", "description": "NVIDIA Corporation Device",
                     "model": None}]


@pytest.mark.parametrize(("text", "key", "family"), [
    ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm',
     "debian-12", "debian"),
    ('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\nVERSION_CODENAME=jammy', "ubuntu-22.04", "debian"),
    ('ID=ubuntu\nVERSION_ID="24.04"', "ubuntu-24.04", "debian"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"', "rocky-9", "rhel"),
    ('ID="rhel"\nVERSION_ID="9.2"', "rhel-9", "rhel"),
    ('ID=ubuntu\nVERSION_ID="20.04"', None, "debian"),
    ('ID=arch', None, None),
    ("", None, None),
])
def test_os_release(text, key, family):
    parsed = parse_os_release(text)
    assert parsed["key"] == key
    assert parsed["family"] == family


def test_nvrm_proprietary_and_open():
    prop = parse_nvrm("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n")
    assert prop == {"version": "535.183.01", "open": False}
    opened = parse_nvrm("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.148.08  Release Build  "
                        "(dvs-builder@U16-I3-B03-4-3)  Fri Apr 18 2025\nGCC version:  gcc version 12.2.0\n")
    assert opened == {"version": "570.148.08", "open": True}
    assert parse_nvrm("") is None


def test_packages_dpkg_and_rpm():
    dpkg = "hi \tnvidia-open-570\t570.148.08-1\nrc \tnvidia-driver-550\t550.1-1\nii \tlibnccl2\t2.26.5-1+cuda12.9\n"
    assert parse_packages(dpkg) == ({"nvidia-open-570": "570.148.08-1", "libnccl2": "2.26.5-1+cuda12.9"},
                                    ["nvidia-open-570"])
    rpm = "ii \tnvidia-driver\t3:570.148.08-1.el9\nii \tcuda-toolkit-12-8\t(none):12.8.1-1\n"
    assert parse_packages(rpm) == ({"nvidia-driver": "3:570.148.08-1.el9", "cuda-toolkit-12-8": "12.8.1-1"}, [])


def test_secure_boot_and_services():
    assert parse_secure_boot("bios") is False
    assert parse_secure_boot("  1") is True
    assert parse_secure_boot("  0") is False
    assert parse_secure_boot("unknown") is None
    services = parse_services(
        "Id=docker.service\nLoadState=loaded\nUnitFileState=enabled\nActiveState=active\n\n"
        "Id=nvidia-fabricmanager.service\nLoadState=not-found\nUnitFileState=\nActiveState=inactive\n\n"
        "Id=nvidia-dcgm.service\nLoadState=loaded\nUnitFileState=disabled\nActiveState=inactive\n")
    assert services["docker"] == {"exists": True, "enabled": True, "active": True}
    assert services["nvidia-fabricmanager"]["exists"] is False
    assert services["nvidia-dcgm"] == {"exists": True, "enabled": False, "active": False}


def _output(**sections: str) -> str:
    return "".join(f"\n@@gpuprov:{name}\n{body}\n" for name, body in sections.items())


def test_bare_host_facts_are_nulls_not_failures():
    text = _output(**{"os-release": 'ID=debian\nVERSION_ID="12"', "uname": "6.1.0-18-amd64\nx86_64", "cpus": "2",
                      "meminfo": "MemTotal:       24576000 kB", "lspci": "", "nvidia-smi": "", "nvrm": "",
                      "modules": "", "packages": "", "secure-boot": "bios",
                      "kernel-headers": "no", "docker": "", "ctk": "", "services": "", "end": ""})
    facts = parse_facts("gpu01", text)
    assert facts["os"]["key"] == "debian-12"
    assert facts["mem_total_mib"] == 24000
    assert facts["nvidia_smi"] is None and facts["docker"] is None and facts["fabricmanager"] is None
    assert facts["container_toolkit"] is None and facts["loaded_driver_version"] is None
    assert facts["kernel_headers"] is False and facts["secure_boot"] is False
    assert facts["complete"] is True


def test_managed_files_round_trip_and_docker_runtimes():
    daemon = '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}'
    encoded = base64.b64encode(daemon.encode()).decode()
    text = _output(**{"docker": "Docker version 26.1.5+dfsg1, build a72d7cd",
                      "services": "Id=docker.service\nLoadState=loaded\nUnitFileState=enabled\nActiveState=active",
                      "file /etc/docker/daemon.json": f"present\n{encoded}",
                      "file /etc/apt/preferences.d/gpuprov-nvidia": "", "end": ""})
    facts = parse_facts("gpu01", text)
    assert facts["files"] == {"/etc/docker/daemon.json": daemon, "/etc/apt/preferences.d/gpuprov-nvidia": None}
    assert facts["docker"] == {"version": "26.1.5", "active": True, "daemon_json": {"runtimes": {
        "nvidia": {"path": "nvidia-container-runtime"}}}, "runtimes": ["nvidia"], "live_runtimes": None,
        "ctk_daemon_json": None}


def test_running_daemon_runtimes_and_what_nvidia_ctk_would_write():
    written = '{"log-driver": "json-file", "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}'
    text = _output(**{"docker": "Docker version 20.10.24+dfsg1, build 297e128",
                      # `docker info --format '{{json .Runtimes}}'` as Docker 20.10 prints it
                      "docker-runtimes": '{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"}}',
                      "ctk-daemon-json": base64.b64encode(written.encode()).decode(), "end": ""})
    docker = parse_facts("gpu01", text)["docker"]
    assert docker["live_runtimes"] == ["io.containerd.runc.v2", "runc"]
    assert docker["ctk_daemon_json"] == written


def test_gpu_work_on_the_host():
    text = _output(**{
        # nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits
        "gpu-processes": "12345, /usr/bin/python3, 40960\n23456, python, 512\n@@rc=0",
        "device-users": "12345 python3\n999 nvidia-persistenced",
        "containers": "3f2a1b\ttrainer\tnvcr.io/nvidia/pytorch:25.01-py3\n@@rc=0",
        "slurm": "4242 alice train-llm\n@@rc=0",
        "reboot-required": "yes", "reboot-required-pkgs": "linux-image-6.1.0-28-amd64\nlibc6",
        "gpuprov-reboot-pending": "driver 570.148.08", "end": ""})
    facts = parse_facts("gpu01", text)
    assert facts["gpu_processes"] == [
        {"pid": 12345, "process_name": "/usr/bin/python3", "used_memory_mib": 40960},
        {"pid": 23456, "process_name": "python", "used_memory_mib": 512}]
    assert facts["gpu_device_users"] == [{"pid": 12345, "process_name": "python3"},
                                         {"pid": 999, "process_name": "nvidia-persistenced"}]
    assert facts["containers"] == [{"id": "3f2a1b", "name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}]
    assert facts["slurm_jobs"] == ["4242 alice train-llm"]
    assert facts["reboot_required_pkgs"] == ["linux-image-6.1.0-28-amd64", "libc6"]
    assert facts["gpuprov_reboot_pending"] == ["driver 570.148.08"]


def test_tools_that_cannot_answer_are_unknown_not_idle():
    facts = parse_facts("gpu01", _output(**{"gpu-processes": "@@rc=9", "containers": "@@rc=1", "slurm": "",
                                            "end": ""}))
    assert facts["gpu_processes"] is None and facts["containers"] is None and facts["slurm_jobs"] is None
    idle = parse_facts("gpu01", _output(**{"gpu-processes": "@@rc=0", "containers": "@@rc=0", "end": ""}))
    assert idle["gpu_processes"] == [] and idle["containers"] == []


def test_truncated_output_is_incomplete():
    assert parse_facts("gpu01", _output(uname="6.1.0\nx86_64"))["complete"] is False


def test_split_sections_keeps_order_and_bodies():
    assert split_sections("\n@@gpuprov:a\none\ntwo\n\n@@gpuprov:b\n\n") == {"a": "one\ntwo", "b": ""}


def test_facts_command_quotes_every_argument():
    command = facts_command(("/etc/x y", "/tmp/$(touch /tmp/owned)"))
    words = shlex.split(command)
    assert words[:2] == ["sh", "-c"]
    assert words[3:] == ["gpuprov-facts", "/etc/x y", "/tmp/$(touch /tmp/owned)"]


def test_loaded_driver_falls_back_to_a_working_nvidia_smi(fixture_text):
    smi = fixture_text(SMI + "l40s_nvidia-smi-q_595.80_idle.txt") + "@@rc=0"
    facts = parse_facts("gpu01", _output(**{"nvidia-smi": smi, "nvrm": "", "end": ""}))
    assert facts["loaded_driver_version"] == "595.80"
    broken = _output(**{"nvidia-smi": "Failed to initialize NVML: Driver/library version mismatch\n@@rc=18",
                        "end": ""})
    assert parse_facts("gpu01", broken)["loaded_driver_version"] is None
