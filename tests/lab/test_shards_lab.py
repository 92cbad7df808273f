"""A fleet run split past one controller, over real SSH: `invoke validate --shard 1/2` and `--shard 2/2` of a 4-host
run, each writing its reports into a folder of its own (as on two machines), joined by `invoke reports.merge`, give
the fleet report of the unsharded run: the same hosts, each once, the same checks with the same statuses, the same
fleet groups, and the fleet comparison made over all 4 hosts (within one shard a host has 1 peer, no verdict).

The module brings up four hgx-h100 hosts of its own (not provisioned: the suite's venv and the checks it runs here
need no NVIDIA software) and builds their suite environments once. perf.matmul measures on the CPU there: its
figures differ run to run, so the fleet verdicts are checked against the median worked out here from each report's
own figures (validate's rule: more than validate.outlier_pct, 10 % by default, below the median of the other hosts
of the group fails), and the structure, not the numbers, is compared between the runs.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import pytest
from labutil import invoke

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts
PROFILES = ["hgx-h100"] * 4
ONLY = ("--only", "perf.matmul,host.shm", "--no-textfile")
GROUP = "H100-SXM (CPU, quick)"      # the H100 SXM hosts, measured on the CPU (the lab's torch has no CUDA)
OUTLIER_PCT = 10                     # validate.outlier_pct's default (docs: the fleet comparison)
MATMUL = ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops")   # perf.matmul's figures the fleet compares


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """Four hgx-h100 hosts with the suite's venv built from the wheelhouse; the environment and their names."""
    import gpuprov.lab

    state = gpuprov.lab.up(len(PROFILES), PROFILES, paths=lab.paths, fresh=True)
    folder = tmp_path_factory.mktemp("shards")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    run, _ = validate(env, "--all", "--only", "host.shm", "--no-textfile")   # builds the venvs
    assert all(h["error"] is None and h["env"]["installed"] for h in run["hosts"]), run["hosts"]
    return env, sorted(h.name for h in state.hosts)


def validate(env: dict, *args: str) -> tuple[dict, Path]:
    """`invoke validate ... --json` with its reports in a folder of its own (no fleet history but its own): the
    document it printed and that folder. Exit 1 only when a check failed (a CPU figure may be a fleet outlier)."""
    reports = Path(tempfile.mkdtemp(prefix="validate-", dir=Path(env["INVOKE_GPUPROV_REPORTS"]).parent))
    proc = invoke("validate", *args, "--json", check_code=None, env={**env, "INVOKE_GPUPROV_REPORTS": str(reports)})
    run = json.loads(proc.stdout)
    failed = any(r["status"] == "fail" for h in run["hosts"] for r in h["results"])
    assert proc.returncode == (1 if failed else 0), f"exit {proc.returncode}\n{proc.stderr}"
    return run, reports


@pytest.fixture(scope="module")
def runs(fleet):
    """The unsharded run, the two shards' reports and the merge of them (its history an empty reports folder)."""
    env, _names = fleet
    started = time.monotonic()
    whole, _ = validate(env, "--all", *ONLY)
    print(f"validate of 4 hosts: {time.monotonic() - started:.1f} s")
    parts = []
    for k in (1, 2):
        started = time.monotonic()
        parts.append(validate(env, "--all", "--shard", f"{k}/2", *ONLY)[0])
        print(f"validate --shard {k}/2: {time.monotonic() - started:.1f} s")
    history = Path(tempfile.mkdtemp(prefix="merge-", dir=Path(env["INVOKE_GPUPROV_REPORTS"]).parent))
    out = history.parent / f"{history.name}-merged" / "fleet.json"
    started = time.monotonic()
    invoke("reports.merge", "--out", str(out), "--report", parts[0]["report"], "--report", parts[1]["report"],
           env={**env, "INVOKE_GPUPROV_REPORTS": str(history)})
    print(f"reports.merge of 2 shards: {time.monotonic() - started:.1f} s")
    merged = json.loads(out.read_text())
    for name, report in (("unsharded", whole), ("merged", merged)):
        print(f"{name}: " + ", ".join(f"{h} {r['status']} ({r['reason'][:60]})"
                                      for h, r in fleet_results(report).items()))
    return whole, parts, merged, out


def statuses(report: dict, fleet: bool = False) -> dict[str, dict[str, str]]:
    """{host: {check: status}}: the host's own checks, or (`fleet`) its fleet verdicts."""
    return {h["host"]: {r["check"]: r["status"] for r in h["results"] if r["check"].startswith("fleet.") == fleet}
            for h in report["hosts"]}


def fleet_results(report: dict) -> dict[str, dict]:
    return {h["host"]: next(r for r in h["results"] if r["check"] == "fleet.perf.matmul") for h in report["hosts"]}


def matmul_figures(report: dict) -> dict[str, dict[str, float]]:
    """{host: {figure: value}}: the positive matmul figures each host measured."""
    return {h["host"]: {k: v for k, v in next(r for r in h["results"] if r["check"] == "perf.matmul")[
        "figures"].items() if k in MATMUL and isinstance(v, int | float) and v > 0} for h in report["hosts"]}


def expected_verdicts(report: dict) -> dict[str, str]:
    """Each host's matmul figures against the median of the 3 other hosts' same figure, worked out here: a fail
    when one is more than OUTLIER_PCT below."""
    figures = matmul_figures(report)
    out = {}
    for name, mine in figures.items():
        below = [(statistics.median(f[key] for other, f in figures.items() if other != name) - value)
                 / statistics.median(f[key] for other, f in figures.items() if other != name) * 100
                 for key, value in mine.items()]
        out[name] = "fail" if max(below) > OUTLIER_PCT else "pass"
    return out


def test_each_shard_validates_its_half_and_records_it(fleet, runs):
    _env, names = fleet
    _whole, parts, _merged, _out = runs
    # the names sorted, dealt round-robin: shard 1 the 1st and 3rd, shard 2 the 2nd and 4th
    assert [sorted(h["host"] for h in part["hosts"]) for part in parts] == [names[0::2], names[1::2]]
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    for k, part in enumerate(parts, 1):
        saved = json.loads(Path(part["report"]).read_text())
        assert saved["shard"] == {"index": k, "count": 2, "selected": 4, "selection": digest}
        # within a shard a host has one peer: the fleet comparison needs 3, so there is no verdict
        for result in fleet_results(saved).values():
            assert result["status"] == "skip" and result["reason"].startswith(
                f"only 1 other {GROUP} host to compare with, at least 3 needed"), result


def test_the_merged_shards_give_the_unsharded_fleet_report(fleet, runs):
    _env, names = fleet
    whole, _parts, merged, _out = runs
    assert whole["shard"] is None and merged["shard"] is None
    assert [h["host"] for h in merged["hosts"]] == names == sorted(h["host"] for h in whole["hosts"])
    assert statuses(merged) == statuses(whole) == dict.fromkeys(names, {"host.shm": "pass", "perf.matmul": "skip"})
    assert {h["host"]: h["fleet"]["group"] for h in merged["hosts"]} == \
           {h["host"]: h["fleet"]["group"] for h in whole["hosts"]} == dict.fromkeys(names, GROUP)
    by_name = {h["host"]: h for h in whole["hosts"]}
    for report in (whole, merged):
        # the verdict over all 4 hosts: each against the median of the 3 others (the figures are this run's)
        assert statuses(report, fleet=True) == {n: {"fleet.perf.matmul": v} for n, v in
                                                expected_verdicts(report).items()}
        for name, result in fleet_results(report).items():
            assert result["thresholds"] == {"max_below_fleet_median_pct": OUTLIER_PCT, "hosts": 3, "min_hosts": 3}
            measured = matmul_figures(report)[name]
            assert set(result["figures"]) == {*measured, *(f"{k}_fleet_median" for k in measured)}
            assert (report["hosts"][[h["host"] for h in report["hosts"]].index(name)]["status"] == "fail") == (
                result["status"] == "fail")
    for host in merged["hosts"]:      # the same fields as the unsharded run's entry of the host
        assert set(host) == set(by_name[host["host"]]) and set(host["fleet"]) == set(by_name[host["host"]]["fleet"])
        assert sum(host["counts"].values()) == sum(by_name[host["host"]]["counts"].values()) == 3


def test_the_merge_writes_the_junit_and_textfiles_of_the_whole_fleet(fleet, runs):
    from junitparser import JUnitXml
    from prometheus_client.parser import text_string_to_metric_families

    _env, names = fleet
    _whole, _parts, merged, out = runs
    xml = JUnitXml.fromfile(str(out.with_suffix(".xml")))
    assert sorted(suite.name for suite in xml) == names
    assert sorted(merged["textfiles"]) == names
    for name, path in merged["textfiles"].items():
        families = {f.name: f for f in text_string_to_metric_families(Path(path).read_text())}
        ok = {s.labels["check"]: s.value for s in families["gpuprov_check_ok"].samples}
        checks = {**statuses(merged)[name], **statuses(merged, fleet=True)[name]}
        assert ok == {c: 1.0 if s == "pass" else 0.0 for c, s in checks.items()}


def test_a_missing_shard_is_refused_and_nothing_written(fleet, runs, tmp_path):
    env, _names = fleet
    _whole, parts, _merged, _out = runs
    extra = tmp_path / "collected"
    extra.mkdir()
    proc = invoke("reports.merge", "--out", str(tmp_path / "fleet.json"), "--report", parts[0]["report"],
                  "--report", str(extra), check_code=2, env={**env, "INVOKE_GPUPROV_REPORTS": str(tmp_path)})
    assert "the folder has no validate-*.json report" in proc.stderr
    copied = extra / "validate-shard1.json"
    copied.write_text(Path(parts[0]["report"]).read_text())      # shard 1 twice (an identical copy), no shard 2
    proc = invoke("reports.merge", "--out", str(tmp_path / "fleet.json"), "--report", parts[0]["report"],
                  "--report", str(copied), check_code=2, env={**env, "INVOKE_GPUPROV_REPORTS": str(tmp_path)})
    assert "error: reports.merge: shards 2 of 2 are missing" in proc.stderr
    assert not (tmp_path / "fleet.json").exists() and not (tmp_path / "textfile").exists()
