"""check_host on synthetic facts dicts (schema of docs/design.md)."""

import copy

import pytest

from gpuprov.stack.check import check_host
from gpuprov.stack.resolve import resolve

STACK = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, gpus=8, driver="570.148.08").to_dict()


def _good_facts():
    pkgs = {p["name"]: p["version"] for part in ("driver", "fabricmanager", "cuda", "nccl", "container_toolkit",
                                                   "dcgm") for p in STACK[part]["packages"]}
    return {"host": "gpu01", "kernel": "5.15.0-1-generic", "loaded_driver_version": "570.148.08",
            "nvidia_smi": {"driver_version": "570.148.08", "cuda_version": "12.8", "gpus": []},
            "packages": pkgs, "held": list(pkgs), "nouveau_loaded": False, "kernel_headers": True,
            "fabricmanager": {"version": "570.148.08", "active": True, "enabled": True}}


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
    facts = _good_facts()
    facts["packages"] = {p["name"]: p["version"] for part in ("driver", "cuda", "nccl", "container_toolkit",
                                                                "dcgm") for p in stack[part]["packages"]}
    facts["held"] = list(facts["packages"])
    facts["fabricmanager"] = None
    assert check_host(facts, stack) == []
