"""Resolver: table-driven replays of NVIDIA's published tables and one case per rule, positive and negative."""

import json

import pytest
from helpers.pins import BAD_IDS, BAD_PINS, UNKNOWN_GPU

from gpuprov.catalog import lookup
from gpuprov.core.errors import InputError
from gpuprov.stack.data import branch_of, table, vkey
from gpuprov.stack.resolve import Stack, StackConflict, cuda_problem, ngc_problem, resolve, resolve_for_host
from gpuprov.stack.rules import check_stack

CUDA_ROWS = [(u, d) for m, r in table("cuda")["releases"].items() for u, d in r["updates"].items()]
PUBLISHED = {v for row in table("drivers")["branches"].values() for v in row["versions"]}


def _below(version: str) -> str:
    parts = list(vkey(version))
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] > 0:
            parts[i] -= 1
            return ".".join(str(p) for p in parts)
    raise AssertionError(version)


@pytest.mark.parametrize("cuda,driver", CUDA_ROWS)
def test_cuda_row_min_driver_accepted(cuda, driver):
    assert cuda_problem(lookup("A100-SXM4-80GB"), cuda, branch_of(driver), driver, False) == (None, False)


@pytest.mark.parametrize("cuda,driver", [(c, d) for c, d in CUDA_ROWS if d in PUBLISHED])
def test_cuda_row_min_driver_resolves_when_published(cuda, driver):
    stack = resolve("A100-SXM4-80GB", "ubuntu-22.04", cuda=cuda, driver=driver)
    assert stack.cuda["version"] == cuda and stack.driver["version"] == driver
    assert stack.forward_compat is False


@pytest.mark.parametrize("cuda,driver", CUDA_ROWS)
def test_cuda_row_one_below_rejected(cuda, driver):
    problem, _ = cuda_problem(lookup("A10"), cuda, branch_of(driver), _below(driver), False)
    assert f"needs driver >= {driver}" in problem


@pytest.mark.parametrize("tag,row", list(table("ngc_pytorch")["tags"].items()))
def test_ngc_tag_driver_requirement(tag, row):
    driver = row["min_driver"]
    assert ngc_problem(lookup("H100-SXM"), tag, branch_of(driver), driver) == (None, True)
    problem, _ = ngc_problem(lookup("RTX-4090"), tag, branch_of(driver), _below(driver))
    assert f"NGC PyTorch {tag}-py3 needs driver >= {driver}" in problem


def test_ngc_forward_compat_branches_on_datacenter_only():
    stack = resolve("H100-SXM", "ubuntu-22.04", ngc="24.05", driver="535")
    assert stack.ngc_pytorch == "24.05-py3"
    with pytest.raises(StackConflict):
        resolve("RTX-4090", "ubuntu-22.04", ngc="24.05", driver="535")


def test_forward_compat_datacenter_listed_branch():
    stack = resolve("H100-SXM", "ubuntu-22.04", cuda="12.8", driver="535", forward_compat=True)
    assert stack.forward_compat is True
    assert {"name": "cuda-compat-12-8", "version": "570.124.06-1ubuntu1"} in stack.cuda["packages"]


def test_forward_compat_needs_flag_and_says_so():
    with pytest.raises(StackConflict) as exc:
        resolve("H100-SXM", "ubuntu-22.04", cuda="12.8", driver="535")
    assert "forward_compat: true" in exc.value.conflicts[0]


def test_forward_compat_impossible_on_consumer_gpu():
    with pytest.raises(StackConflict) as exc:
        resolve("RTX-4090", "ubuntu-22.04", cuda="12.8", driver="535", forward_compat=True)
    assert "not a data center GPU" in exc.value.conflicts[0]


def test_forward_compat_not_on_unlisted_branch():
    with pytest.raises(StackConflict) as exc:
        resolve("H100-SXM", "ubuntu-22.04", cuda="12.8", driver="550", forward_compat=True)
    assert "Use driver 570 or newer" in exc.value.conflicts[0]


def test_forward_compat_not_on_new_feature_branch():
    with pytest.raises(StackConflict):
        resolve("H100-SXM", "ubuntu-22.04", cuda="13.3", driver="590", forward_compat=True)


@pytest.mark.parametrize("gpu,modules", [("B200", "open"), ("RTX-5090", "open"), ("V100", "proprietary"),
                                         ("H100-SXM", "open"), ("T4", "open")])
def test_kernel_modules_default(gpu, modules):
    assert resolve(gpu, "ubuntu-24.04").driver["kernel_modules"] == modules


def test_kernel_modules_proprietary_default_before_560():
    assert resolve("A100-SXM4-80GB", "ubuntu-22.04", driver="550").driver["kernel_modules"] == "proprietary"


def test_blackwell_needs_570():
    with pytest.raises(StackConflict) as exc:
        resolve("B200", "ubuntu-24.04", driver="550")
    assert "570" in exc.value.conflicts[0]
    assert resolve("B200", "ubuntu-24.04", driver="570").driver["kernel_modules"] == "open"


def test_b200_exact_version_floor():
    with pytest.raises(StackConflict):
        resolve("B200", "ubuntu-24.04", driver="570.124.06")
    assert resolve("B200", "ubuntu-24.04", driver="570.133.20").driver["version"] == "570.133.20"


def test_volta_dropped_after_580_and_by_cuda_13():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", "ubuntu-22.04", driver="590")
    assert "up to driver branch 580" in exc.value.conflicts[0]
    with pytest.raises(StackConflict) as exc:
        resolve("V100", "ubuntu-22.04", cuda="13.0")
    assert "last CUDA for it is 12.9" in exc.value.conflicts[0]
    stack = resolve("V100", "ubuntu-22.04")
    assert stack.driver["branch"] == "580" and stack.cuda["version"].startswith("12.9")


def test_fabricmanager_only_with_nvswitch_at_driver_version():
    plain = resolve("H100-SXM", "ubuntu-22.04", driver="570")
    assert plain.fabricmanager is None and plain.nscq is None and plain.nvlsm is None
    hgx = resolve("H100-SXM", "ubuntu-22.04", driver="570", nvswitch=True, gpus=8)
    assert hgx.fabricmanager == {"version": hgx.driver["version"], "packages": [
        {"name": "nvidia-fabricmanager-570", "version": f"{hgx.driver['version']}-1"}]}


# Expected names from NVIDIA's packaging: apt-packaging-libnvidia-nscq ("libnvidia-nscq-XXX_525.85.12-1"),
# gpu-driver-container (`nvidia-fabricmanager=${DRIVER_VERSION}-1`, `libnvidia-nscq=${DRIVER_VERSION}-1` from
# R580), ubuntu2404/x86_64 files nvidia-fabricmanager_580.105.08-1 / libnvidia-nscq_580.105.08-1, rhel9 files
# nvidia-fabricmanager-610.43.02-1.el9 / libnvidia-nscq-610.43.02-1.el9, nvlsm_2025.10.11-1 (Fabric Manager user
# guide: fourth-generation NVSwitch systems need NVLSM).
@pytest.mark.parametrize("gpu,os_key,driver,fabric,nvlsm", [
    ("H100-SXM", "ubuntu-22.04", "570.148.08",
     [("nvidia-fabricmanager-570", "570.148.08-1"), ("libnvidia-nscq-570", "570.148.08-1")], None),
    ("H200-SXM", "rocky-9", "570.148.08",
     [("nvidia-fabric-manager", "570.148.08-1"), ("libnvidia-nscq-570", "570.148.08-1")], None),
    ("B200", "ubuntu-24.04", "570.148.08",
     [("nvidia-fabricmanager-570", "570.148.08-1"), ("libnvidia-nscq-570", "570.148.08-1")], "2025.10.11-1"),
    ("B200", "ubuntu-24.04", "580.105.08",
     [("nvidia-fabricmanager", "580.105.08-1"), ("libnvidia-nscq", "580.105.08-1")], "2025.10.11-1"),
    ("B300", "rhel-9", "610.43.02",
     [("nvidia-fabricmanager", "610.43.02-1.el9"), ("libnvidia-nscq", "610.43.02-1.el9")], "2025.10.11-1"),
])
def test_nvswitch_stacks_get_fabric_manager_nscq_and_on_blackwell_nvlsm(gpu, os_key, driver, fabric, nvlsm):
    stack = resolve(gpu, os_key, nvswitch=True, gpus=8, driver=driver)
    got = [(p["name"], p["version"]) for p in stack.fabricmanager["packages"] + stack.nscq["packages"]]
    assert got == fabric and stack.nscq["version"] == driver
    assert stack.nvlsm == (None if nvlsm is None else {"version": nvlsm.removesuffix("-1"),
                                                       "packages": [{"name": "nvlsm", "version": nvlsm}]})
    assert check_stack(stack.to_dict(), gpu, os_key, True, 8) == []


def test_stacks_locked_before_nscq_and_nvlsm_load_without_them():
    data = resolve("H100-SXM", "ubuntu-22.04", nvswitch=True, driver="570").to_dict()
    del data["nscq"], data["nvlsm"]
    stack = Stack.from_dict(data)
    assert stack.nscq is None and stack.nvlsm is None
    assert [p["name"] for p in stack.packages()][:2] == ["nvidia-open-570", "nvidia-fabricmanager-570"]


def test_nvswitch_on_pcie_gpu_conflicts():
    with pytest.raises(StackConflict) as exc:
        resolve("RTX-4090", "ubuntu-22.04", nvswitch=True)
    assert "NVSwitch" in exc.value.conflicts[0]


def test_nccl_built_for_chosen_cuda():
    assert resolve("H100-SXM", "ubuntu-22.04", cuda="12.8").nccl["packages"][0] == {
        "name": "libnccl2", "version": "2.26.2-1+cuda12.8"}
    assert resolve("H100-SXM", "ubuntu-22.04", cuda="12.9", nccl="2.26").nccl["version"] == "2.26.5"
    with pytest.raises(StackConflict) as exc:
        resolve("H100-SXM", "ubuntu-22.04", cuda="12.8", nccl="2.15")
    assert "no build for CUDA" in exc.value.conflicts[0]


def test_pytorch_wheel_fits_arch_and_cuda():
    stack = resolve("RTX-5090", "ubuntu-24.04", cuda="12.8")
    assert stack.pytorch == {"version": "2.11", "wheel": "cu128"}
    with pytest.raises(StackConflict):
        resolve("B200", "ubuntu-24.04", pytorch="2.6")
    assert resolve("H100-SXM", "ubuntu-22.04", pytorch="2.7", cuda="12.8").pytorch["wheel"] == "cu128"


def test_driver_packages_by_os():
    u = resolve("H100-SXM", "ubuntu-22.04", driver="570.148.08")
    assert u.driver["packages"] == [{"name": "nvidia-open-570", "version": "570.148.08-1ubuntu1"}]
    r = resolve("H100-SXM", "rocky-9", driver="570.148.08")
    assert {"name": "nvidia-driver", "version": "570.148.08-1.el9"} in r.driver["packages"]
    new = resolve("H100-SXM", "debian-12", driver="595")
    assert new.driver["packages"][0]["name"] == "nvidia-driver-pinning-595"


def test_to_dict_contract_all_versions_strings():
    data = resolve("H200", "ubuntu-24.04", nvswitch=True, gpus=8).to_dict()
    assert list(data) == ["gpu", "os", "driver", "cuda", "forward_compat", "nccl", "container_toolkit",
                          "fabricmanager", "dcgm", "ngc_pytorch", "pytorch", "nscq", "nvlsm"]
    for part in ("driver", "cuda", "nccl", "container_toolkit", "fabricmanager", "dcgm", "nscq"):
        assert isinstance(data[part]["version"], str)
        assert all(isinstance(p["name"], str) and isinstance(p["version"], str) for p in data[part]["packages"])
    json.dumps(data)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"os": "windows-11"}, "unknown OS 'windows-11'. Accepted: ubuntu-22.04, ubuntu-24.04, debian-12, rhel-9, rocky-9"),
    ({"gpus": 0}, "gpus must be a positive whole number, not 0"),
    ({"gpu": "H1000"}, UNKNOWN_GPU),
    *[({key: text}, message) for key, text, message in BAD_PINS],
], ids=["os", "gpus", "gpu", *BAD_IDS])
def test_bad_inputs_are_input_errors(kwargs, message):
    """Bad input is refused before anything resolves, with the same words as inventory.check (gpuprov.stack.inputs)."""
    args = {"gpu": "H100", "os": "ubuntu-22.04", **kwargs}
    with pytest.raises(InputError) as exc:
        resolve(**args)
    assert not isinstance(exc.value, StackConflict)
    assert (exc.value.exit_code, exc.value.message) == (2, message)


def test_defaults_prefer_stable_branches():
    assert table("drivers")["branches"][resolve("H100", "ubuntu-22.04").driver["branch"]]["kind"] in (
        "production", "long_term")


def test_resolve_for_host_facts_override_inventory():
    host_vars = {"hardware": {"gpu": "A100-SXM4-80GB", "count": 8, "nvswitch": False}, "stack": {"cuda": "12.8"}}
    facts = {"host": "gpu01", "os": {"key": "ubuntu-22.04"}, "nvswitch_count": 4,
             "pci_gpus": [{"device_id": "2330", "model": "H100-SXM"}] * 8}
    stack = resolve_for_host(host_vars, None, facts)
    assert stack.gpu["model"] == "H100-SXM" and stack.fabricmanager is not None
    assert check_stack(stack.to_dict(), "H100-SXM", "ubuntu-22.04", True, 8) == []
    assert resolve_for_host(host_vars, "debian-12").gpu["model"] == "A100-SXM4-80GB"


def test_resolve_for_host_rejects_unknown_stack_vars():
    with pytest.raises(InputError):
        resolve_for_host({"hardware": {"gpu": "T4"}, "stack": {"cudaa": "12.8"}}, "debian-12")


def _b200_facts(**overrides):
    facts = {"host": "gpu01", "os": {"key": "ubuntu-24.04"}, "nvswitch_count": 0,
             "pci_gpus": [{"device_id": "2901", "model": "B200"}] * 8}
    return {**facts, **overrides}


def test_blackwell_nvswitches_are_no_pci_devices_so_the_inventory_decides():
    stack = resolve_for_host({"hardware": {"gpu": "B200", "count": 8, "nvswitch": True}}, None, _b200_facts())
    assert stack.fabricmanager is not None and stack.nvlsm is not None
    assert resolve_for_host({"hardware": {"gpu": "B200", "count": 8}}, None, _b200_facts()).fabricmanager is None


def test_hopper_without_nvswitch_in_the_pci_scan_has_none_whatever_the_inventory_says():
    facts = _b200_facts(pci_gpus=[{"device_id": "2330", "model": "H100-SXM"}] * 8)
    stack = resolve_for_host({"hardware": {"gpu": "H100-SXM", "nvswitch": True}}, None, facts)
    assert stack.fabricmanager is None and stack.nscq is None


def test_an_empty_pci_scan_leaves_nvswitch_to_the_inventory():
    facts = _b200_facts(pci_gpus=[])
    stack = resolve_for_host({"hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True}}, None, facts)
    assert stack.fabricmanager is not None and stack.nscq is not None and stack.nvlsm is None
