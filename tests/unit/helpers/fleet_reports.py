"""A reports folder as a fleet leaves it, for the fleet report's tests: validate reports of several runs (written
the way validate writes them, gpuprov.core.report.write_json_report), provision, harden and rollout reports, a
rollout journal, and the files a folder also collects (a -latest copy, another job's report, a foreign file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

# the checks of a quick run (gpuprov/smoke, by name), as the suite reports them
CHECKS = ("host.clocks", "host.driver", "host.ecc", "host.fabric", "host.gpus", "host.nvlink", "host.pcie",
          "host.xid", "infer.latency", "perf.allreduce", "perf.copy", "perf.matmul", "sizing", "software",
          "train.cnn", "train.ddp", "train.transformer")
# An HGX H100 with 8 GPUs and NVSwitch as the report records it, and figures near what one measures
H100 = {"gpu": "H100-SXM", "config": {"gpus_visible": True, "expect": {"count": 8, "nvswitch": True}},
        "versions": {"cuda": "12.8", "torch": "2.7.1"}, "matmul": 700.0, "d2d": 2900.0, "busbw": 470.0}
L40S = {"gpu": "L40S", "config": {"gpus_visible": True, "expect": {"count": 4, "nvswitch": False}},
        "versions": {"cuda": "12.8", "torch": "2.7.1"}, "matmul": 300.0, "d2d": 700.0, "busbw": 24.0}
T0 = 1_796_000_000   # 2026-11-30


def validate_host(name: str, kind: dict, *, scale: float = 1.0, fail: dict | None = None, when: int = T0,
                  other: dict | None = None) -> dict:
    """A validate report's host entry: every check passes unless `fail` ({check: reason}) or `other` ({check:
    (status, reason)}) says otherwise."""
    fail = {**{check: reason for check, (status, reason) in (other or {}).items() if status == "fail"}, **(fail or {})}
    other = {check: found for check, found in (other or {}).items() if found[0] != "fail"}
    results = []
    for check in CHECKS:
        figures: dict = {}
        if check == "perf.matmul":
            figures = {"bf16_tflops": kind["matmul"] * scale, "fp16_tflops": kind["matmul"] * scale * 1.01,
                       "tf32_tflops": kind["matmul"] * scale / 2}
        elif check == "perf.copy":
            figures = {"d2d_gbs": kind["d2d"] * scale, "h2d_gbs": 50.0 * scale, "d2h_gbs": 49.0 * scale}
        elif check == "perf.allreduce":
            figures = {"busbw_gbs": kind["busbw"] * scale}
        status, reason = ("fail", fail[check]) if check in fail else other.get(check, ("pass", f"{check}: as expected"))
        results.append({"check": check, "status": status, "reason": reason, "figures": figures, "thresholds": {},
                        "seconds": 1.0})
    results.append({"check": "fleet.perf.matmul", "status": "pass", "reason": "within 10% of the fleet median",
                    "figures": {}, "thresholds": {"max_below_fleet_median_pct": 10.0}, "seconds": 0.0})
    found = {status for status, _ in other.values()}
    status = "fail" if fail else "warn" if "warn" in found else "partial" if "skip" in found else "pass"
    return {"host": name, "gpu": kind["gpu"], "status": status, "level": "quick",
            "config": kind["config"], "versions": kind["versions"], "results": results, "error": None,
            "started": when, "fleet": {"group": f"{kind['gpu']} (GPU, quick)"}}


def stopped_host(name: str, message: str) -> dict:
    """A host whose validation stopped before the suite ran."""
    return {"host": name, "gpu": None, "status": "error", "results": [],
            "error": {"error": message, "step": "connect", "skipped": False}}


def write(folder: Path, name: str, payload, when: int) -> Path:
    path = folder / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload), encoding="utf-8")
    os.utime(path, (when, when))
    return path


def stamp(epoch: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).strftime("%Y%m%dT%H%M%SZ")


def fleet_folder(folder: Path, hosts: int = 32, runs: int = 3) -> dict:
    """`hosts` validated hosts (three quarters H100, a quarter L40S that skip host.fabric) over `runs` validate
    reports, the last with failures: gpu07 below the fleet on matmul, gpu13 an ECC failure, gpu20 whose validation
    stopped; and a warning (gpu05 sizing). Returns what the page must show: {"hosts": [...], "failures": [(host,
    check, reason)], "skipped": [file names]}."""
    assert hosts >= 20, "gpu20 stops"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"gpu{i:02d}" for i in range(1, hosts + 1)]
    kinds = {name: (L40S if i % 4 == 3 else H100) for i, name in enumerate(names)}
    for run in range(runs):
        when = T0 + run * 86400
        last = run == runs - 1
        entries = []
        for i, name in enumerate(names):
            scale = 1.0 - 0.004 * ((i * 7 + run * 3) % 9)
            fail = {}
            if last and name == "gpu07":
                scale = 0.7
                fail = {"perf.matmul": "bf16_tflops 490.0 is below 80% of the expected 620.0 TFLOP/s"}
            if last and name == "gpu13":
                fail = {"host.ecc": "GPU 3: 2 uncorrectable (volatile) ECC errors"}
            if last and name == "gpu20":
                entries.append(stopped_host(name, "cannot connect: connection refused"))
                continue
            other = {"host.fabric": ("skip", "no NVSwitch expected")} if kinds[name] is L40S else {}
            if last and name == "gpu05":
                other["sizing"] = ("warn", "6 CPU cores per GPU, 8-16 recommended for training")
            entries.append(validate_host(name, kinds[name], scale=scale, fail=fail, when=when, other=other))
        write(folder, f"validate-{stamp(when)}.json",
              {"level": "quick", "strict": False, "finished_epoch": when + 60, "started": when, "hosts": entries},
              when + 60)
        if last:
            write(folder, "validate-latest.json", {"level": "quick", "hosts": entries}, when + 60)
    failures = [("gpu07", "perf.matmul", "bf16_tflops 490.0 is below 80% of the expected 620.0 TFLOP/s"),
                ("gpu13", "host.ecc", "GPU 3: 2 uncorrectable (volatile) ECC errors"),
                ("gpu20", "validation", "cannot connect: connection refused")]
    write(folder, f"provision-{stamp(T0 - 3600)}.json", {"dry_run": False, "hosts": [
        {"host": name, "status": "changed", "lock": "locks/hgx.lock.yaml",
         "stack": {"driver": {"version": "570.172.08"}}} for name in names]}, T0 - 3600)
    write(folder, f"harden-{stamp(T0 - 1800)}.json", {"hosts": [
        {"host": name, "status": "changed", "controls": []} for name in names[:-1]]
        + [{"host": names[-1], "status": "failed", "error": {"error": "sshd -t refused the config", "step": "ssh"}}]},
        T0 - 1800)
    write(folder, f"harden-check-{stamp(T0 - 900)}.json", {"hosts": [
        {"host": names[0], "status": "checked", "controls": [{"id": "ssh.root_login", "status": "fail"},
                                                             {"id": "firewall.default_drop", "status": "pass"}]}]},
        T0 - 900)
    write(folder, "rollout-journal-0a1b2c3d-1.json", {
        "run_id": "0a1b2c3d-1", "status": "complete", "started": T0 + 100, "updated": T0 + 900, "hosts": {
            name: {"state": "resumed", "since": T0 + 900, "detail": "validated", "from": "hgx@1", "to": "hgx@2"}
            for name in names[:4]}}, T0 + 900)
    write(folder, f"preflight-{stamp(T0)}.json", {"hosts": []}, T0)   # another job's report: passed over
    write(folder, "broken.json", '{"hosts": [', T0)                     # cut short
    write(folder, "notes.json", {"hello": "world"}, T0)                 # foreign
    return {"hosts": names, "failures": failures, "skipped": ["broken.json", "notes.json"]}
