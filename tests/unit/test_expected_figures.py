"""Per-GPU expected figures (gpuprov/data/gpus.yaml, gpuprov.catalog.expected_figures): the numbers published for
each model, the marked fallbacks, the matmul shape sweep and the burn-in's sustained-load verdict.

Every expected value below is copied from the published source named beside it, not from the code:
  [MAMF]  https://github.com/stas00/ml-engineering/blob/744d01e18b79512572f64a6bbd8b5f4a725203a7/compute/accelerator/README.md#maximum-achievable-matmul-flops-comparison-table
          BF16 table: A100 SXM 271.2 (86.9%), GH200 828.6, A100 PCIe 252.9 (81.1%), H100 SXM 794.5 (80.3%, "H200 is
          the same"), B300 SXM 1769.0 (78.6%), B200 SXM 1745.0 (77.6%), GB200 SXM 1822.0 (72.9%)
  [MAG]   https://github.com/mag-/gpu_benchmark/blob/2218e0a33df689202cde34c794231c3f1acdeca3/README.md
          Stats: NVIDIA L4 91.4 @ 1024x6016x1792, NVIDIA L40S 252.0 @ 4416x3776x3072, NVIDIA H100 PCIe 499.5 @
          6912x16384x2048, NVIDIA GeForce RTX 4090 178.8
  [DCGM]  https://github.com/NVIDIA/DCGM/blob/72fa3feaa67d716a75323a8f47c34ff3ee73f824/nvvs/diag-skus.yaml.in
          memory_bandwidth "shows" figures: H100 80GB HBM3 (2330) ~2540000, H200 (2335) 3110, NVIDIA L40S (26b9)
          ~700000, Nvidia L4 (27b8) ~264610, B200 (2901) 5430000, A100-SXM4-80GB (20b2) ~1564000, Nvidia P1010
          (2331) ~1639000, A100 PCIe (20f1) ~1293000
  [NVBW]  https://github.com/stas00/ml-engineering/blob/744d01e18b79512572f64a6bbd8b5f4a725203a7/network/README.md
          8x H200, PCIe 5 x16 each: nvbandwidth 55.43 GBps host-to-device, 55.06 device-to-host, "88% and 87% of the
          63GBps"
  [212]   https://github.com/NVIDIA/nccl-tests/issues/212 (sjeaugey, 2024-05-06): "On 8 GPUs, you should reach a peak
          busBw of ~480GB/s"
  [NVML]  nvml.h nvmlClocksEventReason*: SwPowerCap 0x4, HwSlowdown 0x8, SyncBoost 0x10, SwThermalSlowdown 0x20,
          HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80
"""

from __future__ import annotations

import pytest

from gpuprov.catalog import EXPECTED_KEYS, expected_figures, lookup, models, pcie_link_gbs
from gpuprov.smoke import burnin, perf_matmul
from gpuprov.stack.data import table
from gpuprov.validation.document import LIMITS, bound
from gpuprov.validation.suite_config import datasheet


@pytest.mark.parametrize(("model", "tflops", "efficiency"), [
    ("H100-SXM", 794.5, 80.3), ("H200-SXM", 794.5, 80.3), ("B200", 1745.0, 77.6), ("B300", 1769.0, 78.6),
    ("GB200", 1822.0, 72.9), ("A100-SXM4-80GB", 271.2, 86.9), ("A100-PCIE-40GB", 252.9, 81.1),
])
def test_matmul_expectations_are_the_published_maxima(model, tflops, efficiency):
    """[MAMF]: the best-shape bf16 figure, and its efficiency column against the datasheet the catalog holds."""
    expected = expected_figures(lookup(model))["bf16_tflops"]
    assert expected.value == tflops
    assert round(100 * expected.value / lookup(model).bf16_tflops, 1) == efficiency
    assert expected.basis.startswith("measured: ") and "stas00/ml-engineering" in expected.basis


@pytest.mark.parametrize(("model", "tflops", "share"), [
    ("L4", 91.4, 75), ("L40S", 252.0, 70), ("H100-PCIE", 499.5, 66),
])
def test_matmul_expectations_of_pcie_cards_come_from_their_sweeps(model, tflops, share):
    """[MAG]; the issue's round shares (L4 about 75 %, L40S about 70 %, H100 PCIe about 66 %)."""
    expected = expected_figures(lookup(model))["bf16_tflops"]
    assert expected.value == tflops and abs(100 * tflops / lookup(model).bf16_tflops - share) < 1
    assert "mag-/gpu_benchmark" in expected.basis


def test_fp16_and_tf32_take_the_measured_bf16_share_and_say_so():
    """No published fp16/tf32 sweep: the H100 SXM's 794.5/989 share of its tf32 datasheet figure 494.5."""
    figures = expected_figures(lookup("H100-SXM"))
    assert figures["tf32_tflops"].value == round(794.5 / 989 * 494.5, 1)
    assert figures["tf32_tflops"].basis.startswith("derived: the measured bf16 share 80.3% of the datasheet's 494.5")


def test_an_unpublished_model_falls_back_and_says_so():
    """T4: no published sweep or DCGM figure; the fallbacks are the lowest published shares (H100 PCIe 499.5/756
    [MAG], H200 3110/4800 [DCGM]); a Turing T4 has no bf16 to expect."""
    figures = expected_figures(lookup("T4"))
    assert figures["bf16_tflops"] is None
    assert figures["fp16_tflops"].value == round(0.66 * 65, 1) and figures["fp16_tflops"].basis.startswith("fallback")
    assert figures["d2d_gbs"].value == round(0.64 * 320, 1) and figures["d2d_gbs"].basis.startswith("fallback")
    fallback = table("gpus")["expected_fallback"]
    assert fallback["matmul_share"]["value"] <= round(499.5 / 756, 2)
    assert fallback["d2d_share"]["value"] <= round(3110 / 4800, 2)


def test_the_rtx_4090_measurement_above_its_datasheet_is_not_used():
    """[MAG] 178.8 TFLOP/s is above the 165.2 whitepaper peak + 5 % that the document check allows: not used."""
    assert bound("perf.matmul", "bf16_tflops", datasheet(lookup("RTX-4090")))[0] < 178.8
    assert expected_figures(lookup("RTX-4090"))["bf16_tflops"].basis.startswith("fallback")


@pytest.mark.parametrize(("model", "gbs"), [
    ("H100-SXM", 2540), ("H200-SXM", 3110), ("L40S", 700), ("L4", 264.61), ("B200", 5430), ("A100-SXM4-80GB", 1564),
    ("H100-PCIE", 1639), ("A100-PCIE-40GB", 1293),
])
def test_device_copy_expectations_are_dcgms_measurements(model, gbs):
    """[DCGM], MB/s as GB/s; the diag's own minimum is 0.75 of it."""
    expected = expected_figures(lookup(model))["d2d_gbs"]
    assert expected.value == gbs and "NVIDIA/DCGM" in expected.basis


def test_host_copies_are_nvbandwidths_share_of_the_link():
    """[NVBW] on Gen5 x16 exactly; PCIe base rates: 32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s one way, so Gen4
    (16 GT/s) x16 links are expected at the same 88 % and 87 % of 31.5."""
    assert pcie_link_gbs(5, 16) == pytest.approx(63.0, abs=0.05) and pcie_link_gbs(4, 8) == pytest.approx(15.75,
                                                                                                          abs=0.01)
    h100 = expected_figures(lookup("H100-SXM"))
    assert (h100["h2d_gbs"].value, h100["d2h_gbs"].value) == (55.43, 55.06)
    l40s = expected_figures(lookup("L40S"))
    assert l40s["h2d_gbs"].value == pytest.approx(55.43 / 63.0 * 31.5, abs=0.05)
    assert l40s["h2d_gbs"].basis.startswith("derived: ") and "Gen4 is unpublished" in l40s["h2d_gbs"].basis
    assert expected_figures(lookup("GB200"))["h2d_gbs"] is None          # NVLink-C2C to Grace, no PCIe link


def test_allreduce_expectation_per_topology():
    """[212]: 8 Hopper GPUs with NVSwitch ~480 GB/s; PCIe GPUs fall back to the link; other topologies and one GPU
    expect nothing."""
    h100, h200 = lookup("H100-SXM"), lookup("H200-SXM")
    assert expected_figures(h100, 8, True)["allreduce_busbw_gbs"].value == 480
    assert expected_figures(h200, 8, True)["allreduce_busbw_gbs"].value == 480
    assert expected_figures(h100, 4, True)["allreduce_busbw_gbs"] is None
    assert expected_figures(lookup("B200"), 8, True)["allreduce_busbw_gbs"] is None
    assert expected_figures(h100, 1, True)["allreduce_busbw_gbs"] is None
    pcie = expected_figures(lookup("L40S"), 4, False)["allreduce_busbw_gbs"]
    assert pcie.basis.startswith("fallback") and pcie.value == expected_figures(lookup("L40S"))["h2d_gbs"].value


def test_every_expectation_is_sourced_and_within_what_the_document_check_allows():
    """A healthy GPU reaching its expected figure must not be refused as a liar by gpuprov.validation.document,
    and every measured figure names a source with an address and a date."""
    sources = table("gpus")["expected_sources"]
    assert all(row["url"].startswith("https://") and row["date"] for row in sources.values())
    checks = {"bf16_tflops": "perf.matmul", "fp16_tflops": "perf.matmul", "tf32_tflops": "perf.matmul",
              "d2d_gbs": "perf.copy", "h2d_gbs": "perf.copy", "d2h_gbs": "perf.copy"}
    for model in models().values():
        for name, row in (table("gpus")["models"][model.key].get("expected") or {}).items():
            assert row["source"] in sources, (model.key, name)
        figures = expected_figures(model, 8, model.nvswitch_capable)
        assert set(figures) == set(EXPECTED_KEYS)
        for name, figure in figures.items():
            if figure is None:
                continue
            assert figure.basis.split(":")[0] in ("measured", "derived", "fallback"), (model.key, name)
            check, key = checks.get(name, "perf.allreduce"), "busbw_gbs" if name.startswith("allreduce") else name
            assert key in LIMITS[check]
            assert figure.value <= bound(check, key, datasheet(model))[0], (model.key, name)


# --- the matmul sweep ------------------------------------------------------------------------------------------

def test_the_sweep_keeps_the_best_shape_and_stops_at_its_deadline():
    rates = {(8192, 8192, 8192): 700.0, (2048, 2048, 13312): 790.0}
    best = perf_matmul.sweep(lambda shape: rates.get(shape, 100.0), perf_matmul.SHAPES, float("inf"))
    assert best == (790.0, "2048x2048x13312", len(perf_matmul.SHAPES))
    # past its deadline the sweep measures the first shape only (never nothing)
    assert perf_matmul.sweep(lambda shape: rates.get(shape, 100.0), perf_matmul.SHAPES, 0.0) == (
        700.0, "8192x8192x8192", 1)


def test_the_sweep_holds_the_published_best_shapes():
    """[MAMF] H100 SXM 2048x2048x13312, B200 1792x16128x3072; [MAG] L4, L40S, H100 PCIe shapes."""
    for shape in ("2048x2048x13312", "1792x16128x3072", "1024x6016x1792", "4416x3776x3072", "6912x16384x2048"):
        assert tuple(map(int, shape.split("x"))) in perf_matmul.SHAPES


# --- burn-in ---------------------------------------------------------------------------------------------------

def test_clock_event_reasons_are_nvmls_bits():
    """[NVML]: 0x4 SW power cap; 0x48 = HW slowdown + HW thermal slowdown; 0x80 HW power brake."""
    assert burnin.reasons("0x0000000000000004") == ["sw_power_cap"]
    assert burnin.reasons("0x0000000000000048") == ["hw_slowdown", "hw_thermal_slowdown"]
    assert burnin.reasons("0x0000000000000080") == ["hw_power_brake_slowdown"]
    assert burnin.reasons("[N/A]") is None and burnin.reasons("0x0") == []


def test_a_drop_from_the_first_minute_fails_and_names_both_figures():
    n = 8192
    flop = 2.0 * n**3
    steady = [(float(at), flop / 700e12) for at in range(1, 301)]                 # 700 TFLOP/s for 300 s
    assert burnin.drop(steady, n, 300)["drop_pct"] == 0.0
    assert burnin.verdict(0, burnin.drop(steady, n, 300)) == []
    hot = [(at, flop / (700e12 if at <= 60 else 560e12)) for at, _ in steady]      # 20 % slower after a minute
    figures = burnin.drop(hot, n, 300)
    assert (figures["first_minute_tflops"], figures["last_third_tflops"], figures["drop_pct"]) == (700.0, 560.0, 20.0)
    assert burnin.verdict(3, figures) == [
        "GPU 3 sustained matmul fell 20 % from its first minute (700 -> 560 TFLOP/s over the last third; at most 10 % "
        "allowed)"]


def test_telemetry_under_load_is_summarized_and_a_slowdown_fails():
    class Ctx:
        calls: list = []

        def run(self, argv, timeout=30.0):
            self.calls.append(argv[1])
            if "clocks_event_reasons.active" in argv[1]:        # a driver before R535 knows only the old name
                return 2, "", 'Field "clocks_event_reasons.active" is not a valid field to query.'
            return 0, ("0, 1755, 1980, 690.12, 700.00, 71, 0x0000000000000004\n"
                       "1, 1410, 1980, 455.00, 700.00, 91, 0x0000000000000048\n"), ""

    ctx = Ctx()
    reading, why = burnin.read_telemetry(ctx)
    assert why == "" and ctx.calls[1].endswith("clocks_throttle_reasons.active")
    assert reading[0] == {"index": "0", "sm_clock_mhz": 1755.0, "max_sm_clock_mhz": 1980.0, "power_w": 690.12,
                          "power_limit_w": 700.0, "temperature_c": 71.0, "reasons": ["sw_power_cap"]}
    summary = burnin.summarize([reading, reading], "1")
    assert summary["samples"] == 2 and summary["reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert summary["sm_clock_mhz"] == {"min": 1410.0, "median": 1410.0, "max": 1410.0}
    figures = {"first_minute_tflops": 700.0, "last_third_tflops": 690.0, "drop_pct": 1.4, **summary}
    assert burnin.verdict(1, figures) == [
        "GPU 1 slowed down under sustained load: hw_slowdown, hw_thermal_slowdown active (temperature up to 91.0 C, "
        "power up to 455.0 W)"]
    # the SW power cap is where a datacenter GPU runs a heavy matmul: recorded, not failed
    assert burnin.verdict(0, {**figures, **burnin.summarize([reading], "0")}) == []


def test_no_telemetry_says_why():
    class Ctx:
        def run(self, argv, timeout=30.0):
            return 127, "", "nvidia-smi: not found"

    assert burnin.read_telemetry(Ctx()) == ([], "nvidia-smi --query-gpu exited 127: nvidia-smi: not found")


def test_a_sustained_figure_beyond_the_datasheet_is_refused_as_any_other():
    """The burn-in's per-GPU sustained TFLOP/s are bounded like the sweep's: H100 SXM 989 dense bf16 + 5 %."""
    from gpuprov.validation.document import DocumentError, suite_document

    def doc(tflops: float) -> dict:
        sustained = {"figure": "bf16_tflops", "per_gpu": {"0": {"first_minute_tflops": tflops,
                                                                 "last_third_tflops": tflops, "drop_pct": 0.0}}}
        return {"schema": 1, "results": [{"check": "perf.matmul", "status": "pass", "reason": "ok",
                                          "figures": {"sustained": sustained}}]}

    sheet = datasheet(lookup("H100-SXM"))
    assert suite_document(doc(750.0), sheet)["results"][0]["figures"]["sustained"]["per_gpu"]["0"][
        "last_third_tflops"] == 750.0
    with pytest.raises(DocumentError) as caught:
        suite_document(doc(5000.0), sheet)
    assert caught.value.where == "results[0].figures.sustained.per_gpu.0.first_minute_tflops"


class FakeTorch:
    """What gpu_best and sustained touch of torch, without a GPU: a device context and the fp32 precision knob."""

    def __init__(self):
        self.precision = "highest"
        self.float32, self.bfloat16 = "float32", "bfloat16"

        class Cuda:
            @staticmethod
            def device(index):
                import contextlib

                return contextlib.nullcontext()

        self.cuda = Cuda()

    def get_float32_matmul_precision(self):
        return self.precision

    def set_float32_matmul_precision(self, value):
        self.precision = value


def test_each_gpus_best_is_kept_with_its_shape_and_tf32_is_switched_back(monkeypatch):
    torch = FakeTorch()
    seen = []

    def measure(torch_, device, shape, dtype, seed):
        seen.append((dtype, torch_.precision))
        return {(8192, 8192, 8192): 700.0, (6144, 17920, 2816): 812.0}.get(shape, 500.0) / (2 if dtype == "float32"
                                                                                             else 1)

    monkeypatch.setattr(perf_matmul, "matmul_tflops", measure)
    row = perf_matmul.gpu_best(torch, 0, {"bf16_tflops": "bfloat16", "tf32_tflops": "float32"}, 1000.0)
    assert row == {"bf16_tflops": 812.0, "tf32_tflops": 406.0,
                   "best_shape": {"bf16_tflops": "6144x17920x2816", "tf32_tflops": "6144x17920x2816"},
                   "shapes_measured": len(perf_matmul.SHAPES)}
    assert ("float32", "high") in seen and ("bfloat16", "highest") in seen and torch.precision == "highest"


def test_the_sustained_load_is_judged_from_its_own_readings(monkeypatch):
    """Two GPUs under load: GPU 0 steady at its SW power cap (passes), GPU 1 20 % slower after the first minute
    with HW thermal slowdown active (fails with both)."""
    n = 8192
    flop = 2.0 * n**3
    chunks = {0: [(float(at), flop / 700e12) for at in range(1, 181)],
              1: [(float(at), flop / (700e12 if at <= 60 else 560e12)) for at in range(1, 181)]}
    import threading

    read = threading.Event()          # the load lasts until nvidia-smi has been read under it

    def load(torch, index, n_, dtype, seconds, randn):
        assert read.wait(30)
        return chunks[index]

    monkeypatch.setattr(burnin, "load_gpu", load)
    monkeypatch.setattr(burnin, "SAMPLE_SECONDS", 0.01)

    class Ctx:
        def run(self, argv, timeout=30.0):
            read.set()
            return 0, ("0, 1755, 1980, 690.0, 700.0, 70, 0x4\n1, 1300, 1980, 500.0, 700.0, 92, 0x40\n"), ""

    report, failures = burnin.sustained(Ctx(), FakeTorch(), 2, n, "bfloat16", 180.0, None)
    assert report["telemetry_samples"] >= 1 and report["per_gpu"]["0"]["reasons"] == ["sw_power_cap"]
    assert report["per_gpu"]["1"]["drop_pct"] == 20.0
    assert failures == [
        "GPU 1 sustained matmul fell 20 % from its first minute (700 -> 560 TFLOP/s over the last third; at most 10 % "
        "allowed)",
        "GPU 1 slowed down under sustained load: hw_thermal_slowdown active (temperature up to 92.0 C, power up to "
        "500.0 W)"]

