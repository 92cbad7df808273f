"""Fleet outliers: figures against the median of the same GPU model in this run and recent reports.

A host is compared with its peers, never with itself. Expected numbers are worked out by hand: the peers of
the 85 host are 100 and 98, median 99; (99 - 85) / 99 = 14.14 % -> "14.1%"."""

from __future__ import annotations

import json
import time

from gpuprov.validation.fleet import Sample, figures_of, group_of, outliers, recent_samples
from gpuprov.validation.host import HostValidation, apply_fleet

GROUP = "H100-SXM (GPU, quick)"


def matmul(bf16: float, **extra) -> dict:
    return {"check": "perf.matmul", "status": "pass", "reason": "ok", "figures": {"bf16_tflops": bf16, **extra},
            "thresholds": {}, "seconds": 1.0}


def test_the_slow_host_fails_with_both_numbers_though_above_its_datasheet_threshold():
    # 85 TFLOP/s would be far above any datasheet threshold of a small GPU: only the fleet flags it
    current = [Sample(name, GROUP, {"perf.matmul.bf16_tflops": v}) for name, v in
               (("gpu01", 100.0), ("gpu02", 98.0), ("gpu03", 85.0))]
    found = outliers(current, [], {"gpu01": 10.0, "gpu02": 10.0, "gpu03": 10.0})
    slow = found["gpu03"][0]
    assert slow["check"] == "fleet.perf.matmul" and slow["status"] == "fail"
    assert "bf16_tflops 85.0 is 14.1% below the fleet median 99.0 of 2 other hosts" in slow["reason"]
    assert slow["figures"] == {"bf16_tflops": 85.0, "bf16_tflops_fleet_median": 99.0}
    assert slow["thresholds"] == {"max_below_fleet_median_pct": 10.0, "hosts": 2}
    assert [found[h][0]["status"] for h in ("gpu01", "gpu02")] == ["pass", "pass"]
    assert "within 10% of the fleet median of 2 other hosts" in found["gpu01"][0]["reason"]


def test_two_hosts_15_percent_apart_flag_the_slow_one():
    # the median of its one peer: (100 - 85) / 100 = 15 % below; the fast host is above its peer
    current = [Sample("gpu01", GROUP, {"perf.matmul.bf16_tflops": 100.0}),
               Sample("gpu02", GROUP, {"perf.matmul.bf16_tflops": 85.0})]
    found = outliers(current, [], {"gpu01": 10.0, "gpu02": 10.0})
    assert [found[h][0]["status"] for h in ("gpu01", "gpu02")] == ["pass", "fail"]
    assert found["gpu02"][0]["reason"].startswith("bf16_tflops 85.0 is 15.0% below the fleet median 100.0 of "
                                                 "1 other host")


def test_the_outlier_threshold_is_per_host():
    current = [Sample(name, GROUP, {"perf.matmul.bf16_tflops": v}) for name, v in
               (("gpu01", 100.0), ("gpu02", 98.0), ("gpu03", 85.0))]
    found = outliers(current, [], {"gpu01": 10.0, "gpu02": 10.0, "gpu03": 15.0})
    assert found["gpu03"][0]["status"] == "pass"   # 14.1 % below is within 15 %


def test_a_lone_host_is_skipped_and_strict_fails_it():
    current = [Sample("gpu01", GROUP, {"perf.copy.h2d_gbs": 55.4})]
    found = outliers(current, [], {"gpu01": 10.0})
    assert found["gpu01"][0]["status"] == "skip"
    assert found["gpu01"][0]["reason"].startswith("no other H100-SXM (GPU, quick) host to compare with")
    strict = outliers(current, [], {"gpu01": 10.0}, strict=True)
    assert strict["gpu01"][0]["status"] == "fail" and strict["gpu01"][0]["reason"].startswith("strict: no other")


def test_other_models_and_cpu_measurements_are_not_peers():
    current = [Sample("gpu01", GROUP, {"perf.matmul.bf16_tflops": 700.0}),
               Sample("gpu02", "L40S (GPU, quick)", {"perf.matmul.bf16_tflops": 300.0}),
               Sample("lab01", "H100-SXM (CPU, quick)", {"perf.matmul.bf16_tflops": 0.2})]
    found = outliers(current, [], {"gpu01": 10.0, "gpu02": 10.0, "lab01": 10.0})
    assert [found[h][0]["status"] for h in ("gpu01", "gpu02", "lab01")] == ["skip", "skip", "skip"]


def test_recent_reports_are_peers_and_this_run_replaces_a_hosts_older_figure(tmp_path):
    now = time.time()
    report = {"finished_epoch": now - 3600, "hosts": [
        {"host": "gpu01", "fleet": {"group": GROUP, "figures": {"perf.matmul.bf16_tflops": 60.0}}},
        {"host": "gpu02", "fleet": {"group": GROUP, "figures": {"perf.matmul.bf16_tflops": 98.0}}},
        {"host": "gpu04", "fleet": {"group": GROUP, "figures": {"perf.matmul.bf16_tflops": 99.0}}},
    ]}
    (tmp_path / "validate-20260101T000000Z.json").write_text(json.dumps(report))
    old = {"finished_epoch": now - 30 * 86400, "hosts": [
        {"host": "gpu05", "fleet": {"group": GROUP, "figures": {"perf.matmul.bf16_tflops": 10.0}}}]}
    (tmp_path / "validate-20250101T000000Z.json").write_text(json.dumps(old))
    (tmp_path / "validate-latest.json").write_text(json.dumps(report))   # a copy, not another report
    (tmp_path / "validate-broken.json").write_text("{")
    recent = recent_samples(tmp_path, now=now)
    assert sorted(s.host for s in recent) == ["gpu01", "gpu02", "gpu04"]
    # this run: gpu01 100 (its 60 from the report no longer counts), gpu03 85; gpu03's peers 100, 98, 99 -> 99
    current = [Sample("gpu01", GROUP, {"perf.matmul.bf16_tflops": 100.0}),
               Sample("gpu03", GROUP, {"perf.matmul.bf16_tflops": 85.0})]
    found = outliers(current, recent, {"gpu01": 10.0, "gpu03": 10.0})
    assert "85.0 is 14.1% below the fleet median 99.0 of 3 other hosts" in found["gpu03"][0]["reason"]
    assert found["gpu01"][0]["status"] == "pass"


def test_figures_of_takes_numbers_of_known_figures_only():
    results = [matmul(700.0, fp16_tflops=690.0, tf32_tflops=None, per_gpu={"0": {"bf16_tflops": 700.0}}),
               {"check": "perf.copy", "status": "skip", "reason": "no GPU: measured on CPU",
                "figures": {"d2d_gbs": 9.5, "h2d_gbs": 4.0, "d2h_gbs": True}},
               {"check": "host.ecc", "status": "pass", "reason": "ok", "figures": {"volatile_dbe": 0}},
               {"check": "infer.latency", "status": "pass", "reason": "ok",
                "figures": {"b1_per_s": 900.0, "b1_p50_ms": 1.1}}]
    assert figures_of(results) == {"perf.matmul.bf16_tflops": 700.0, "perf.matmul.fp16_tflops": 690.0,
                                   "perf.copy.d2d_gbs": 9.5, "perf.copy.h2d_gbs": 4.0,
                                   "infer.latency.b1_per_s": 900.0}


def test_group_names_the_measuring_device():
    assert group_of("H100-SXM", {"cuda": "12.8"}, True, "quick") == "H100-SXM (GPU, quick)"
    assert group_of("H100-SXM", {"cuda": None}, True, "quick") == "H100-SXM (CPU, quick)"
    assert group_of("L40S", {"cuda": "12.8"}, False, "burn-in") == "L40S (CPU, burn-in)"


def test_apply_fleet_adds_results_to_this_runs_hosts(tmp_path):
    runs = []
    for name, value in (("gpu01", 100.0), ("gpu02", 98.0), ("gpu03", 85.0)):
        run = HostValidation(name, gpu="H100-SXM", outlier_pct=10.0, config={"gpus_visible": True},
                             versions={"cuda": "12.8"})
        run.results = [matmul(value)]
        runs.append(run)
    failed = HostValidation("gpu04", error={"error": "cannot reach"})
    apply_fleet([*runs, failed], tmp_path, strict=False)
    assert [r.results[-1]["status"] for r in runs] == ["pass", "pass", "fail"]
    assert failed.results == []
    assert list(tmp_path.iterdir()) == []


def test_small_figures_keep_their_digits():
    current = [Sample("cpu01", "H100-SXM (CPU, quick)", {"perf.matmul.fp32_tflops": 0.0714}),
               Sample("cpu02", "H100-SXM (CPU, quick)", {"perf.matmul.fp32_tflops": 0.0299})]
    slow = outliers(current, [], {"cpu01": 30.0, "cpu02": 30.0})["cpu02"][0]
    # its one peer: 0.0714; (0.0714 - 0.0299) / 0.0714 = 58.1 %
    assert slow["status"] == "fail"
    assert slow["reason"].startswith("fp32_tflops 0.0299 is 58.1% below the fleet median 0.0714 of 1 other host")
