"""Fact providers and their composer: one script and one round trip per gather whatever a job asks for, shared
commands run once, a failed provider costs its own fact only (unknown + notice), harden's facts through the same
composer, and nvidia-smi read as `-q -x` (real captures: A100, T4; H100, H200 and L40S through the lab stand-in,
which answers from their real `--query-gpu` captures)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.local_host import LocalConn

from gpuprov.core.connection import Result
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.facts import schema
from gpuprov.facts.base import REGISTRY as BASE
from gpuprov.facts.gather import DEFAULT, facts_command, facts_script, gather, parse_facts
from gpuprov.facts.parsers import parse_nvidia_smi_xml
from gpuprov.facts.providers import MISSING, Derived, NoAnswer, Provider, Registry
from gpuprov.harden import facts as harden_facts
from gpuprov.lab import standins
from gpuprov.lab.smi_answers import gpu_profiles_table

HOST = SimpleNamespace(name="gpu01", user="root", address="127.0.0.1")


def this_machine(cut_at: int | None = None) -> LocalConn:
    """This machine as the host: its facts script runs here; `cut_at` cuts each command's stdout there."""
    def cut(command: str, stdin: str | None) -> Result:
        proc = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=120,
                              check=False)
        return Result(command, proc.returncode, proc.stdout[:cut_at], proc.stderr, 0.0)

    return LocalConn(HOST, answer=None if cut_at is None else cut)


def os_release_id() -> str:
    for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
        if line.startswith("ID="):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no ID= in /etc/os-release")


# ---- composition: one script, one round trip -------------------------------------------------------------------


def test_a_gather_is_one_round_trip_whatever_it_asks(tmp_path):
    managed = tmp_path / "managed.conf"
    managed.write_text("Key value\n")
    conn = this_machine()
    facts = gather(conn, (str(managed),))
    assert conn.commands == ["sh -s"] and conn.sudo == [True]
    assert facts["complete"] is True and facts["host"] == "gpu01"
    assert (facts["kernel"], facts["arch"]) == (os.uname().release, os.uname().machine)
    assert facts["os"]["id"] == os_release_id()
    assert facts["files"] == {str(managed): "Key value\n"}
    assert set(facts) == {"host", *DEFAULT, "complete", "notices"}

    few = gather(conn, facts=("kernel", "arch"))
    assert len(conn.commands) == 2
    assert few == {"host": "gpu01", "kernel": os.uname().release, "arch": os.uname().machine, "complete": True,
                   "notices": []}
    assert "nvidia-smi" not in conn.stdins[1] and "dpkg-query" not in conn.stdins[1]


def test_facts_that_read_one_command_share_its_run():
    script = facts_script((), ("pci_gpus", "nvswitch_count", "packages", "held"))
    assert script.count("lspci -D -nn") == 1 and script.count("dpkg-query -W") == 1
    assert "@@gpuprov:%s\\n' 'pci_gpus nvswitch_count'" in script


def test_a_derived_fact_gathers_what_it_needs_and_reports_only_itself():
    script = facts_script((), ("loaded_driver_version",))
    assert "/proc/driver/nvidia/version" in script and "nvidia-smi -q -x" in script
    output = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=120).stdout
    assert set(parse_facts("gpu01", output)) == {"host", "loaded_driver_version", "complete", "notices"}


def test_facts_command_runs_inside_a_batch_whose_stdin_is_the_batch():
    """apply appends facts_command to its batch (`sh -s` reading the batch): the facts must not read stdin."""
    command = facts_command(("/etc/hostname",), ("files", "kernel"))
    proc = subprocess.run(["sh", "-s"], input=f"{command}\necho after\n", capture_output=True, text=True,
                          timeout=120)
    facts = parse_facts("gpu01", proc.stdout)
    assert facts["files"] == {"/etc/hostname": Path("/etc/hostname").read_text()}
    assert facts["kernel"] == os.uname().release and facts["complete"] is True
    assert proc.stdout.rstrip().endswith("after")


def test_managed_file_paths_are_data_never_code(tmp_path):
    hostile = f"{tmp_path}/$(touch {tmp_path}/owned)"
    spaced = f"{tmp_path}/x y"
    Path(spaced).write_text("spaced\n")
    output = subprocess.run(["sh", "-s"], input=facts_script((hostile, spaced), ("files",)), capture_output=True,
                            text=True, timeout=120).stdout
    assert parse_facts("gpu01", output)["files"] == {hostile: None, spaced: "spaced\n"}
    assert not (tmp_path / "owned").exists()
    with pytest.raises(InputError, match="newline"):
        facts_script(("/etc/a\nb",), ("files",))


def test_an_unknown_fact_name_is_bad_input():
    with pytest.raises(InputError, match="no fact named 'gpu_temperature'"):
        facts_script((), ("kernel", "gpu_temperature"))


# ---- failures stay in their provider ---------------------------------------------------------------------------


def _strict_int(text: str, rc: int) -> int:
    if rc != 0:
        raise NoAnswer(f"the command exited {rc}")
    return int(text)


def test_a_failed_provider_yields_its_unknown_value_and_a_notice_and_the_others_answer():
    registry = Registry("test facts")
    registry.register(Provider("good", "echo 42", _strict_int, -1))
    registry.register(Provider("exits", "echo partial; exit 3", _strict_int, -1))
    registry.register(Provider("garbage", "echo not-a-number", _strict_int, -1))
    registry.register(Provider("after", "echo still here", lambda text, rc: text.strip()))
    registry.register(Provider("absent", "need gpuprov-no-such-tool; gpuprov-no-such-tool",
                               lambda text, rc: None if rc == MISSING else text))
    registry.register(Derived("double", ("good",), lambda good: 2 * good))
    registry.register(Derived("ratio", ("garbage",), lambda garbage: 10 // (garbage + 1)))
    output = subprocess.run(["sh", "-s"], input=registry.script(registry.default), capture_output=True, text=True,
                            timeout=60).stdout
    facts = registry.parse(output)
    assert facts == {
        "good": 42, "exits": -1, "garbage": -1, "after": "still here", "absent": None, "double": 84, "ratio": None,
        "complete": True,
        "notices": ["exits: the command exited 3",
                    "garbage: unreadable output (ValueError: invalid literal for int() with base 10: "
                    "'not-a-number\\n')",
                    "ratio: cannot be derived (ZeroDivisionError: integer division or modulo by zero)"]}


def test_output_cut_off_leaves_the_rest_unknown_and_the_gather_fails_naming_the_host():
    script = facts_script((), ("kernel", "arch", "cpus"))
    output = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=60).stdout
    cut = output[: output.index("@@gpuprov:arch") + len("@@gpuprov:arch\n") + 2]
    facts = parse_facts("gpu01", cut)
    assert facts["kernel"] == os.uname().release
    assert facts["arch"] is None and facts["cpus"] is None and facts["complete"] is False
    assert facts["notices"] == ["arch: no answer (the script's output was cut off)",
                                "cpus: no answer (the script's output was cut off)"]
    conn = this_machine(cut_at=len(cut))
    with pytest.raises(GpuprovError, match="the facts script did not finish") as caught:
        gather(conn, facts=("kernel", "arch", "cpus"))
    assert caught.value.host == "gpu01" and caught.value.step == "facts"


def test_a_registry_refuses_duplicates_bad_names_and_missing_needs():
    registry = Registry("test facts")
    registry.register(Provider("one", "echo 1", lambda text, rc: text))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Provider("one", "echo 2", lambda text, rc: text))
    with pytest.raises(ValueError, match="must match"):
        registry.register(Provider("Bad Name", "true", lambda text, rc: text))
    with pytest.raises(ValueError, match="needs 'two', which is not registered"):
        registry.register(Derived("sum", ("one", "two"), lambda one, two: one + two))


# ---- a new fact source -------------------------------------------------------------------------------------------

# `scontrol show node NAME` as Slurm prints it (Slurm's documentation of scontrol's output, abridged to one node)
SCONTROL = ("NodeName=gpu01 Arch=x86_64 CoresPerSocket=32\n   CPUAlloc=0 CPUTot=64 CPULoad=0.01\n"
            "   Gres=gpu:h100:8\n   State=IDLE ThreadsPerCore=1\n")


def _scontrol_node(text: str, rc: int) -> dict[str, str] | None:
    if rc == MISSING:
        return None
    if rc != 0:
        raise NoAnswer(f"scontrol show node exited {rc}")
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def test_a_new_source_is_one_registered_provider_composed_with_the_base_facts(tmp_path):
    registry = Registry("slurm facts")
    registry.include(BASE, "kernel")
    registry.register(Provider("slurm_node", 'need scontrol; scontrol show node "$(hostname -s)"', _scontrol_node))
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(SCONTROL)}\n")
    fake.chmod(0o755)
    script = registry.script(registry.default).replace("PATH=/usr/local/sbin", f"PATH={tmp_path}:/usr/local/sbin")
    facts = registry.parse(subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                                          timeout=60).stdout)
    assert facts["kernel"] == os.uname().release
    assert facts["slurm_node"]["State"] == "IDLE" and facts["slurm_node"]["Gres"] == "gpu:h100:8"
    assert registry.parse(subprocess.run(["sh", "-s"], input=registry.script(["slurm_node"]), capture_output=True,
                                         text=True, timeout=60).stdout)["slurm_node"] is None  # no Slurm here


# ---- harden's facts through the same composer --------------------------------------------------------------------


def test_harden_shares_the_base_providers_and_gathers_in_one_round_trip(tmp_path):
    assert harden_facts.REGISTRY["os"] is BASE["os"] and harden_facts.REGISTRY["files"] is BASE["files"]
    managed = tmp_path / "sshd.conf"
    managed.write_text("Port 22\n")
    conn = this_machine()
    facts = harden_facts.gather(conn, (str(managed),))
    assert conn.sudo == [True]
    script = conn.stdins[0]
    assert script.count("cat /etc/os-release") == 1 and script.count("sshd -T 2>&1") == 1
    assert set(facts) == {*harden_facts.REGISTRY.default, "complete", "notices"}
    assert facts["complete"] is True and facts["os"]["id"] == os_release_id()
    assert facts["files"] == {str(managed): "Port 22\n"}
    assert facts["os"] == gather(this_machine(), facts=("os",))["os"]


def test_harden_quotes_the_inventory_user():
    script = harden_facts.facts_script("a b'c", ())
    assert "id -Gn -- 'a b'\"'\"'c' 2>/dev/null" in script
    with pytest.raises(InputError, match="newline"):
        harden_facts.facts_script("root\nid", ())


def test_harden_facts_command_is_one_quoted_sh_c():
    words = shlex.split(harden_facts.facts_command("ops", ("/etc/ssh/sshd_config.d/gpuprov.conf",)))
    assert words[:2] == ["sh", "-c"] and words[3:] == ["gpuprov-harden-facts"]
    assert "id -Gn -- ops" in words[2] and "for f in /etc/ssh/sshd_config.d/gpuprov.conf; do" in words[2]


# ---- nvidia-smi: `-q -x`, on the controller as in the suite ------------------------------------------------------

XML = "nvidia-smi-q-xml/"


@pytest.mark.parametrize(("name", "expected"), [
    # values read from the captures: <driver_version>, <cuda_version>, the <gpu id=...> element's product_name,
    # uuid, fb_memory_usage/total (the GPU's, not its MIG devices'), persistence_mode, ecc_mode/current_ecc
    ("a100-sxm4-80gb_nvidia-smi-q-x_535.54.03.xml",
     {"driver_version": "535.54.03", "cuda_version": "12.2", "gpus": [{
         "index": 0, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
         "bus_id": "00000000:01:00.0", "memory_total_mib": 81920, "persistence_mode": False, "ecc_mode": True}]}),
    ("t4_nvidia-smi-q-x_515.105.01.xml",
     {"driver_version": "515.105.01", "cuda_version": "11.7", "gpus": [{
         "index": 0, "name": "Tesla T4", "uuid": "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
         "bus_id": "00000000:00:1E.0", "memory_total_mib": 15360, "persistence_mode": False, "ecc_mode": True}]}),
])
def test_nvidia_smi_xml_captures(fixture_text, name, expected):
    assert parse_nvidia_smi_xml(fixture_text(XML + name), 0) == expected


def test_nvidia_smi_xml_with_a_warning_around_it_and_without_xml(fixture_text):
    text = fixture_text(XML + "t4_nvidia-smi-q-x_515.105.01.xml")
    warned = parse_nvidia_smi_xml("WARNING: infoROM is corrupted at gpu 0000:00:1E.0\n" + text, 0)
    assert warned["driver_version"] == "515.105.01" and len(warned["gpus"]) == 1
    assert parse_nvidia_smi_xml("No devices were found\n", 0) == {
        "error": "nvidia-smi -q -x printed no XML report: No devices were found"}
    assert "invalid XML" in parse_nvidia_smi_xml(text.replace("</gpu>", "</gpx>"), 0)["error"]


@pytest.fixture
def standin_root(tmp_path):
    """A fake root for the lab's simulated nvidia-smi: a driver installed and loaded, a profile chosen per test."""
    lib = tmp_path / "usr/lib/gpuprov-lab"
    lib.mkdir(parents=True)
    (lib / "driver-version").write_text("570.148.08\n")
    (lib / "driver-cuda-version").write_text("12.8\n")
    (lib / "gpu-profiles.json").write_text(json.dumps(gpu_profiles_table()))
    (tmp_path / "etc/gpuprov-lab").mkdir(parents=True)
    (tmp_path / "etc/hostname").write_text("gpuprov-lab-01\n")
    (tmp_path / "run/gpuprov-lab").mkdir(parents=True)
    (tmp_path / "run/gpuprov-lab/loaded-driver").write_text("570.148.08\n")
    return tmp_path


def standin_smi(root: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(root)}
    proc = subprocess.run([sys.executable, str(standins.FILES / "nvidia-smi"), *args], capture_output=True, text=True,
                          env=env, check=False, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize(("profile", "count", "name", "memory_mib"), [
    # name and memory.total as the real --query-gpu captures the stand-in answers from print them
    # (nvidia-smi-query-csv/: H100 "81559 MiB", H200 "143771 MiB", L40S "46068 MiB"; ECC Enabled on all three)
    ("hgx-h100", 8, "NVIDIA H100 80GB HBM3", 81559),
    ("h200", 8, "NVIDIA H200", 143771),
    ("l40s", 4, "NVIDIA L40S", 46068),
])
def test_facts_read_the_lab_standin_xml_as_the_real_captures(standin_root, profile, count, name, memory_mib):
    (standin_root / "etc/gpuprov-lab/profile").write_text(profile + "\n")
    rc, xml = standin_smi(standin_root, "-q", "-x")
    smi = parse_nvidia_smi_xml(xml, rc)
    assert (smi["driver_version"], smi["cuda_version"]) == ("570.148.08", "12.8")
    assert [gpu["name"] for gpu in smi["gpus"]] == [name] * count
    assert {gpu["memory_total_mib"] for gpu in smi["gpus"]} == {memory_mib}
    assert all(gpu["ecc_mode"] is True and gpu["uuid"].startswith("GPU-") for gpu in smi["gpus"])
    assert [gpu["index"] for gpu in smi["gpus"]] == list(range(count))


def test_facts_read_the_lab_standin_failure_as_an_error(standin_root):
    (standin_root / "etc/gpuprov-lab/profile").write_text("hgx-h100\n")
    (standin_root / "run/gpuprov-lab/loaded-driver").write_text("535.183.01\n")
    rc, text = standin_smi(standin_root, "-q", "-x")
    assert parse_nvidia_smi_xml(text, rc) == {
        "error": "Failed to initialize NVML: Driver/library version mismatch; NVML library version: 570.148"}


# ---- the schema -------------------------------------------------------------------------------------------------

# the top-level keys of docs/design.md's "Host facts" document
DESIGN_KEYS = {"host", "os", "kernel", "arch", "cpus", "mem_total_mib", "pci_gpus", "nvswitch_count", "nvidia_smi",
               "loaded_driver_version", "packages", "held", "nouveau_loaded", "nouveau_blacklisted", "secure_boot",
               "kernel_headers", "docker", "container_toolkit", "fabricmanager", "dcgm", "persistenced",
               "reboot_required", "reboot_required_pkgs", "gpuprov_reboot_pending", "gpu_processes",
               "gpu_device_users", "containers", "slurm_jobs", "dkms_status", "kernels_installed", "dpkg_interrupted",
               "cloud_init", "gathered_at"}


def test_the_schemas_name_every_fact_the_documents_hold():
    host_keys = set(typing.get_type_hints(schema.HostFacts))
    assert host_keys == {"host", *DEFAULT, "complete", "notices"}
    assert host_keys >= DESIGN_KEYS
    assert set(typing.get_type_hints(schema.HardenFacts)) == {*harden_facts.REGISTRY.default, "complete", "notices"}
    smi_gpu = set(typing.get_type_hints(schema.SmiGpu))
    assert smi_gpu == {"index", "name", "uuid", "bus_id", "memory_total_mib", "persistence_mode", "ecc_mode"}
