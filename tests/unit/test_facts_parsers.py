"""Fact parsers on captured command output (pyinfra style): real nvidia-smi and lspci outputs; the base facts
document from a facts script's output as the composer lays it out."""

import base64
import shlex

import pytest

from gpuprov.facts.base import REGISTRY
from gpuprov.facts.gather import DEFAULT, facts_command, parse_facts
from gpuprov.facts.parsers import (
    parse_lspci,
    parse_nvidia_smi_xml,
    parse_nvrm,
    parse_os_release,
    parse_packages,
    parse_secure_boot,
    parse_services,
)
from gpuprov.facts.providers import FactArgs, split_output


def test_nvidia_smi_failure_is_a_fact():
    xml = parse_nvidia_smi_xml("Failed to initialize NVML: Driver/library version mismatch\n"
                               "NVML library version: 570.148\n", 18)
    assert xml == {"error": "Failed to initialize NVML: Driver/library version mismatch; NVML library version: 570.148"}
    assert parse_nvidia_smi_xml("", 124) == {"error": "exit code 124"}


def test_nvidia_smi_missing_is_null():
    assert parse_nvidia_smi_xml("", 127) is None


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


def _output(answers: dict[str, tuple[str, int]] | None = None, complete: bool = True) -> str:
    """A base facts script's output as the composer lays it out: each command's (output, exit status) by the name
    of a fact that reads it; a command not given answers nothing with 127 (its tool is missing)."""
    answers = answers or {}
    parts = ["@@gpuprov-facts:" + " ".join(DEFAULT)]
    for readers in REGISTRY.commands(DEFAULT, FactArgs()).values():
        text, rc = next((answers[name] for name in readers if name in answers), ("", 127))
        parts.append(f"\n@@gpuprov:{' '.join(readers)}\n{text}\n@@gpuprov-rc:{rc}")
    if complete:
        parts.append("\n@@gpuprov:end")
    return "\n".join(parts) + "\n"


def test_bare_host_facts_are_nulls_not_failures():
    text = _output({"os": ('ID=debian\nVERSION_ID="12"', 0), "kernel": ("6.1.0-18-amd64", 0), "arch": ("x86_64", 0),
                    "cpus": ("2", 0), "mem_total_mib": ("MemTotal:       24576000 kB", 0),
                    "secure_boot": ("bios", 0), "kernel_headers": ("no", 0)})
    facts = parse_facts("gpu01", text)
    assert facts["host"] == "gpu01"
    assert facts["os"]["key"] == "debian-12"
    assert (facts["kernel"], facts["arch"], facts["cpus"]) == ("6.1.0-18-amd64", "x86_64", 2)
    assert facts["mem_total_mib"] == 24000
    assert facts["nvidia_smi"] is None and facts["docker"] is None and facts["fabricmanager"] is None
    assert facts["container_toolkit"] is None and facts["loaded_driver_version"] is None
    assert facts["kernel_headers"] is False and facts["secure_boot"] is False
    assert facts["complete"] is True
    assert facts["notices"] == []  # missing tools are facts, not failures


def test_managed_files_round_trip_and_docker_runtimes():
    daemon = '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}'
    encoded = base64.b64encode(daemon.encode()).decode()
    text = _output({"dockerd_version": ("Docker version 26.1.5+dfsg1, build a72d7cd", 0),
                    "services": ("Id=docker.service\nLoadState=loaded\nUnitFileState=enabled\nActiveState=active", 0),
                    "files": (f"@@file /etc/docker/daemon.json\npresent\n{encoded}\n"
                              "@@file /etc/apt/preferences.d/gpuprov-nvidia\n", 0)})
    facts = parse_facts("gpu01", text)
    assert facts["files"] == {"/etc/docker/daemon.json": daemon, "/etc/apt/preferences.d/gpuprov-nvidia": None}
    assert facts["docker"] == {"version": "26.1.5", "active": True, "daemon_json": {"runtimes": {
        "nvidia": {"path": "nvidia-container-runtime"}}}, "runtimes": ["nvidia"], "live_runtimes": None,
        "ctk_daemon_json": None}


def test_running_daemon_runtimes_and_what_nvidia_ctk_would_write():
    written = '{"log-driver": "json-file", "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}'
    text = _output({"dockerd_version": ("Docker version 20.10.24+dfsg1, build 297e128", 0),
                    # `docker info --format '{{json .Runtimes}}'` as Docker 20.10 prints it
                    "docker_runtimes": ('{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"}}', 0),
                    "ctk_daemon_json": (base64.b64encode(written.encode()).decode(), 0)})
    docker = parse_facts("gpu01", text)["docker"]
    assert docker["live_runtimes"] == ["io.containerd.runc.v2", "runc"]
    assert docker["ctk_daemon_json"] == written


def test_gpu_work_on_the_host(fixture_text):
    text = _output({
        # a real T4 capture: Xorg (type G) and python (type C, 1005 MiB) on GPU 0
        "gpu_processes": (fixture_text("nvidia-smi-q-xml/t4_nvidia-smi-q-x_515.105.01.xml"), 0),
        "gpu_device_users": ("12345 python3\n999 nvidia-persistenced", 0),
        "containers": ("3f2a1b\ttrainer\tnvcr.io/nvidia/pytorch:25.01-py3", 0),
        "slurm_jobs": ("4242 alice train-llm", 0),
        "reboot_required": ("yes", 0), "reboot_required_pkgs": ("linux-image-6.1.0-28-amd64\nlibc6", 0),
        "gpuprov_reboot_pending": ("driver 570.148.08", 0)})
    facts = parse_facts("gpu01", text)
    assert facts["gpu_processes"] == [{"pid": 5762, "process_name": "python", "used_memory_mib": 1005}]
    assert facts["nvidia_smi"]["gpus"][0]["name"] == "Tesla T4"   # one nvidia-smi run answers both
    assert facts["gpu_device_users"] == [{"pid": 12345, "process_name": "python3"},
                                         {"pid": 999, "process_name": "nvidia-persistenced"}]
    assert facts["containers"] == [{"id": "3f2a1b", "name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}]
    assert facts["slurm_jobs"] == ["4242 alice train-llm"]
    assert facts["reboot_required"] is True
    assert facts["reboot_required_pkgs"] == ["linux-image-6.1.0-28-amd64", "libc6"]
    assert facts["gpuprov_reboot_pending"] == ["driver 570.148.08"]


def test_tools_that_cannot_answer_are_unknown_not_idle(fixture_text):
    failed = "Failed to initialize NVML: Driver/library version mismatch"
    facts = parse_facts("gpu01", _output({"gpu_processes": (failed, 18), "containers": ("", 1)}))
    assert facts["gpu_processes"] is None and facts["containers"] is None and facts["slurm_jobs"] is None
    assert facts["nvidia_smi"] == {"error": failed}
    assert facts["notices"] == [f"gpu_processes: nvidia-smi -q -x failed: {failed}",
                                "containers: docker ps exited 1"]  # squeue missing (127): a fact, no notice
    assert parse_facts("gpu01", _output({"gpu_processes": ("", 0)}))["gpu_processes"] is None   # no XML: unknown
    idle = parse_facts("gpu01", _output({
        "gpu_processes": (fixture_text("nvidia-smi-q-xml/a100-sxm4-80gb_nvidia-smi-q-x_535.54.03.xml"), 0),
        "containers": ("", 0)}))
    assert idle["gpu_processes"] == [] and idle["containers"] == []


def test_truncated_output_is_incomplete():
    assert parse_facts("gpu01", _output({"kernel": ("6.1.0", 0)}, complete=False))["complete"] is False


def test_split_output_reads_each_command_once_with_its_status():
    output = ("@@gpuprov-facts:a b c\n\n@@gpuprov:a b\none\ntwo\n\n@@gpuprov-rc:0\n"
              "\n@@gpuprov:c\n\n@@gpuprov-rc:127\n\n@@gpuprov:d\npartial")
    answers, complete = split_output(output)
    assert answers == {"a": ("one\ntwo\n", 0), "b": ("one\ntwo\n", 0), "c": ("", 127), "d": ("partial", None)}
    assert complete is False


def test_facts_command_quotes_every_argument():
    command = facts_command(("/etc/x y", "/tmp/$(touch /tmp/owned)"))
    words = shlex.split(command)
    assert words[:2] == ["sh", "-c"]
    assert words[3:] == ["gpuprov-facts"]
    assert "for f in '/etc/x y' '/tmp/$(touch /tmp/owned)'; do" in words[2]


def test_loaded_driver_falls_back_to_a_working_nvidia_smi(fixture_text):
    smi = fixture_text("nvidia-smi-q-xml/t4_nvidia-smi-q-x_515.105.01.xml")
    facts = parse_facts("gpu01", _output({"nvidia_smi": (smi, 0), "nvrm": ("", 1)}))
    assert facts["loaded_driver_version"] == "515.105.01"
    broken = _output({"nvidia_smi": ("Failed to initialize NVML: Driver/library version mismatch", 18)})
    assert parse_facts("gpu01", broken)["loaded_driver_version"] is None
