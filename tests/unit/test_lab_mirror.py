"""Lab mirror: stand-in package set, control files, simulated tools, and the signed flat repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.lab import KERNEL, mirror_stack
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.core.errors import GpuprovError
from gpuprov.facts.parsers import parse_nvidia_smi_xml
from gpuprov.lab import standins
from gpuprov.lab.smi_answers import gpu_profiles_table
from gpuprov.lab.standins import (
    PackageSpec,
    control_text,
    driver_cuda_version,
    lab_stacks,
    package_contents,
    standin_packages,
)
from gpuprov.stack import families

# ------------------------------------------------------------------------------------------ package set

def test_package_set_deduplicates_and_adds_kernel_headers():
    stacks = [mirror_stack("570", "570.148.08"), mirror_stack("570", "570.148.08", fabric=False),
              mirror_stack("595", "595.58.03", pinning=True, cuda="13.2.1", nccl="2.30.4")]
    specs = standin_packages(stacks, KERNEL)
    keys = [(s.name, s.version) for s in specs]
    assert len(keys) == len(set(keys))
    by_key = {(s.name, s.version): s for s in specs}
    assert by_key[("nvidia-open-570", "570.148.08-1")].role == "driver"
    assert by_key[("nvidia-open-570", "570.148.08-1")].upstream == "570.148.08"
    assert by_key[("nvidia-driver-pinning-595", "595.58.03-1")].role == "driver_pinning"
    assert by_key[("nvidia-open", "595.58.03-1")].role == "driver"
    assert by_key[("nvidia-fabricmanager", "595.58.03-1")].role == "fabricmanager"
    assert by_key[("libnccl2", "2.30.4-1+cuda12.8")].upstream == "2.30.4"
    assert by_key[("datacenter-gpu-manager-4-core", "1:4.2.3-1")].upstream == "4.2.3"
    assert ("libnccl2", "2.26.2-1+cuda12.8") in by_key
    headers = by_key[(f"linux-headers-{KERNEL}", "6.1.0-0gpuprovlab1")]
    assert headers.role == "kernel_headers" and headers.upstream == KERNEL


def test_cuda_compat_gets_its_own_role_and_driver_version():
    stack = mirror_stack("535", "535.274.02")
    stack["cuda"]["packages"].append({"name": "cuda-compat-12-8", "version": "570.124.06-1"})
    compat = next(s for s in standin_packages([stack], KERNEL) if s.name == "cuda-compat-12-8")
    assert compat.role == "cuda_compat" and compat.upstream == "570.124.06"
    files = package_contents(compat, {})
    assert "usr/local/cuda-12.8/compat/libcuda.so.570.124.06" in files.files
    assert files.links["usr/local/cuda-12.8/compat/libcuda.so.1"] == "libcuda.so.570.124.06"


@pytest.mark.parametrize("name,version", [("Bad_Name", "1.0-1"), ("nvidia-open-570", "not a version"),
                                          ("nvidia-open-570", "1.0; rm -rf /")])
def test_invalid_package_in_stack_is_refused(name, version):
    stack = mirror_stack("570", "570.148.08")
    stack["driver"]["packages"] = [{"name": name, "version": version}]
    with pytest.raises(GpuprovError, match="not a valid Debian name/version"):
        standin_packages([stack], KERNEL)


def test_kernel_without_version_is_refused():
    with pytest.raises(GpuprovError, match="kernel release"):
        standin_packages([], "custom_Kernel")


def test_lab_stacks_cover_every_profile_with_newest_and_two_older_branches():
    from gpuprov.catalog import lookup
    from gpuprov.lab.profiles import load_profiles

    for profile in load_profiles().values():
        mine = lab_stacks([profile])
        assert {s["os"] for s in mine} == {"debian-12"}
        assert {s["gpu"]["model"] for s in mine} == {lookup(profile.hardware["gpu"]).key}
        branches = [int(s["driver"]["branch"]) for s in mine]
        assert len(mine) == 3 and branches[0] == max(branches) and len(set(branches)) == 3
        assert all((s["fabricmanager"] is not None) == profile.hardware["nvswitch"] for s in mine)


# ------------------------------------------------------------------------------------- control, contents

@given(epoch=st.integers(min_value=0, max_value=9), upstream=st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}",
                                                                            fullmatch=True))
def test_control_keeps_exact_version_and_a_plain_package_has_no_depends(epoch, upstream):
    version = (f"{epoch}:" if epoch else "") + upstream + "-1"
    spec = PackageSpec("datacenter-gpu-manager-4-core", version, "dcgm", upstream)
    text = control_text(spec, "amd64", 3)
    fields = dict(line.split(": ", 1) for line in text.splitlines() if not line.startswith(" "))
    assert fields["Version"] == version
    assert fields["Maintainer"] == "gpuprov lab <lab@gpuprov.invalid>"
    assert fields["Description"] == "gpuprov lab stand-in, not NVIDIA software"
    assert "Depends" not in fields and "Pre-Depends" not in fields


def test_driver_branches_replace_each_other():
    text = control_text(PackageSpec("nvidia-open-570", "570.148.08-1", "driver", "570.148.08"), "amd64", 10)
    for field in ("Provides", "Conflicts", "Replaces"):
        assert f"{field}: gpuprov-lab-nvidia-driver\n" in text
    assert "Conflicts" not in control_text(PackageSpec("libnccl2", "2.26.2-1+cuda12.8", "nccl", "2.26.2"),
                                           "amd64", 1)


# NVIDIA's packages for one open-module 570 host, as a real `apt-get install cuda-runtime-12-9` listed them for
# removal (a host with nvidia-open-570 570.133.20 from NVIDIA's CUDA repository; tekumara/setup-nvidia docs).
REAL_570_OPEN = {"nvidia-open-570", "nvidia-driver-570-open", "nvidia-dkms-570-open", "nvidia-kernel-source-570-open",
                 "nvidia-kernel-common-570", "nvidia-firmware-570-570.133.20", "libnvidia-compute-570",
                 "nvidia-utils-570", "nvidia-compute-utils-570", "libnvidia-gl-570"}


def _closure(specs, root: str) -> dict[str, str]:
    """name -> version of everything `root` pulls through Depends (exact versions only)."""
    by_name = {s.name: s for s in specs}
    out, todo = {}, [root]
    while todo:
        spec = by_name[todo.pop()]
        out[spec.name] = spec.version
        for dep in spec.depends:
            name = dep.split(" ")[0]
            if name not in out and name in by_name:
                todo.append(name)
    return out


def test_open_570_metapackage_pulls_nvidias_real_package_names_at_its_version():
    specs = standin_packages([mirror_stack("570", "570.133.20")], KERNEL)
    pulled = _closure(specs, "nvidia-open-570")
    assert set(pulled) >= REAL_570_OPEN
    assert {pulled[name] for name in REAL_570_OPEN} == {"570.133.20-1"}
    meta = next(s for s in specs if s.name == "nvidia-open-570")
    assert meta.depends == ("nvidia-driver-570-open (= 570.133.20-1)", "nvidia-dkms-570-open (= 570.133.20-1)")
    dkms = next(s for s in specs if s.name == "nvidia-dkms-570-open")
    assert "dkms" in dkms.depends and ("dkms", "3.0.10-8+deb12u1") in {(s.name, s.version) for s in specs}


def test_unversioned_metapackages_from_590_pull_unversioned_parts():
    specs = standin_packages([mirror_stack("595", "595.58.03", pinning=True)], KERNEL)
    pulled = _closure(specs, "nvidia-open")
    assert {"nvidia-driver-open", "nvidia-dkms-open", "libnvidia-compute", "nvidia-utils",
            "nvidia-kernel-common", "nvidia-firmware-595.58.03"} <= set(pulled)
    assert pulled.pop("dkms") == "3.0.10-8+deb12u1"
    assert set(pulled.values()) == {"595.58.03-1"}
    assert not any("595" in name.split("-") for name in pulled)
    pinning = next(s for s in specs if s.name == "nvidia-driver-pinning-595")
    assert pinning.depends == ()


def test_proprietary_metapackage_pulls_the_proprietary_kernel_module():
    meta = PackageSpec("cuda-drivers-570", "570.211.01-1", "driver", "570.211.01")
    names = {p.name for p in standins.driver_parts(meta)}
    assert {"nvidia-driver-570", "nvidia-dkms-570", "nvidia-kernel-source-570", "libnvidia-compute-570"} <= names
    assert not any(name.endswith("-open") for name in names)


def test_cuda_toolkit_pulls_its_parts_by_minimum_versions_as_nvidias_does():
    specs = {s.name: s for s in standin_packages([mirror_stack("570", "570.148.08")], KERNEL)}
    toolkit = specs["cuda-toolkit-12-8"]
    # NVIDIA's 12.8.1: metapackages at 12.8.1-1, cuda-cudart-12-8 12.8.90-1 and libcublas-12-8 12.8.4.1-1 (the
    # versions NVIDIA's 12.8.1 cuda images install)
    assert set(toolkit.depends) == {"cuda-compiler-12-8 (>= 12.8.1)", "cuda-libraries-12-8 (>= 12.8.1)",
                                    "cuda-libraries-dev-12-8 (>= 12.8.1)", "cuda-tools-12-8 (>= 12.8.1)",
                                    "cuda-nvml-dev-12-8 (>= 12.8.90)"}
    assert specs["cuda-compiler-12-8"].version == "12.8.1-1"
    assert specs["cuda-cudart-12-8"].version == "12.8.90-1" and specs["libcublas-12-8"].version == "12.8.4.1-1"
    assert set(specs["cuda-libraries-12-8"].depends) == {"cuda-cudart-12-8 (>= 12.8.90)",
                                                         "libcublas-12-8 (>= 12.8.4.1)"}
    assert "Depends: cuda-nvcc-12-8 (>= 12.8.90)" in control_text(specs["cuda-compiler-12-8"], "amd64", 1)


def test_the_newer_cuda_patch_release_has_every_part_newer_for_apt():
    stack = mirror_stack("595", "595.58.03", pinning=True, cuda="13.2.1", nccl="2.30.4")
    current = {s.name: s for s in standin_packages([stack], KERNEL) if s.role in ("cuda", "cuda_part")}
    newer = {s.name: s for s in standins.newer_cuda_release(stack)}
    assert newer["cuda-toolkit-13-2"].version == "13.2.99-1" and set(newer) == set(current)
    assert {(s.name, s.version) for s in standins.point_release_packages([stack])} >= {
        (s.name, s.version) for s in newer.values()}
    if shutil.which("dpkg"):
        for name, spec in newer.items():
            assert subprocess.run(["dpkg", "--compare-versions", spec.version, "gt", current[name].version],
                                  check=False).returncode == 0, name


def test_driver_files_sit_in_the_package_that_carries_them():
    meta = PackageSpec("nvidia-open-570", "570.148.08-1", "driver", "570.148.08")
    parts = {p.name: package_contents(p, {}) for p in standins.driver_parts(meta)}
    assert set(package_contents(meta, {}).files) == {"usr/share/doc/nvidia-open-570/gpuprov-lab-standin"}
    compute = parts["libnvidia-compute-570"]
    assert compute.files["usr/lib/gpuprov-lab/driver-version"][0] == b"570.148.08\n"
    assert compute.files["usr/lib/gpuprov-lab/driver-cuda-version"][0] == b"12.8\n"
    assert compute.links["usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] == "libnvidia-ml.so.570.148.08"
    assert parts["nvidia-utils-570"].files["usr/bin/nvidia-smi"][1] == 0o755
    assert "lib/systemd/system/nvidia-persistenced.service" in parts["nvidia-compute-utils-570"].files
    dkms = parts["nvidia-dkms-570-open"]
    assert dkms.files["usr/lib/gpuprov-lab/module-version"][0] == b"570.148.08\n"
    assert "lib/systemd/system/gpuprov-lab-nvidia-module.service" in dkms.files
    assert "module-version /run/gpuprov-lab/loaded-driver" in dkms.scripts["postinst"]
    owners = [name for name, c in parts.items() for path in c.files if "nvidia-smi" in path or "version" in path]
    assert sorted(owners) == ["libnvidia-compute-570", "libnvidia-compute-570", "nvidia-dkms-570-open",
                              "nvidia-utils-570"]
    pinning = package_contents(PackageSpec("nvidia-driver-pinning-595", "595.58.03-1", "driver_pinning",
                                           "595.58.03"), {})
    assert not any("driver-version" in path or "nvidia-smi" in path for path in pinning.files)


def test_each_driver_part_replaces_the_same_part_of_another_branch():
    old = {p.role: p for p in standins.driver_parts(PackageSpec("nvidia-open-570", "570.211.01-1", "driver",
                                                                 "570.211.01"))}
    new = {p.role: p for p in standins.driver_parts(PackageSpec("nvidia-open", "595.58.03-1", "driver",
                                                                 "595.58.03"))}
    assert set(old) == set(new)
    for role in old:
        virtual = [line for line in control_text(old[role], "amd64", 1).splitlines() if line.startswith("Provides")]
        assert virtual == [line for line in control_text(new[role], "amd64", 1).splitlines()
                           if line.startswith("Provides")]
        assert f"Conflicts: {virtual[0].split(': ')[1]}" in control_text(new[role], "amd64", 1)
    assert "Depends: libnvidia-compute (= 595.58.03-1)" in control_text(new["driver_utils"], "amd64", 1)


def test_newer_point_release_is_the_same_branch_and_newer_for_apt():
    assert standins.newer_upstream("570.148.08") == "570.999.01"
    assert standins.newer_upstream("595.80") == "595.999"
    stack = mirror_stack("595", "595.58.03", pinning=True)
    point = standins.newer_point_release(stack)
    names = {s.name for s in point}
    assert {"nvidia-open", "nvidia-driver-pinning-595", "nvidia-fabricmanager", "libnvidia-compute",
            "nvidia-utils", "nvidia-firmware-595.999.01"} <= names
    assert {s.version for s in point} == {"595.999.01-1"} and {s.upstream for s in point} == {"595.999.01"}
    assert not names & {"libnccl2", "cuda-toolkit-12-8", "datacenter-gpu-manager-4-core"}
    if shutil.which("dpkg"):
        newer = subprocess.run(["dpkg", "--compare-versions", "595.999.01-1", "gt", "595.58.03-1"], check=False)
        assert newer.returncode == 0


def test_every_stack_section_with_packages_gets_stand_ins():
    stack = mirror_stack("595", "595.58.03", pinning=True)
    stack["nscq"] = {"version": "595.58.03", "packages": [{"name": "libnvidia-nscq", "version": "595.58.03-1"}]}
    stack["nvlsm"] = {"version": "2025.10.11", "packages": [{"name": "nvlsm", "version": "2025.10.11-1"}]}
    stack["pytorch"] = {"version": "2.14", "wheel": "cu132"}
    by_name = {s.name: s for s in standin_packages([stack], KERNEL)}
    assert (by_name["libnvidia-nscq"].role, by_name["libnvidia-nscq"].upstream) == ("nscq", "595.58.03")
    nvlsm = package_contents(by_name["nvlsm"], {})
    assert "lib/systemd/system/nvlsm.service" in nvlsm.files and nvlsm.files["usr/bin/nvlsm"][1] == 0o755
    point = {s.name for s in standins.newer_point_release(stack)}
    assert "libnvidia-nscq" in point and "nvlsm" not in point and "libnccl2" not in point


def test_point_release_covers_each_profiles_newest_branch_only():
    stacks = [mirror_stack("570", "570.211.01"), mirror_stack("595", "595.58.03", pinning=True)]
    point = standins.point_release_packages(stacks)
    assert {s.upstream for s in point if s.role.startswith("driver")} == {"595.999.01"}
    assert {s.version for s in point if s.name.startswith("cuda-toolkit-")} == {"12.8.99-1"}


def test_other_roles_install_their_real_file_names():
    def files(name, version, role, upstream):
        return package_contents(PackageSpec(name, version, role, upstream), {})

    fm = files("nvidia-fabricmanager-570", "570.148.08-1", "fabricmanager", "570.148.08")
    assert {"usr/bin/nv-fabricmanager", "lib/systemd/system/nvidia-fabricmanager.service"} <= set(fm.files)
    assert b'VERSION="570.148.08"' in fm.files["usr/bin/nv-fabricmanager"][0]
    ctk = files("nvidia-container-toolkit-base", "1.17.8-1", "container_toolkit", "1.17.8")
    assert {"usr/bin/nvidia-ctk", "usr/bin/nvidia-container-runtime"} <= set(ctk.files)
    dcgm = files("datacenter-gpu-manager-4-core", "1:4.2.3-1", "dcgm", "4.2.3")
    assert {"usr/bin/dcgmi", "lib/systemd/system/nvidia-dcgm.service"} <= set(dcgm.files)
    cuda = files("cuda-toolkit-12-8", "12.8.1-1", "cuda", "12.8.1")
    assert json.loads(cuda.files["usr/local/cuda-12.8/version.json"][0])["cuda"]["version"] == "12.8.1"
    nvcc = files("cuda-nvcc-12-8", "12.8.93-1", "cuda_part", "12.8.93").files["usr/local/cuda-12.8/bin/nvcc"]
    assert b"release 12.8, V12.8.93" in nvcc[0] and nvcc[1] == 0o755
    nccl = files("libnccl2", "2.26.5-1+cuda12.9", "nccl", "2.26.5")
    assert "usr/lib/x86_64-linux-gnu/libnccl.so.2.26.5" in nccl.files
    headers = files(f"linux-headers-{KERNEL}", "6.1.0-0gpuprovlab1", "kernel_headers", KERNEL)
    assert headers.links[f"lib/modules/{KERNEL}/build"] == f"/usr/src/linux-headers-{KERNEL}"


@pytest.mark.parametrize("driver,cuda", [("535.183.01", "12.2"), ("570.148.08", "12.8"), ("590.48.01", "13.1"),
                                         ("595.80", "13.2"), ("470.256.02", "N/A")])
def test_driver_cuda_version_matches_real_nvidia_smi(driver, cuda):
    assert driver_cuda_version(driver) == cuda


# ------------------------------------------------------------------------------------- simulated tools

@pytest.fixture
def standin_root(tmp_path):
    """A fake root with the hgx-h100 profile and a driver "installed" (not loaded yet)."""
    lib = tmp_path / "usr/lib/gpuprov-lab"
    lib.mkdir(parents=True)
    (lib / "driver-version").write_text("570.148.08\n")
    (lib / "driver-cuda-version").write_text("12.8\n")
    (lib / "gpu-profiles.json").write_text(json.dumps(gpu_profiles_table()))
    (tmp_path / "etc/gpuprov-lab").mkdir(parents=True)
    (tmp_path / "etc/gpuprov-lab/profile").write_text("hgx-h100\n")
    (tmp_path / "etc/hostname").write_text("gpuprov-lab-01\n")
    (tmp_path / "run/gpuprov-lab").mkdir(parents=True)
    return tmp_path


def run_tool(root, tool: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(root)}
    proc = subprocess.run([sys.executable, str(standins.FILES / tool), *args], capture_output=True, text=True,
                          env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def load(root, version: str) -> None:
    (root / "run/gpuprov-lab/loaded-driver").write_text(version + "\n")


def smi_xml(standin_root) -> dict:
    """The stand-in's `nvidia-smi -q -x`, read as gpuprov's facts read it."""
    rc, text = run_tool(standin_root, "nvidia-smi", "-q", "-x")
    return parse_nvidia_smi_xml(text, rc)


def test_smi_query_parses_into_the_profile_gpus(standin_root):
    load(standin_root, "570.148.08")
    rc, text = run_tool(standin_root, "nvidia-smi", "-q")
    assert rc == 0
    assert text.splitlines()[1] == "==============NVSMI LOG=============="
    smi = smi_xml(standin_root)
    assert smi["driver_version"] == "570.148.08" and smi["cuda_version"] == "12.8"
    assert [g["name"] for g in smi["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert smi["gpus"][0]["bus_id"] == "00000000:18:00.0"
    assert {g["memory_total_mib"] for g in smi["gpus"]} == {81559}  # the H100 capture's memory.total
    assert all(g["ecc_mode"] is True and g["persistence_mode"] is False for g in smi["gpus"])
    assert len({g["uuid"] for g in smi["gpus"]}) == 8
    assert text.count("GPU-") == run_tool(standin_root, "nvidia-smi", "-q")[1].count("GPU-")
    assert smi_xml(standin_root)["gpus"][3]["uuid"] == smi["gpus"][3]["uuid"]


def test_smi_persistence_mode_follows_persistenced_and_pm(standin_root):
    load(standin_root, "570.148.08")
    rc, text = run_tool(standin_root, "nvidia-smi", "-pm", "1")
    assert rc == 0 and text.strip().endswith("All done.")
    assert all(g["persistence_mode"] for g in smi_xml(standin_root)["gpus"])


def test_smi_geforce_profile_has_no_ecc(standin_root):
    load(standin_root, "570.148.08")
    (standin_root / "etc/gpuprov-lab/profile").write_text("rtx-4090\n")
    smi = smi_xml(standin_root)
    assert [g["name"] for g in smi["gpus"]] == ["NVIDIA GeForce RTX 4090"] * 2
    assert {g["ecc_mode"] for g in smi["gpus"]} == {None}


def test_smi_version_mismatch_fails_like_the_real_one(standin_root):
    load(standin_root, "535.183.01")
    rc, text = run_tool(standin_root, "nvidia-smi", "-q")
    assert rc == 18
    assert text.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                 "NVML library version: 570.148"]
    assert "error" in smi_xml(standin_root)


def test_smi_without_loaded_module_or_gpus(standin_root):
    rc, text = run_tool(standin_root, "nvidia-smi")
    assert rc == 9 and "couldn't communicate with the NVIDIA driver" in text
    load(standin_root, "570.148.08")
    (standin_root / "etc/gpuprov-lab/profile").write_text("no-such-profile\n")
    assert run_tool(standin_root, "nvidia-smi", "-q") == (6, "No devices were found\n")


def test_smi_csv_table_and_list(standin_root):
    load(standin_root, "570.148.08")
    rc, text = run_tool(standin_root, "nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader,nounits")
    assert rc == 0 and text.splitlines() == ["NVIDIA H100 80GB HBM3, 570.148.08, 81559"] * 8
    rc, text = run_tool(standin_root, "nvidia-smi", "--query-gpu=name,bogus", "--format=csv")
    assert rc == 2 and 'Field "bogus" is not a valid field to query.' in text
    rc, text = run_tool(standin_root, "nvidia-smi")
    assert rc == 0 and "Driver Version: 570.148.08" in text and "CUDA Version: 12.8" in text
    assert run_tool(standin_root, "nvidia-smi", "-L")[1].count("NVIDIA H100 80GB HBM3 (UUID: GPU-") == 8


APPS = "--query-compute-apps=pid,process_name,used_memory"


def test_smi_without_compute_processes_prints_nothing(standin_root):
    load(standin_root, "570.148.08")
    assert run_tool(standin_root, "nvidia-smi", APPS, "--format=csv,noheader,nounits") == (0, "")
    rc, text = run_tool(standin_root, "nvidia-smi", APPS, "--format=csv")
    assert (rc, text) == (0, "pid, process_name, used_gpu_memory [MiB]\n")
    assert "No running processes found" in run_tool(standin_root, "nvidia-smi")[1]


def test_smi_reports_the_compute_processes_a_test_writes(standin_root):
    from gpuprov.facts.parsers import parse_gpu_processes

    load(standin_root, "570.148.08")
    (standin_root / "etc/gpuprov-lab/compute-apps.csv").write_text(
        "# pid, process_name, used_memory_mib[, gpu_index]\n12345, python, 40960\n11345, ./gpu_burn, 15690, 3\n")
    rc, text = run_tool(standin_root, "nvidia-smi", APPS, "--format=csv,noheader,nounits")
    assert rc == 0 and text.splitlines() == ["12345, python, 40960", "11345, ./gpu_burn, 15690"]
    rc, xml = run_tool(standin_root, "nvidia-smi", "-q", "-x")
    assert parse_gpu_processes(xml, rc) == [   # what the facts read: the processes in -q -x
        {"pid": 12345, "process_name": "python", "used_memory_mib": 40960},
        {"pid": 11345, "process_name": "./gpu_burn", "used_memory_mib": 15690}]
    rc, text = run_tool(standin_root, "nvidia-smi", "--query-compute-apps=pid,used_gpu_memory,gpu_uuid,gpu_bus_id",
                        "--format=csv")
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in run_tool(standin_root, "nvidia-smi", "-L")[1].splitlines()]
    assert text.splitlines() == ["pid, used_gpu_memory [MiB], gpu_uuid, gpu_bus_id",
                                 f"12345, 40960 MiB, {uuids[0]}, 00000000:18:00.0",
                                 f"11345, 15690 MiB, {uuids[3]}, 00000000:5D:00.0"]
    rc, text = run_tool(standin_root, "nvidia-smi", "--query-gpu=index,memory.used,memory.free",
                        "--format=csv,noheader,nounits")
    # memory.free: the H100 capture's free memory (81081 MiB, total less reserved) less what the processes use
    assert text.splitlines()[0] == "0, 40960, 40121" and text.splitlines()[3] == "3, 15690, 65391"
    assert text.splitlines()[1] == "1, 0, 81081"
    table = run_tool(standin_root, "nvidia-smi")[1]
    assert "|    0   N/A  N/A           12345      C   python                                40960MiB |" in table
    assert "40960MiB /  81559MiB" in table and "No running processes found" not in table
    query = run_tool(standin_root, "nvidia-smi", "-q")[1]
    assert "            Name                          : ./gpu_burn" in query


def test_smi_refuses_a_broken_compute_apps_file_and_unknown_fields(standin_root):
    load(standin_root, "570.148.08")
    (standin_root / "etc/gpuprov-lab/compute-apps.csv").write_text("12345, python\n")
    rc, text = run_tool(standin_root, "nvidia-smi", APPS, "--format=csv")
    assert rc == 2 and "compute-apps.csv line 1" in text
    (standin_root / "etc/gpuprov-lab/compute-apps.csv").write_text("1, x, 1\n")
    rc, text = run_tool(standin_root, "nvidia-smi", "--query-compute-apps=pid,bogus", "--format=csv")
    assert rc == 2 and 'Field "bogus" is not a valid field to query.' in text
    assert run_tool(standin_root, "nvidia-smi", APPS)[0] == 2


def test_ctk_configures_docker_keeping_other_keys(standin_root, tmp_path):
    ctk = package_contents(PackageSpec("nvidia-container-toolkit-base", "1.17.8-1", "container_toolkit",
                                       "1.17.8"), {}).files["usr/bin/nvidia-ctk"][0]
    tool = tmp_path / "nvidia-ctk"
    tool.write_bytes(ctk)
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(standin_root)}

    def ctk_run(*args):
        proc = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True, env=env,
                              check=False)
        return proc.returncode, proc.stdout + proc.stderr

    assert ctk_run("--version")[1].startswith("NVIDIA Container Toolkit CLI version 1.17.8\n")
    daemon = standin_root / "etc/docker/daemon.json"
    daemon.parent.mkdir(parents=True)
    daemon.write_text('{"log-driver": "json-file", "runtimes": {"other": {"path": "x"}}}')
    rc, out = ctk_run("runtime", "configure", "--runtime=docker")
    assert rc == 0 and "Wrote updated config to" in out
    assert json.loads(daemon.read_text()) == {
        "log-driver": "json-file",
        "runtimes": {"other": {"path": "x"}, "nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    daemon.write_text("{broken")
    rc, out = ctk_run("runtime", "configure", "--runtime=docker")
    assert rc == 1 and "unable to parse" in out and daemon.read_text() == "{broken"
    (standin_root / "etc/gpuprov-lab/devices.json").write_text(json.dumps(
        [{"vendor": "10de", "class": "0302"}] * 8 + [{"vendor": "10de", "class": "0680"}]))
    assert ctk_run("cdi", "generate", "--output=/etc/cdi/nvidia.yaml")[0] == 0
    spec = (standin_root / "etc/cdi/nvidia.yaml").read_text()
    assert "kind: nvidia.com/gpu" in spec and spec.count('- name: "') == 8
    assert ctk_run("system", "create-dev-char-symlinks", "--create-all")[0] == 0


# ------------------------------------------------------------------------------------------ repository

needs_tools = pytest.mark.skipif(not (shutil.which("dpkg-deb") and shutil.which("gpg")),
                                 reason="needs dpkg-deb and gpg (Debian)")


@pytest.mark.tool
@needs_tools
def test_build_repo_signs_a_flat_repository(tmp_path):
    from gpuprov.lab.mirror import MirrorInfo, build_repo, mirror_vars
    from gpuprov.lab.state import LabPaths

    paths = LabPaths(tmp_path)
    repo = build_repo(paths, [mirror_stack("570", "570.148.08")], kernel=KERNEL)
    assert len(repo.fingerprint) == 40 and repo.key_file == tmp_path / ".lab/mirror-key.asc"
    for name in ("Packages", "Packages.gz", "Release", "InRelease", "Release.gpg"):
        assert (repo.path / name).is_file()
    packages = (repo.path / "Packages").read_text()
    stanzas = [dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(" "))
               for block in packages.strip().split("\n\n")]
    assert ("datacenter-gpu-manager-4-core", "1:4.2.3-1") in {(s["Package"], s["Version"]) for s in stanzas}
    for stanza in stanzas:
        assert (repo.path / stanza["Filename"]).stat().st_size == int(stanza["Size"])
    keyring = tmp_path / "keyring.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(repo.key_file)], check=True)
    verify = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo.path / "InRelease")],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stderr
    again = build_repo(paths, [mirror_stack("570", "570.148.08")], kernel=KERNEL)
    assert again.path == repo.path and again.fingerprint == repo.fingerprint
    info_vars = mirror_vars(MirrorInfo("http://172.18.0.9/", repo.key_file, repo.fingerprint))
    assert info_vars == {"url": "http://172.18.0.9/", "key_file": str(repo.key_file),
                         "fingerprint": repo.fingerprint, "label": "gpuprov-lab"}
    assert "\nLabel: gpuprov-lab\n" in (repo.path / "Release").read_text()  # what apt pins the mirror by
    # the newer point release sits in the same index, beside the stack's own versions
    assert len(repo.point_release) > 10
    assert {(s["Package"], s["Version"]) for s in stanzas} == (
        {(p.name, p.version) for p in repo.packages} | {(p.name, p.version) for p in repo.point_release})
    assert "Package: nvidia-open-570\nVersion: 570.999.01-1\n" in packages
    assert "Package: nvidia-open-570\nVersion: 570.148.08-1\n" in packages


@pytest.mark.tool
@needs_tools
def test_the_key_is_made_and_signs_in_a_checkout_too_deep_for_gpg_agents_socket(tmp_path):
    # a Unix socket's path holds at most 107 bytes: gpg-agent cannot start in a homedir this deep
    from gpuprov.lab.mirror import _write_index, ensure_key
    from gpuprov.lab.state import LabPaths

    paths = LabPaths(tmp_path / ("deep-checkout-" * 8))
    home = paths.state_dir / "mirror-gnupg"
    assert len(str(home / "S.gpg-agent.browser")) > 107
    fpr = ensure_key(paths)
    root = tmp_path / "repo"
    root.mkdir()
    _write_index(paths, fpr, root, [], "amd64", "deep")
    keyring = tmp_path / "keyring.gpg"
    armored = paths.state_dir / "mirror-key.asc"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(armored)], check=True)
    verify = subprocess.run(["gpgv", "--keyring", str(keyring), str(root / "InRelease")], capture_output=True,
                            text=True, check=False)
    assert verify.returncode == 0, verify.stderr


def _tiny_deb(tmp_path, name: str, version: str) -> Path:
    root = tmp_path / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
                                         "Maintainer: Debian <debian@example.invalid>\nDescription: a real one\n")
    target = tmp_path / f"{name}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(target)], check=True,
                   capture_output=True)
    return target


@pytest.mark.tool
@needs_tools
def test_real_debian_packages_sit_beside_the_standins_and_change_the_digest(tmp_path):
    from gpuprov.lab.debian import DebianDeb, DebianDebs
    from gpuprov.lab.mirror import build_repo
    from gpuprov.lab.state import LabPaths

    paths = LabPaths(tmp_path)
    stacks = [mirror_stack("570", "570.148.08")]
    plain = build_repo(paths, stacks, kernel=KERNEL)
    deb = _tiny_deb(tmp_path, "tini", "0.19.0-1+b3")
    debian = DebianDebs("k", (DebianDeb("tini", "0.19.0-1+b3", deb, "0" * 64),))
    repo = build_repo(paths, stacks, kernel=KERNEL, debian=debian)
    assert repo.digest != plain.digest and repo.debian == debian.debs
    text = (repo.path / "Packages").read_text()
    stanza = next(b for b in text.split("\n\n") if b.startswith("Package: tini\n"))
    assert "Filename: pool/debian/tini_0.19.0-1+b3_all.deb" in stanza
    assert (repo.path / "pool/debian/tini_0.19.0-1+b3_all.deb").read_bytes() == deb.read_bytes()
    assert build_repo(paths, stacks, kernel=KERNEL, debian=debian).digest == repo.digest


class _Apt:
    """apt-get on a private state against the flat repositories of a built mirror (no host is touched)."""

    def __init__(self, tmp_path, repo, keyring, status=""):
        self.home = tmp_path / "apt"
        for sub in ("lists/partial", "cache/archives/partial"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        (self.home / "status").write_text(status)
        (self.home / "p").write_text("")  # no apt preferences unless a test writes them
        self.sources = [f"deb [signed-by={keyring}] file:{repo.path}/ /"]
        self.opts = ["-o", f"Dir::State={self.home}", "-o", f"Dir::State::Lists={self.home}/lists",
                     "-o", f"Dir::State::status={self.home}/status", "-o", f"Dir::Cache={self.home}/cache",
                     "-o", f"Dir::Etc::SourceList={self.home}/sources.list", "-o", "Dir::Etc::SourceParts=-",
                     "-o", f"Dir::Etc::PreferencesParts={self.home}", "-o", f"Dir::Etc::Preferences={self.home}/p",
                     "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-o", "APT::Architecture=amd64"]

    def run(self, *args):
        (self.home / "sources.list").write_text("\n".join(self.sources) + "\n")
        env = {k: v for k, v in os.environ.items() if k != "APT_CONFIG"}
        subprocess.run(["apt-get", *self.opts, "-q", "update"], check=True, capture_output=True, env=env)
        proc = subprocess.run(["apt-get", *self.opts, "-s", *args], capture_output=True, text=True, env=env)
        return proc.returncode, proc.stdout + proc.stderr


def _installs(text):
    return {line.split()[1]: line.split("(")[1].split()[0] for line in text.splitlines() if line.startswith("Inst ")}


def _status(packages_text, installed, held):
    """dpkg status stanzas for `installed` names, from a repository's Packages stanzas."""
    out = []
    for block in packages_text.strip().split("\n\n"):
        lines = block.splitlines()
        fields = dict(line.split(": ", 1) for line in lines if ": " in line and not line[0].isspace())
        if installed.get(fields["Package"]) == fields["Version"]:
            state = "hold ok installed" if fields["Package"] in held else "install ok installed"
            control = [line for line in lines if line.split(":")[0] not in
                       ("Filename", "Size", "MD5sum", "SHA1", "SHA256")]
            out.append("\n".join([control[0], f"Status: {state}", *control[1:]]))
    return "\n\n".join(out) + "\n"


# What provisioning writes before it installs a driver (gpuprov's apt pins): the driver's packages at its version.
DRIVER_PINS = ("Package: nvidia-* libnvidia-* xserver-xorg-video-nvidia*\nPin: version 595.58.03-*\n"
               "Pin-Priority: 1001\n")


@pytest.mark.tool
@pytest.mark.skipif(not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("gpg")),
                    reason="needs apt-get, dpkg-deb and gpg (Debian)")
def test_apt_resolves_the_metapackage_and_a_held_stack_ignores_the_point_release(tmp_path):
    from gpuprov.lab.mirror import build_repo
    from gpuprov.lab.state import LabPaths

    repo = build_repo(LabPaths(tmp_path), [mirror_stack("595", "595.58.03", pinning=True)], kernel=KERNEL)
    keyring = tmp_path / "keyring.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(repo.key_file)], check=True)
    wanted = ("nvidia-driver-pinning-595=595.58.03-1", "nvidia-open=595.58.03-1")
    # apt cannot install the older metapackage alone: its parts' candidates are the newer point release
    rc, out = _Apt(tmp_path, repo, keyring).run("install", *wanted)
    assert rc != 0 and "but 595.999.01-1 is to be installed" in out
    # with the driver's packages pinned at its version it pulls every part at exactly that version
    apt = _Apt(tmp_path, repo, keyring)
    (apt.home / "p").write_text(DRIVER_PINS)
    rc, out = apt.run("install", *wanted)
    assert rc == 0, out
    pulled = _installs(out)
    assert {"nvidia-open", "nvidia-driver-open", "nvidia-dkms-open", "libnvidia-compute", "nvidia-utils",
            "nvidia-kernel-common", "nvidia-firmware-595.58.03", "dkms"} <= set(pulled)
    assert {v for k, v in pulled.items() if k != "dkms"} == {"595.58.03-1"}
    # provisioned (the stack's packages held): the point release moves nothing, even without the pins
    apt = _Apt(tmp_path, repo, keyring, _status((repo.path / "Packages").read_text(), pulled,
                                                 held={"nvidia-open", "nvidia-driver-pinning-595"}))
    rc, out = apt.run("dist-upgrade")
    assert rc == 0 and _installs(out) == {}, out
    # without the holds and pins it is a real upgrade for apt
    apt = _Apt(tmp_path, repo, keyring, _status((repo.path / "Packages").read_text(), pulled, held=set()))
    rc, out = apt.run("dist-upgrade")
    assert rc == 0 and _installs(out)["nvidia-open"] == "595.999.01-1", out


def _apt_over(tmp_path: Path, specs: list[PackageSpec]) -> dict:
    """A repository of the stand-ins' control files and an empty dpkg status for the real apt; its environment."""
    if shutil.which("apt-get") is None:
        pytest.skip("needs apt (a Debian/Ubuntu controller)")
    for folder in ("repo", "state/lists/partial", "cache/archives/partial", "bin", "parts"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    stanzas = []
    for spec in specs:
        lines = control_text(spec, "amd64", 1).rstrip("\n").splitlines()
        cut = next(i for i, line in enumerate(lines) if line.startswith("Description:"))
        stanzas.append("\n".join(lines[:cut] + [f"Filename: pool/{standins.deb_filename(spec, 'amd64')}", "Size: 1"]
                                 + lines[cut:]))
    (tmp_path / "repo" / "Packages").write_text("\n\n".join(stanzas) + "\n")
    (tmp_path / "state" / "status").write_text("")
    (tmp_path / "sources.list").write_text(f"deb [trusted=yes] file:{tmp_path / 'repo'} /\n")
    (tmp_path / "apt.conf").write_text(
        f'Dir::State "{tmp_path}/state";\nDir::State::status "{tmp_path}/state/status";\n'
        f'Dir::Cache "{tmp_path}/cache";\nDir::Etc::sourcelist "{tmp_path}/sources.list";\n'
        f'Dir::Etc::sourceparts "{tmp_path}/parts";\nDir::Etc::preferencesparts "{tmp_path}/parts";\n'
        'APT::Architecture "amd64";\nDebug::NoLocking "true";\nAPT::Sandbox::User "";\n')
    env = {"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "APT_CONFIG": str(tmp_path / "apt.conf")}
    subprocess.run(["/usr/bin/apt-get", "update"], env=env, check=True, capture_output=True)
    return env


def _apt(env: dict, *args: str) -> dict[str, str]:
    """What `apt-get -s ARGS` would install: name -> version."""
    out = subprocess.run(["/usr/bin/apt-get", "-s", *args], env=env, capture_output=True, text=True, check=True)
    return dict(re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+)", out.stdout, re.M))


@pytest.mark.tool
def test_the_stand_in_toolkit_floats_for_apt_alone_and_gpuprov_installs_pins_and_holds_its_release(tmp_path):
    """Real apt over the stand-ins of the locked 13.2.1 and the newer 13.2.99: alone it takes 13.2.99's parts;
    gpuprov's install takes 13.2.1's, and its pins, or its holds, each keep `dist-upgrade` from moving them."""
    from gpuprov.core.packages import Package, for_family
    from gpuprov.provision.ops import pins

    stack = mirror_stack("595", "595.58.03", pinning=True, cuda="13.2.1", nccl="2.30.4")
    current = [s for s in standin_packages([stack], KERNEL) if s.role in ("cuda", "cuda_part")]
    newer = standins.newer_cuda_release(stack)
    env = _apt_over(tmp_path, current + newer)
    release = {s.name: s.version for s in current}
    assert _apt(env, "install", "cuda-toolkit-13-2=13.2.1-1")["cuda-nvcc-13-2"] == "13.2.3030-1"
    for tool in ("apt-mark", "dpkg-query"):
        (tmp_path / "bin" / tool).write_text("#!/bin/sh\n")
        (tmp_path / "bin" / tool).chmod(0o755)
    (tmp_path / "bin" / "apt-get").write_text("#!/bin/sh\nexec /usr/bin/apt-get -s \"$@\"\n")
    (tmp_path / "bin" / "apt-get").chmod(0o755)
    toolkit = Package("cuda-toolkit-13-2", "13.2.1-1")
    command = for_family("debian").install_release([toolkit], families.family_pattern(stack))
    proc = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert dict(re.findall(r"^Inst (\S+) \((\S+)", proc.stdout, re.M)) == release
    by_version = {(s.name, s.version): s for s in current}

    def installed(state: str) -> str:
        """dpkg's status with the release installed (`install`) or held (`hold`)."""
        out = []
        for name, version in release.items():
            first, *rest = control_text(by_version[(name, version)], "amd64", 1).splitlines()
            out.append("\n".join([first, f"Status: {state} ok installed", *rest]) + "\n")
        return "\n".join(out)

    status = tmp_path / "state" / "status"
    status.write_text(installed("install"))
    assert set(_apt(env, "dist-upgrade")) == set(release)      # nothing keeps the release
    status.write_text(installed("hold"))
    assert _apt(env, "dist-upgrade") == {}
    status.write_text(installed("install"))
    parts = [Package(n, v) for n, v in sorted(release.items()) if n != toolkit.name]
    (tmp_path / "parts" / "gpuprov-nvidia").write_text(pins.preferences([toolkit], "595.58.03", None, parts))
    assert _apt(env, "dist-upgrade") == {}
