"""Issue 22 item 5: the catalog knows what the README names (GH200, H100 NVL), an HGX B200 without nvswitch warns,
a pinned end-of-life driver branch warns, and an ambiguous --gpu says which model it took.

Every expected value below is copied from the source named beside it, not from the code:
  [PCI]    pci.ids, github.com/pciutils/pciids @ c1c12547d626: 2321 "GH100 [H100L 94GB]", 2342 "GH100 [GH200 120GB /
           480GB]", 2348 "GH100 [GH200 144G HBM3e]"
  [DCGM]   https://github.com/NVIDIA/DCGM/blob/72fa3feaa67d716a75323a8f47c34ff3ee73f824/nvvs/diag-skus.yaml.in
           memory_bandwidth "shows": H100NVL (2321) ~2725000, SkinnyJoe A02 (2342) ~2840000, H100 144GB HBM3 (2348)
           ~3120000
  [H100]   https://www.nvidia.com/en-us/data-center/h100/ (H100 NVL column, as quoted in the shared reference notes,
           section 7): 94 GB, BF16 1,671 TFLOPS with sparsity, 3.9 TB/s, PCIe Gen5 128 GB/s
  [GH200]  https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ per GPU, through
           https://github.com/stas00/ml-engineering/blob/744d01e18b79512572f64a6bbd8b5f4a725203a7/compute/accelerator/README.md
           (bf16 989 dense, tf32 494.5; memory 96 GB HBM3 at 4.00 TB/s); CUDA-GPUS: GH200 compute capability 9.0
  [MAMF]   the same stas00 page: "NVIDIA GH200 SXM | 828.6 | 989 | 83.8% | 1024x15360x4096 | ... 141GiB HBM3e version"
  [MAG]    https://github.com/mag-/gpu_benchmark/blob/2218e0a33df689202cde34c794231c3f1acdeca3/README.md
           "NVIDIA GH200 96GB | 7616x17664x4480 | 852.5", "NVIDIA GH200 144G HBM3e | 7616x17664x4480 | 853.8"
  [SMI]    names printed by nvidia-smi / CUDA in public logs: "NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e",
           "NVIDIA H100 NVL"
  [DRV580] https://docs.nvidia.com/datacenter/tesla/drivers/supported-drivers-and-cuda-toolkit-versions.html (v580,
           2025-08-04): R535 LTSB June 2026, R570 PB February 2026, R580 LTSB August 2028; "All other previous driver
           branches not listed in the table above (such as R575, R565, R560, R550, R525, ...) are end of life."
  [DRV615] https://docs.nvidia.com/datacenter/tesla/drivers/615/supported-drivers-and-cuda-toolkit-versions.html:
           R535 LTSB June 2026, R580 LTSB June 2028, R595 PB March 2027, R610 NFB August 2026
  [DRV620] https://docs.nvidia.com/datacenter/tesla/drivers/620/supported-drivers-and-cuda-toolkit-versions.html:
           R580 LTSB June 2028, R595 PB March 2027, R620 LTSB September 2029; "New Feature Branches are short-lived
           and do not have an end-of-life date"
  [FM]     Fabric Manager user guide, "Systems Using Fourth Generation NVSwitches": DGX B200, HGX B200 (8 GPUs),
           which also need the NVLink Subnet Manager
"""

from __future__ import annotations

from datetime import date

import pytest
from invoke import Context

from gpuprov.catalog import by_pci_id, choose, expected_figures, lookup
from gpuprov.core.errors import InputError
from gpuprov.inventory import load_inventory
from gpuprov.inventory.checks import hardware_warning
from gpuprov.stack.data import table
from gpuprov.stack.resolve import driver_eol_warning, resolve, resolve_for_host, supported_branches

TODAY = date(2026, 12, 3)
DRV580 = "https://docs.nvidia.com/datacenter/tesla/drivers/supported-drivers-and-cuda-toolkit-versions.html"
DRV615 = "https://docs.nvidia.com/datacenter/tesla/drivers/615/supported-drivers-and-cuda-toolkit-versions.html"
DRV620 = "https://docs.nvidia.com/datacenter/tesla/drivers/620/supported-drivers-and-cuda-toolkit-versions.html"


# ---- GH200 and H100 NVL in the catalog -------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA GH200 480GB", "GH200-96GB"), ("NVIDIA GH200 144G HBM3e", "GH200-144GB"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("gh200", "GH200-96GB"), ("h100-nvl", "H100-NVL"),
])
def test_the_names_nvidia_smi_prints_find_the_new_models(name, key):
    """[SMI]"""
    assert lookup(name).key == key


@pytest.mark.parametrize(("pci", "key"), [("2321", "H100-NVL"), ("10de:2342", "GH200-96GB"), ("0x2348", "GH200-144GB")])
def test_pci_ids_of_the_new_models(pci, key):
    """[PCI], [DCGM]"""
    assert by_pci_id(pci).key == key


def test_h100_nvl_datasheet_figures():
    """[H100]: dense = sparse / 2; PCIe Gen5 x16 is 63.0 GB/s one way (128 GB/s both ways)."""
    model, row = lookup("H100-NVL"), table("gpus")["models"]["H100-NVL"]
    assert (model.arch, model.compute_capability, model.memory_gib, model.form_factor) == ("hopper", "9.0", 94, "pcie")
    assert model.bf16_tflops == model.fp16_tflops == 1671 / 2 and model.mem_bw_gbs == 3900
    assert row["pcie_gbs"] == 63.0 and not model.nvswitch_capable


@pytest.mark.parametrize(("key", "memory", "bandwidth"), [("GH200-96GB", 96, 4000), ("GH200-144GB", 144, 4900)])
def test_gh200_datasheet_figures(key, memory, bandwidth):
    """[GH200]: per GPU the H100 SXM's tensor figures; the host link is NVLink-C2C, not PCIe."""
    model, row = lookup(key), table("gpus")["models"][key]
    assert (model.arch, model.compute_capability, model.memory_gib, model.mem_bw_gbs) == ("hopper", "9.0", memory,
                                                                                         bandwidth)
    assert model.bf16_tflops == model.fp16_tflops == 989 and row["tf32_tflops"] == 494.5 and row["pcie_gbs"] is None


def test_expected_figures_of_the_new_models_are_the_published_ones():
    """[MAMF] GH200 HBM3e 828.6 = 83.8 % of 989; [MAG] GH200 96GB 852.5; [DCGM] device copies in GB/s."""
    gh144, gh96, nvl = (expected_figures(lookup(k)) for k in ("GH200-144GB", "GH200-96GB", "H100-NVL"))
    assert gh144["bf16_tflops"].value == 828.6 and round(100 * 828.6 / 989, 1) == 83.8
    assert "stas00/ml-engineering" in gh144["bf16_tflops"].basis
    assert gh96["bf16_tflops"].value == 852.5 and "mag-/gpu_benchmark" in gh96["bf16_tflops"].basis
    assert (gh96["d2d_gbs"].value, gh144["d2d_gbs"].value, nvl["d2d_gbs"].value) == (2840, 3120, 2725)
    assert gh96["h2d_gbs"] is None and nvl["h2d_gbs"].value == 55.43


def test_the_new_models_resolve_a_hopper_stack():
    stack = resolve("GH200-144GB", "ubuntu-24.04", today=TODAY)
    assert stack.gpu == {"model": "GH200-144GB", "arch": "hopper", "compute_capability": "9.0", "datacenter": True}
    assert stack.fabricmanager is None and stack.warnings == []


# ---- an HGX B200 without nvswitch --------------------------------------------------------------------------------

def test_eight_b200_without_nvswitch_warn_that_hgx_b200_needs_it():
    """[FM]: HGX B200 is 8 GPUs on fourth-generation NVSwitches (no PCI devices), which need FM and NVLSM."""
    warning = hardware_warning({"gpu": "B200", "count": 8})
    assert warning.startswith("8 x B200 without nvswitch: an HGX B200 joins its 8 GPUs through NVSwitches")
    assert "Fabric Manager and the NVLink Subnet Manager" in warning and "Set nvswitch: true" in warning


@pytest.mark.parametrize("hardware", [
    {"gpu": "B200", "count": 8, "nvswitch": True}, {"gpu": "B200", "count": 8, "nvswitch": False},
    {"gpu": "B200", "count": 1}, {"gpu": "H100-SXM", "count": 8}, {"gpu": "GB200", "count": 4}, {"count": 8}, None,
])
def test_no_warning_where_nvswitch_is_given_or_the_facts_can_tell(hardware):
    """Hopper's NVSwitches are PCI devices (22a3): the facts decide there."""
    assert hardware_warning(hardware) is None


INVENTORY = """\
hosts:
  gpu01:
    address: 10.0.0.1
    vars:
      hardware: {gpu: B200, count: 8}
      stack: {driver: "535"}
"""


def test_hook_inventory_check_shows_both_warnings_at_their_place(tmp_path):
    """Needs the hooks in gpuprov/inventory/merge.py (hardware) and gpuprov/inventory/schema.py (driver pin)."""
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    warnings = load_inventory(path).warnings
    assert f"{path}:5:7: hosts.gpu01.vars.hardware: host gpu01: 8 x B200 without nvswitch" in "\n".join(warnings)
    assert any(w.startswith(f"{path}:6:15: hosts.gpu01.vars.stack.driver: driver branch R535") for w in warnings)


# ---- end-of-life driver branches ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("branch", "eol", "source"), [
    ("535", "2026-06", DRV615), ("570", "2026-02", DRV580), ("580", "2028-06", DRV620), ("595", "2027-03", DRV620),
    ("610", "2026-08", DRV615), ("620", "2029-09", DRV620), ("525", "by 2025-08", DRV580),
    ("550", "by 2025-08", DRV580), ("575", "by 2025-08", DRV580), ("590", None, None),
])
def test_each_branch_has_nvidias_end_of_life_and_page(branch, eol, source):
    """[DRV580], [DRV615], [DRV620]; R580: the newer pages' June 2028; R590: a new feature branch, no date."""
    drivers = table("drivers")
    row = drivers["branches"][branch]
    assert row["eol"] == eol
    assert (drivers["eol_sources"][row["eol_source"]] if row["eol_source"] else None) == source


def test_every_branch_with_an_end_of_life_names_its_page():
    drivers = table("drivers")
    for branch, row in drivers["branches"].items():
        assert (row["eol"] is None) == (row["eol_source"] is None), branch
        assert row["eol_source"] is None or drivers["eol_sources"][row["eol_source"]].startswith("https://docs.nvidia")


def test_a_pinned_branch_past_its_end_of_life_warns_with_the_date_the_page_and_where_to_go():
    """On 2026-12-03: R535 ended June 2026 [DRV615]; R595 (March 2027) and R580 (June 2028) are supported [DRV620]
    (R620 too, but gpuprov knows no published R620 version to pin)."""
    warning = driver_eol_warning("535", TODAY)
    assert warning == (
        f"driver branch R535 (long-term support branch) reached its end of life in June 2026 per NVIDIA's data center "
        f"driver support page ({DRV615}): it gets no more bug or security fixes; pin a supported branch instead: "
        "R595 (production branch, end of life March 2027), R580 (long-term support branch, end of life June 2028)")


def test_a_branch_listed_as_ended_without_a_date_says_so():
    """[DRV580] lists R550 as end of life, with no date, on a page of August 2025."""
    assert "R550 (production branch) is listed as end of life (by August 2025, no date given)" in driver_eol_warning(
        "550", TODAY)


@pytest.mark.parametrize(("branch", "day", "past"), [
    ("535", date(2026, 5, 31), False), ("535", date(2026, 6, 1), True), ("580", TODAY, False),
    ("595", TODAY, False), ("595", date(2027, 3, 1), True), ("590", TODAY, False), ("620", TODAY, False),
    ("610", TODAY, True), ("570", TODAY, True),
])
def test_past_from_the_first_day_of_the_end_of_life_month(branch, day, past):
    assert (driver_eol_warning(branch, day) is not None) == past


def test_the_branches_to_move_to_drive_the_gpu():
    """Volta's last branch is R580 (ARCH-MATRIX), so a V100 host is pointed at R580 only."""
    assert supported_branches(TODAY) == ["595", "580"]
    assert supported_branches(TODAY, lookup("V100-SXM2-16GB")) == ["580"]
    assert supported_branches(date(2027, 3, 1)) == ["580"]


def test_resolve_warns_for_a_pinned_end_of_life_branch_only():
    pinned = resolve("H100-SXM", "ubuntu-22.04", driver="535", today=TODAY)
    assert pinned.driver["branch"] == "535" and len(pinned.warnings) == 1
    assert pinned.warnings[0].startswith("driver branch R535 (long-term support branch) reached its end of life")
    exact = resolve("H100-SXM", "ubuntu-22.04", driver="570.211.01", today=TODAY)
    assert exact.warnings[0].startswith("driver branch R570 (production branch) reached its end of life in February")
    assert resolve("H100-SXM", "ubuntu-22.04", driver="580", today=TODAY).warnings == []
    assert resolve("H100-SXM", "ubuntu-22.04", today=TODAY).warnings == []
    assert "warnings" not in pinned.to_dict()


def test_an_inventory_pin_warns_through_resolve_for_host():
    stack = resolve_for_host({"hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True},
                              "stack": {"driver": "R570"}}, "ubuntu-22.04", today=TODAY)
    assert len(stack.warnings) == 1 and "R570" in stack.warnings[0] and "February 2026" in stack.warnings[0]


# ---- an ambiguous --gpu ---------------------------------------------------------------------------------------------

def test_a100_says_which_model_it_took_and_what_else_it_could_mean():
    choice = choose("A100")
    assert choice.model.key == "A100-SXM4-40GB"
    assert [m.key for m in choice.alternatives] == ["A100-PCIE-40GB", "A100-PCIE-80GB", "A100-SXM4-80GB"]
    assert choice.warning() == (
        "GPU 'A100' could mean several catalog models; gpuprov took A100-SXM4-40GB (SXM, 40 GB). The others: "
        "A100-PCIE-40GB, A100-PCIE-80GB, A100-SXM4-80GB. Give the exact model to choose another (invoke stack.matrix "
        "--component gpus lists them)")


@pytest.mark.parametrize(("name", "others"), [
    ("H100", ["H100-PCIE", "H100-NVL"]), ("GH200", ["GH200-144GB"]), ("a100-80gb", ["A100-PCIE-80GB"]),
    ("V100", ["V100-SXM2-32GB", "V100-PCIE-16GB", "V100-PCIE-32GB"]),
])
def test_family_names_are_ambiguous(name, others):
    assert [m.key for m in choose(name).alternatives] == others


@pytest.mark.parametrize("name", ["A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "H100-SXM", "NVIDIA H100 80GB HBM3",
                                  "B200", "A10", "L4", "H200", "NVIDIA GH200 480GB"])
def test_exact_names_are_not(name):
    assert choose(name).alternatives == () and choose(name).warning() is None


def test_an_unknown_name_is_still_bad_input():
    with pytest.raises(InputError) as exc:
        choose("A1000")
    assert exc.value.exit_code == 2


def test_resolve_carries_the_ambiguity_warning():
    assert resolve("A100", "ubuntu-22.04", today=TODAY).warnings == [choose("A100").warning()]
    assert resolve("A100-SXM4-80GB", "ubuntu-22.04", today=TODAY).warnings == []


def test_hook_stack_resolve_prints_the_warnings_on_stderr(capsys):
    """Needs the hook in gpuprov/tasks/stack.py; stdout stays one JSON document with --json."""
    from gpuprov.tasks import stack as stack_tasks

    stack_tasks.resolve(Context(), gpu="A100", os="ubuntu-22.04", driver="535", json_=True)
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and out.startswith("{")
    lines = err.splitlines()
    assert lines[0].startswith("warning: GPU 'A100' could mean several catalog models; gpuprov took A100-SXM4-40GB")
    assert lines[1].startswith("warning: driver branch R535 (long-term support branch) reached its end of life")


def test_hook_an_ambiguous_inventory_gpu_warns_at_its_place(tmp_path):
    """Needs the hook in gpuprov/inventory/schema.py (gpu)."""
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  gpu01:\n    address: 10.0.0.1\n    vars:\n      hardware: {gpu: A100, count: 8, "
                    "nvswitch: true}\n")
    inv = load_inventory(path)
    assert inv.hosts["gpu01"].vars["hardware"]["gpu"] == "A100-SXM4-40GB"
    assert inv.warnings == [f"{path}:5:18: hosts.gpu01.vars.hardware.gpu: {choose('A100').warning()}"]
