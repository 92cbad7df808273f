"""check_host on synthetic facts dicts (schema of docs/design.md)."""

import copy

import pytest

from gpuprov.stack.check import check_host
from gpuprov.stack.resolve import resolve

STACK = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, gpus=8, driver="570.148.08").to_dict()
SECTIONS = ("driver", "fabricmanager", "nscq", "nvlsm", "cuda", "nccl", "container_toolkit", "dcgm")


def _good_facts(stack=STACK):
    pkgs = {p["name"]: p["version"] for part in SECTIONS for p in (stack[part] or {}).get("packages", [])}
    pkgs["libnvidia-compute-570"] = "570.148.08-0ubuntu1"      # pulled in by the driver metapackage
    return {"host": "gpu01", "kernel": "5.15.0-1-generic", "loaded_driver_version": "570.148.08",
            "nvidia_smi": {"driver_version": "570.148.08", "cuda_version": "12.8", "gpus": []},
            "packages": pkgs, "held": list(pkgs), "nouveau_loaded": False, "kernel_headers": True,
            "fabricmanager": {"version": "570.148.08", "active": True, "enabled": True},
            "kernels_installed": ["5.15.0-1-generic"],
            "dkms_status": ["nvidia/570.148.08, 5.15.0-1-generic, x86_64: installed"]}


def test_healthy_host_has_no_mismatch():
    assert check_host(_good_facts(), STACK) == []


def _what(facts):
    return [m.what for m in check_host(facts, STACK)]


def test_driver_library_mismatch_says_reboot():
    facts = _good_facts()
    facts["loaded_driver_version"] = "570.133.20"
    found = check_host(facts, STACK)
    assert any("reboot" in m.remedy and "NVML" in m.remedy for m in found)


@pytest.mark.parametrize("change,expected", [
    (lambda f: f["packages"].pop("libnccl2"), "package libnccl2"),
    (lambda f: f["packages"].update({"libnccl2": "2.21.5-1+cuda12.4"}), "package libnccl2"),
    (lambda f: f["held"].remove("libnccl2"), "package libnccl2 hold"),
    (lambda f: f["held"].remove("libnvidia-compute-570"), "package libnvidia-compute-570 hold"),
    (lambda f: f["packages"].pop("libnvidia-nscq-570"), "package libnvidia-nscq-570"),
    (lambda f: f["kernels_installed"].append("5.15.0-2-generic"), "nvidia module for kernel 5.15.0-2-generic"),
    (lambda f: f.update({"dkms_status": ["nvidia/570.148.08, 5.15.0-1-generic, x86_64: built"]}),
     "nvidia module for kernel 5.15.0-1-generic"),
    (lambda f: f["fabricmanager"].update({"version": "570.133.20"}), "fabric manager version"),
    (lambda f: f["fabricmanager"].update({"active": False}), "fabric manager service"),
    (lambda f: f.update({"fabricmanager": None}), "fabric manager"),
    (lambda f: f.update({"kernel_headers": False}), "kernel headers"),
    (lambda f: f.update({"nouveau_loaded": True}), "nouveau module"),
    (lambda f: f.update({"loaded_driver_version": None}), "loaded driver version"),
])
def test_each_mismatch(change, expected):
    facts = copy.deepcopy(_good_facts())
    change(facts)
    found = check_host(facts, STACK)
    assert expected in [m.what for m in found]
    assert all(m.remedy for m in found)


def test_no_fabricmanager_expected_without_nvswitch():
    stack = resolve("H100-PCIe", "ubuntu-22.04", driver="570.148.08").to_dict()
    facts = _good_facts(stack)
    facts["fabricmanager"] = None
    assert check_host(facts, stack) == []


def test_b200_needs_nvlsm_installed_and_held():
    stack = resolve("B200", "ubuntu-24.04", nvswitch=True, gpus=8, driver="570.148.08").to_dict()
    facts = _good_facts(stack)
    assert check_host(facts, stack) == []
    facts["packages"].pop("nvlsm")
    facts["fabricmanager"]["active"] = False
    found = {m.what: m for m in check_host(facts, stack)}
    assert found["package nvlsm"].expected == "2025.10.11-1"
    assert "nvlsm" in found["fabric manager service"].remedy


def test_dkms_2_status_lines_and_the_open_module_name_count():
    facts = _good_facts()
    facts["kernels_installed"] = ["5.15.0-1-generic", "5.15.0-2-generic"]
    facts["dkms_status"] = ["nvidia, 570.148.08, 5.15.0-1-generic, x86_64: installed",
                            "nvidia-open/570.148.08, 5.15.0-2-generic, x86_64: installed (WARNING! Diff between "
                            "built and installed module!)", "nvidia/570.133.20, 5.15.0-2-generic, x86_64: installed"]
    assert check_host(facts, STACK) == []
    facts["dkms_status"] = None          # dkms missing: nothing to say about module builds
    assert check_host(facts, STACK) == []


def test_rhel_holds_are_the_versionlock_entries_and_epochs_do_not_matter():
    stack = resolve("H100-SXM", "rhel-9", nvswitch=True, gpus=8, driver="570.148.08").to_dict()
    facts = _good_facts(stack)
    facts["os"] = {"family": "rhel"}
    facts["packages"] = {name: ("3:" + v if name.startswith(("nvidia-driver", "kmod-")) else v)
                         for name, v in facts["packages"].items() if name != "libnvidia-compute-570"}
    facts["held"] = []
    facts["files"] = {"/etc/dnf/plugins/versionlock.list": "".join(
        f"{name}-{v if ':' in v else '0:' + v}.*\n" for name, v in facts["packages"].items())}
    assert check_host(facts, stack) == []
    facts["files"]["/etc/dnf/plugins/versionlock.list"] = ""
    assert "package nvidia-driver hold" in [m.what for m in check_host(facts, stack)]


# What `apt-get install cuda-toolkit-12-8` pulled besides the toolkit (NVIDIA/nvidia-container-toolkit#883:
# "The following additional packages will be installed: cuda-cccl-12-8 ... libcublas-12-8 ... gds-tools-12-8
# ... nsight-compute-2025.1.0"); the versions are illustrative (the check judges names and holds).
TOOLKIT_12_8 = {"cuda-compiler-12-8": "12.8.1-1", "cuda-nvcc-12-8": "12.8.93-1", "cuda-cudart-12-8": "12.8.90-1",
                "libcublas-12-8": "12.8.4.1-1", "libcublas-dev-12-8": "12.8.4.1-1", "gds-tools-12-8": "1.13.1.3-1",
                "cuda-toolkit-12-8-config-common": "12.8.90-1", "cuda-toolkit-12-config-common": "12.8.90-1",
                "cuda-toolkit-config-common": "12.8.90-1", "nsight-compute-2025.1.0": "2025.1.0.14-1"}


def test_every_package_of_the_toolkits_release_must_be_held():
    facts = _good_facts()
    assert STACK["cuda"]["packages"][0]["name"] == "cuda-toolkit-12-8"
    facts["packages"].update(TOOLKIT_12_8)
    facts["held"] += list(TOOLKIT_12_8)
    assert check_host(facts, STACK) == []
    for name in TOOLKIT_12_8:
        unheld = copy.deepcopy(facts)
        unheld["held"].remove(name)
        found = [m for m in check_host(unheld, STACK) if m.found == "not held"]
        assert [m.what for m in found] == [f"package {name} hold"]
        assert f"apt-mark hold {name}" in found[0].remedy


def test_another_toolkits_packages_and_foreign_packages_are_not_the_release():
    facts = _good_facts()
    facts["packages"].update({"cuda-compiler-12-6": "12.6.3-1", "libcublas-12-6": "12.6.4.1-1",
                              "gcc-12": "12.2.0-14", "libnccl2": facts["packages"]["libnccl2"]})
    assert check_host(facts, STACK) == []
