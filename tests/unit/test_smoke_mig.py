"""MIG in the suite: which share of its GPU a MIG instance is judged against, and the checks that skip on a MIG host.

Expected values come from NVIDIA's MIG user guide (docs.nvidia.com/datacenter/tesla/mig-user-guide): "MIG Device
Names" ([C c.]G g.MEM gb), "Supported MIG Profiles" (Fraction of SMs: 1g 1/7, 2g 2/7, 3g 3/7, 4g 4/7, 7g 7/7 on
A100/H100; 1g 1/4 on A30), "Getting Started with MIG" (`nvidia-smi -L` lists MIG devices under their GPU), and the
real H100 MIG capture in tests/fixtures/nvidia-smi-table (its MIG devices: 3g.40gb, 2g.20gb and two 1g.10gb).
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov.smoke import nvsmi, torchutil, train_ddp
from gpuprov.smoke.core import Context
from gpuprov.smoke.torchutil import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H100_CSV = FIXTURES / "nvidia-smi-query-csv/h100-sxm5-80gb_query-gpu-allfields_590.48.01_idle.csv"
MIG_NVLINK = FIXTURES / "errors/h100-sxm5-80gb-mig-enabled_nvlink-s_not-supported-in-mig_590.48.01.txt"
# `nvidia-smi -L` on the MIG host of the capture: its GPU line (from the MIG host's nvlink capture) and its four MIG
# devices in the MIG user guide's line format (masked UUIDs as the capture's).
MIG_LIST = (MIG_NVLINK.read_text().splitlines()[0] + "\n"
            "  MIG 3g.40gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000001)\n"
            "  MIG 2g.20gb     Device  1: (UUID: MIG-00000000-0000-0000-0000-000000000002)\n"
            "  MIG 1g.10gb     Device  2: (UUID: MIG-00000000-0000-0000-0000-000000000003)\n"
            "  MIG 1g.10gb     Device  3: (UUID: MIG-00000000-0000-0000-0000-000000000004)\n")
H100 = "NVIDIA H100 80GB HBM3"


def query_line(mig_mode: str) -> str:
    """The suite's `--query-gpu` answer on the captured H100, `mig.mode.current` set to `mig_mode`."""
    row = nvsmi.parse_query_csv_with_header(H100_CSV.read_text())[0]
    row["mig.mode.current"] = mig_mode
    return ", ".join(row[field] for field in nvsmi.QUERY_FIELDS) + "\n"


def host(mig_mode: str | None) -> Context:
    """A context whose nvidia-smi answers as the captured H100 with MIG `mig_mode` (None: no nvidia-smi)."""
    ctx = Context({})
    calls = []

    def run(argv, timeout=30.0):
        calls.append(list(argv))
        if mig_mode is None:
            return 127, "", "nvidia-smi: not found"
        assert argv == nvsmi.QUERY_ARGV
        return 0, query_line(mig_mode), ""

    ctx.run = run
    ctx.calls = calls
    return ctx


def test_mig_devices_below_their_gpu_are_not_gpus():
    assert [g["index"] for g in nvsmi.parse_list(MIG_LIST)] == [0]


@pytest.mark.parametrize("profile, slices", [
    ("1g.10gb", 1), ("1g.10gb+me", 1), ("1g.20gb", 1), ("2g.20gb", 2), ("3g.40gb", 3), ("4g.40gb", 4),
    ("7g.80gb", 7), ("1c.3g.20gb", 1), ("2c.3g.20gb", 2), ("1g.6gb", 1), ("4g.24gb", 4),
])
def test_compute_slices_of_the_documented_profile_names(profile, slices):
    assert nvsmi.mig_slices(profile) == slices


def test_unknown_profile_names_have_no_share():
    assert nvsmi.mig_slices("10gb") is None
    assert nvsmi.mig_slices("MIG 1g.10gb") is None


@pytest.mark.parametrize("name, share", [
    (f"{H100} MIG 1g.10gb", Fraction(1, 7)),
    (f"{H100} MIG 3g.40gb", Fraction(3, 7)),
    (f"{H100} MIG 7g.80gb", Fraction(1)),
    ("NVIDIA A100-SXM4-40GB MIG 2g.10gb", Fraction(2, 7)),
    ("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", Fraction(1, 7)),
    ("NVIDIA A30 MIG 1g.6gb", Fraction(1, 4)),
])
def test_an_instance_is_judged_against_its_fraction_of_sms(name, share):
    judgement = nvsmi.mig_judgement(host("Enabled"), (name,))
    assert not judgement.skip
    assert judgement.share == share
    assert f"judged against {share.numerator}/{share.denominator} of the GPU's compute figures" in judgement.note


def test_the_datasheet_of_an_instance_scales_its_compute_figures_only():
    judgement = nvsmi.mig_judgement(host("Enabled"), (f"{H100} MIG 1g.10gb",))
    datasheet = {"bf16_tflops": 989.4, "fp16_tflops": 989.4, "tf32_tflops": 494.7, "mem_bw_gbs": 3350,
                 "pcie_gbs": 64}
    scaled = judgement.scaled(datasheet)
    assert scaled["bf16_tflops"] == pytest.approx(989.4 / 7)
    assert scaled["tf32_tflops"] == pytest.approx(494.7 / 7)
    assert (scaled["mem_bw_gbs"], scaled["pcie_gbs"]) == (3350, 64)
    assert datasheet["bf16_tflops"] == 989.4


def test_the_checks_config_carries_the_scaled_figures_and_says_why():
    judgement = nvsmi.mig_judgement(host("Enabled"), (f"{H100} MIG 3g.40gb",))
    config = {"expected": {"bf16_tflops": 700.0, "d2d_gbs": 2900.0},
              "expected_basis": {"bf16_tflops": "mamf-finder H100 SXM"}, "threshold_pct": 80}
    scaled = judgement.config(config)
    assert scaled["expected"] == {"bf16_tflops": pytest.approx(300.0), "d2d_gbs": 2900.0}
    assert scaled["expected_basis"]["bf16_tflops"] == (
        "mamf-finder H100 SXM, times 3/7 (MIG 3g.40gb of NVIDIA H100 80GB HBM3: judged against 3/7 of the GPU's "
        "compute figures (its compute slices))")
    assert "d2d_gbs" not in scaled["expected_basis"] and scaled["threshold_pct"] == 80
    assert config["expected"]["bf16_tflops"] == 700.0
    assert nvsmi.mig_judgement(host("Disabled"), (H100,)).config(config) is config


def test_whole_gpus_keep_the_datasheet():
    ctx = host("Disabled")
    judgement = nvsmi.mig_judgement(ctx, (H100, H100))
    assert (judgement.share, judgement.note, judgement.skip) == (1, "", "")
    assert judgement.scaled({"bf16_tflops": 989.4}) == {"bf16_tflops": 989.4}
    assert nvsmi.mig_judgement(host(None), ()).share == 1


def test_unknown_shares_are_skipped_with_the_reason():
    enabled_but_unnamed = nvsmi.mig_judgement(host("Enabled"), (H100,))
    assert enabled_but_unnamed.skip.startswith("MIG is enabled on GPU 0 (00000000:00:09.0) but CUDA names no MIG "
                                               "device")
    mixed = nvsmi.mig_judgement(host("Enabled"), (f"{H100} MIG 1g.10gb", f"{H100} MIG 3g.40gb"))
    assert "MIG devices of different sizes" in mixed.skip
    odd = nvsmi.mig_judgement(host("Enabled"), (f"{H100} MIG 10gb",))
    assert "cannot tell the share" in odd.skip


def test_mig_gpus_reads_mig_mode_current():
    assert nvsmi.mig_gpus(host("Enabled")) == ["GPU 0 (00000000:00:09.0)"]
    assert nvsmi.mig_gpus(host("Disabled")) == []
    assert nvsmi.mig_gpus(host("[N/A]")) == []
    assert nvsmi.mig_gpus(host(None)) == []


def test_train_ddp_skips_on_a_mig_host_and_says_why():
    result = train_ddp.run(host("Enabled"))
    assert result.status == "skip"
    assert result.reason.startswith("MIG is enabled on GPU 0 (00000000:00:09.0): a CUDA process sees one MIG "
                                    "instance")
    assert result.figures == {"mig_enabled": ["GPU 0 (00000000:00:09.0)"]}


def test_train_ddp_says_mig_before_it_imports_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    result = train_ddp.run(host("Enabled"))
    assert result.status == "skip" and result.figures == {"mig_enabled": ["GPU 0 (00000000:00:09.0)"]}

def test_perf_matmul_skips_when_the_share_is_unknown(monkeypatch):
    from gpuprov.smoke import perf_matmul

    fake_torch = SimpleNamespace()
    monkeypatch.setattr(torchutil, "import_torch", lambda: (fake_torch, ""))
    monkeypatch.setattr(torchutil, "setup_target", lambda torch, config: Target("cuda", 1, (H100,)))
    result = perf_matmul.run(host("Enabled"))
    assert result.status == "skip"
    assert "the share of the GPU measured is unknown, not judged" in result.reason


def test_perf_copy_skips_on_an_instance_smaller_than_its_gpu(monkeypatch):
    from gpuprov.smoke import perf_copy

    monkeypatch.setattr(torchutil, "import_torch", lambda: (SimpleNamespace(), ""))
    monkeypatch.setattr(torchutil, "setup_target",
                        lambda torch, config: Target("cuda", 1, (f"{H100} MIG 1g.10gb",)))
    result = perf_copy.run(host("Enabled"))
    assert result.status == "skip"
    assert result.reason == (f"MIG 1g.10gb of {H100}: its copies follow its memory slices, not judged against the "
                             "whole GPU's figures")


def test_a_whole_gpu_instance_is_not_skipped():
    assert nvsmi.mig_judgement(host("Enabled"), (f"{H100} MIG 7g.80gb",)).not_scaled("perf.copy", "x", 0.0) is None
    assert nvsmi.mig_judgement(host("Disabled"), (H100,)).not_scaled("perf.copy", "x", 0.0) is None
