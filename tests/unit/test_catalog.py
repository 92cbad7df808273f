"""GPU catalog: names, aliases, PCI ids (checked against real lspci / nvidia-smi captures)."""

import pytest

from gpuprov.catalog import (
    FOURTH_GENERATION,
    by_pci_id,
    close_names,
    find,
    is_nvswitch,
    lookup,
    models,
    nvswitch_generation,
)
from gpuprov.core.errors import InputError


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("h100", "H100-SXM"), ("H100-SXM", "H100-SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"), ("a100-80gb", "A100-SXM4-80GB"), ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("rtx-4090", "RTX-4090"), ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA A10", "A10"), ("b200", "B200"),
])
def test_lookup_by_name_alias_and_smi_name(name, key):
    assert lookup(name).key == key


# pci.ids @ c1c12547d626: 2901 "GB100 [B200]", 2909 "GB100 [HGX B200 168GB]", 3182 "GB110 [B300 SXM6 AC]"
@pytest.mark.parametrize("pci,key", [("20b2", "A100-SXM4-80GB"), ("2236", "A10"), ("2330", "H100-SXM"),
                                     ("0x2335", "H200-SXM"), ("10de:2941", "GB200"), ("2684", "RTX-4090"),
                                     ("2901", "B200"), ("2909", "B200"), ("3182", "B300")])
def test_by_pci_id(pci, key):
    assert by_pci_id(pci).key == key


def test_unknown_pci_id_is_none():
    assert by_pci_id("ffff") is None


def test_nvswitch_ids():
    assert is_nvswitch("1af1") and is_nvswitch("22a3") and is_nvswitch("10de:1AF1")
    assert not is_nvswitch("20b2")


def test_blackwell_baseboards_carry_fourth_generation_nvswitches():
    """Fabric Manager user guide: "Systems Using Fourth Generation NVSwitches" are DGX/HGX B200 and HGX B100."""
    assert nvswitch_generation(lookup("B200").arch) == FOURTH_GENERATION == nvswitch_generation(lookup("B300").arch)
    assert nvswitch_generation(lookup("H100").arch) == 3 and nvswitch_generation("ada") is None


def test_unknown_name_suggests_and_lists():
    """lookup shares gpuprov.stack.inputs.gpu_model's rule and did-you-mean (closest catalog spellings)."""
    with pytest.raises(InputError) as exc:
        lookup("rtx4090")
    assert exc.value.exit_code == 2
    assert exc.value.message == (
        "unknown GPU model 'rtx4090' (did you mean 'RTX-4090', 'RTX-5090', '4090'?). Accepted: a catalog model "
        "(V100-SXM2-16GB, V100-SXM2-32GB, V100-PCIE-16GB, V100-PCIE-32GB, T4, A10, A100-PCIE-40GB, A100-SXM4-40GB, "
        "A100-PCIE-80GB, A100-SXM4-80GB, L4, L40S, H100-PCIE, H100-SXM, H100-NVL, H200-SXM, GH200-96GB, GH200-144GB, "
        "B200, GB200, B300, RTX-4090, RTX-5090), one of its aliases, or the name nvidia-smi prints for it; invoke "
        "stack.matrix --component gpus lists them all")


def test_close_names_are_spelled_as_the_catalog_spells_them():
    assert close_names("a100 80gb") == ["A100-80GB", "H100-80GB", "A100-40GB"]
    assert close_names("nvidia h100 80gb hbm")[0] == "NVIDIA H100 80GB HBM3"
    assert close_names("zzz") == []


def test_find_ignores_case_and_surrounding_spaces():
    assert find("  nvidia l40s ").key == "L40S" and find("L40") is None


def test_fixture_ids_resolve():
    """Device ids in the shared lspci captures map to catalog models or NVSwitches."""
    for device in ("20b2", "2236", "2941"):
        assert by_pci_id(device) is not None
    assert is_nvswitch("1af1")


def test_catalog_integrity():
    seen = set()
    for model in models().values():
        assert model.arch and model.compute_capability.count(".") == 1
        assert model.form_factor in ("sxm", "pcie")
        assert model.mem_bw_gbs > 0 and model.memory_gib > 0
        assert all(len(p) == 4 and p == p.lower() for p in model.pci_ids)
        assert not seen & set(model.pci_ids)
        seen |= set(model.pci_ids)
        if model.bf16_tflops is not None:
            assert model.bf16_tflops < 5000   # dense, never the sparse figure above B200's 2250
