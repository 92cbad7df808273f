"""Fleet outliers: figures against the median of the same GPU model in this run and recent reports.

A host is compared with its peers (at least 3 of them), never with itself. Expected numbers are worked out by
hand: the peers of the 85 host are 100, 98 and 99, median 99; (99 - 85) / 99 = 14.14 % -> "14.1%"."""

from __future__ import annotations

import json
import time

import pytest

from gpuprov.core.errors import GpuprovError
from gpuprov.validation.fleet import Sample, figures_of, group_of, outliers, recent_samples
from gpuprov.validation.host import ValidationRecord, apply_fleet

GROUP = "H100-SXM (GPU, quick)"


def matmul(bf16: float, **extra) -> dict:
    return {"check": "perf.matmul", "status": "pass", "reason": "ok", "figures": {"bf16_tflops": bf16, **extra},
            "thresholds": {}, "seconds": 1.0}


def fleet(*values: float) -> list[Sample]:
    """gpu01, gpu02, ... of GROUP with these bf16 figures."""
    return [Sample(f"gpu{i:02d}", GROUP, {"perf.matmul.bf16_tflops": v}) for i, v in enumerate(values, 1)]


def test_the_slow_host_fails_with_both_numbers_though_above_its_datasheet_threshold():
    # 85 TFLOP/s would be far above any datasheet threshold of a small GPU: only the fleet flags it
    current = fleet(100.0, 98.0, 85.0, 99.0)
    found = outliers(current, [], dict.fromkeys(("gpu01", "gpu02", "gpu03", "gpu04"), 10.0))
    slow = found["gpu03"][0]
    assert slow["check"] == "fleet.perf.matmul" and slow["status"] == "fail"
    assert "bf16_tflops 85.0 is 14.1% below the fleet median 99.0 of 3 other hosts" in slow["reason"]
    assert slow["figures"] == {"bf16_tflops": 85.0, "bf16_tflops_fleet_median": 99.0}
    assert slow["thresholds"] == {"max_below_fleet_median_pct": 10.0, "hosts": 3, "min_hosts": 3}
    assert [found[h][0]["status"] for h in ("gpu01", "gpu02", "gpu04")] == ["pass", "pass", "pass"]
    # gpu01's peers: 98, 85, 99 -> median 98
    assert "within 10% of the fleet median of 3 other hosts" in found["gpu01"][0]["reason"]
    assert "bf16_tflops 100.0 (median 98.0)" in found["gpu01"][0]["reason"]


def test_fewer_than_three_peers_give_no_verdict():
    # two hosts 15 % apart: one peer is no fleet, so neither is judged (strict: both fail, saying why)
    found = outliers(fleet(100.0, 85.0), [], {"gpu01": 10.0, "gpu02": 10.0})
    assert [found[h][0]["status"] for h in ("gpu01", "gpu02")] == ["skip", "skip"]
    assert found["gpu02"][0]["reason"] == ("only 1 other H100-SXM (GPU, quick) host to compare with, at least 3 "
                                           "needed (this run and validate reports of the last 7 days)")
    assert found["gpu02"][0]["thresholds"]["hosts"] == 1
    three = outliers(fleet(100.0, 100.0, 85.0), [], dict.fromkeys(("gpu01", "gpu02", "gpu03"), 10.0), strict=True)
    assert three["gpu03"][0]["status"] == "fail"
    assert three["gpu03"][0]["reason"].startswith("strict: only 2 other H100-SXM (GPU, quick) hosts to compare")


def test_a_peer_reporting_1e300_cannot_fail_an_honest_host():
    # the bug: with the one peer at 1e300 the honest host was "100.0% below the fleet median"
    found = outliers(fleet(100.0, 1e300), [], {"gpu01": 10.0, "gpu02": 10.0})
    assert found["gpu01"][0]["status"] == "skip"
    # with three peers one liar cannot move the median: 101, 99, 1e300 -> 101; (101 - 100) / 101 = 1.0 %
    found = outliers(fleet(100.0, 101.0, 99.0, 1e300), [], dict.fromkeys(("gpu01", "gpu02", "gpu03", "gpu04"), 10.0))
    assert found["gpu01"][0]["status"] == "pass", found["gpu01"][0]["reason"]
    assert found["gpu01"][0]["figures"]["bf16_tflops_fleet_median"] == 101.0


def test_the_outlier_threshold_is_per_host():
    found = outliers(fleet(100.0, 98.0, 85.0, 99.0), [], {"gpu01": 10.0, "gpu02": 10.0, "gpu03": 15.0,
                                                         "gpu04": 10.0})
    assert found["gpu03"][0]["status"] == "pass"   # 14.1 % below is within 15 %


def test_a_lone_host_is_skipped_and_strict_fails_it():
    current = [Sample("gpu01", GROUP, {"perf.copy.h2d_gbs": 55.4})]
    found = outliers(current, [], {"gpu01": 10.0})
    assert found["gpu01"][0]["status"] == "skip"
    assert found["gpu01"][0]["reason"].startswith("no other H100-SXM (GPU, quick) host to compare with, at least 3")
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


def runs_of(*values) -> list[ValidationRecord]:
    """This run's hosts gpu01, gpu02, ... (H100-SXM on GPUs) with perf.matmul results of these bf16 figures."""
    runs = []
    for i, value in enumerate(values, 1):
        run = ValidationRecord(f"gpu{i:02d}", gpu="H100-SXM", outlier_pct=10.0, config={"gpus_visible": True},
                             versions={"cuda": "12.8"})
        run.results = [matmul(value)]
        runs.append(run)
    return runs


def test_apply_fleet_adds_results_to_this_runs_hosts(tmp_path):
    runs = runs_of(100.0, 98.0, 85.0, 99.0)
    failed = ValidationRecord("gpu05", error={"error": "cannot reach"})
    apply_fleet([*runs, failed], tmp_path, strict=False)
    assert [r.results[-1]["status"] for r in runs] == ["pass", "pass", "fail", "pass"]
    assert failed.results == []
    assert list(tmp_path.iterdir()) == []


def test_figures_that_are_a_list_do_not_crash_apply_fleet(tmp_path):
    # the bug: `figures: [1, 2]` raised AttributeError in apply_fleet, on the main thread: no host got a report
    runs = runs_of(100.0, 98.0, 99.0, 97.0)
    runs[3].results[0]["figures"] = [1, 2]
    apply_fleet(runs, tmp_path, strict=False)
    assert [r.results[-1]["check"] for r in runs[:3]] == ["fleet.perf.matmul"] * 3
    assert runs[3].results[-1]["check"] == "perf.matmul"     # nothing to compare: no fleet result


def test_a_forged_document_is_its_hosts_failure_and_never_a_peer(tmp_path):
    """The controller's path: the document parsed (and refused), then the fleet of the hosts that are left."""
    import json

    from gpuprov.catalog import lookup
    from gpuprov.core.executor import Outcome
    from gpuprov.core.runtime import failed_entry
    from gpuprov.validation.host import RunOptions, ValidateJob
    from gpuprov.validation.suite import parse_document
    from gpuprov.validation.suite_config import datasheet

    sheet = datasheet(lookup("H100-SXM"))
    runs = runs_of(700.0, 705.0, 698.0)
    outcomes = []
    for name, figures in (("gpu04", [1, 2]), ("gpu05", {"bf16_tflops": 1e300})):
        document = {"schema": 1, "results": [{"check": "perf.matmul", "status": "pass", "reason": "ok",
                                              "figures": figures}]}
        with pytest.raises(GpuprovError) as caught:
            parse_document(name, json.dumps(document), datasheet=sheet)
        outcomes.append(Outcome(type("H", (), {"name": name, "address": "192.0.2.1"})(), error=caught.value))
    job = ValidateJob(RunOptions())
    for outcome in outcomes:
        failed_entry(job, outcome)          # the runtime's entry of a failed host: made from the job's record
    forged = [job.records[o.host.name] for o in outcomes]
    assert "results[0].figures: must be a mapping, not list [1, 2]" in forged[0].error["error"]
    assert ("results[0].figures.bf16_tflops: perf.matmul bf16_tflops 1e+300 TFLOP/s is above what the GPU can do: "
            "1038.45 (the datasheet's bf16_tflops 989 + 5 %)") in forged[1].error["error"]
    apply_fleet([*runs, *forged], tmp_path, strict=False)
    # three honest hosts: two peers each, so no verdict, and no honest host failed
    assert [r.results[-1]["status"] for r in runs] == ["skip"] * 3
    assert all(f.results == [] for f in forged)


def test_a_hosts_own_earlier_reports_are_never_its_peers(tmp_path):
    now = time.time()
    for day in range(3):   # gpu01 alone in three reports, at twice its figure of today
        report = {"finished_epoch": now - 3600 * (day + 1), "hosts": [
            {"host": "gpu01", "fleet": {"group": GROUP, "figures": {"perf.matmul.bf16_tflops": 200.0}}}]}
        (tmp_path / f"validate-2026010{day}T000000Z.json").write_text(json.dumps(report))
    found = outliers(fleet(100.0), recent_samples(tmp_path, now=now), {"gpu01": 10.0})
    assert found["gpu01"][0]["status"] == "skip"
    assert found["gpu01"][0]["reason"].startswith("no other H100-SXM (GPU, quick) host")


def test_reports_give_only_finite_positive_known_figures(tmp_path):
    now = time.time()
    hosts = [{"host": f"h{i}", "fleet": {"group": GROUP, "figures": figures}} for i, figures in enumerate([
        {"perf.matmul.bf16_tflops": "700"}, {"perf.matmul.bf16_tflops": [1, 2]}, {"perf.matmul.bf16_tflops": -5},
        {"perf.matmul.bf16_tflops": True}, {"perf.matmul.unknown": 5.0}, {"perf.matmul.bf16_tflops": 10**400},
    ])] + [{"host": 7, "fleet": {"group": GROUP, "figures": {"perf.matmul.bf16_tflops": 1.0}}}, "not a host",
           {"host": "good", "fleet": {"group": GROUP, "figures": {"perf.matmul.bf16_tflops": 700.0,
                                                                  "perf.copy.d2d_gbs": float("inf")}}}]
    (tmp_path / "validate-a.json").write_text(json.dumps({"finished_epoch": now, "hosts": hosts}).replace(
        "1" + "0" * 400, "1e400"))
    (tmp_path / "validate-b.json").write_text(json.dumps([1, 2]))
    (tmp_path / "validate-c.json").write_text(json.dumps({"finished_epoch": now, "hosts": {"x": 1}}))
    (tmp_path / "validate-d.json").write_text("[" * 100000)
    assert recent_samples(tmp_path, now=now) == [Sample("good", GROUP, {"perf.matmul.bf16_tflops": 700.0}, now)]


def test_small_figures_keep_their_digits():
    current = [Sample(f"cpu0{i}", "H100-SXM (CPU, quick)", {"perf.matmul.fp32_tflops": v})
               for i, v in enumerate((0.0714, 0.0299, 0.0714, 0.0714), 1)]
    slow = outliers(current, [], dict.fromkeys((s.host for s in current), 30.0))["cpu02"][0]
    # its peers: 0.0714 thrice; (0.0714 - 0.0299) / 0.0714 = 58.1 %
    assert slow["status"] == "fail"
    assert slow["reason"].startswith("fp32_tflops 0.0299 is 58.1% below the fleet median 0.0714 of 3 other hosts")
