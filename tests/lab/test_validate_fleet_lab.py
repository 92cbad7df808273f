"""One host cannot sink or skew the fleet, over real SSH: of three lab hosts, one answers `invoke validate` with a
forged suite document (its venv's python replaced by a script that prints absurd figures). That host fails with
the figure and the bound it broke; the two others are validated, judged without it, and get their reports and
textfiles.

The module brings up three hgx-h100 hosts of its own (not provisioned: the suite's venv and the checks it runs
here need no NVIDIA software) and builds their suite environments once. The bound in the expected reason is
worked out by hand from gpuprov/data/gpus.yaml: H100-SXM dense bf16 989 TFLOP/s, + 5 % = 1038.45.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

import pytest
from labutil import invoke, on_host

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts
PROFILES = ["hgx-h100"] * 3
PYTHON = "/opt/gpuprov/venv/bin/python"
TEXTFILE = "/var/lib/prometheus/node-exporter/gpuprov_validate.prom"   # validate.textfile_dir's default
FORGED = {"schema": 1, "host": "forged", "level": "quick", "strict": False, "started": "2026-01-01T00:00:00+00:00",
          "seconds": 1.0, "versions": {"python": "3.11", "torch": "2.13.0", "cuda": "12.8"},
          "results": [{"check": "perf.matmul", "status": "pass", "reason": "forged",
                       "figures": {"bf16_tflops": 1e300, "fp32_tflops": 1e300}, "thresholds": {}, "seconds": 1.0},
                      {"check": "host.shm", "status": "pass", "reason": "forged", "figures": {}, "thresholds": {},
                       "seconds": 0.1}]}


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """Three hgx-h100 hosts with the suite's venv built from the wheelhouse; their state, env and names."""
    import gpuprov.lab

    state = gpuprov.lab.up(len(PROFILES), PROFILES, paths=lab.paths, fresh=True)
    folder = tmp_path_factory.mktemp("validate-fleet")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    run = validate(env, "--all", "--only", "host.shm", "--no-textfile")   # builds the venvs
    assert all(h["error"] is None and h["env"]["installed"] for h in run["hosts"]), run["hosts"]
    return state, env, [h.name for h in state.hosts]


def validate(env: dict, *args: str, check_code: int | None = 0) -> dict:
    """`invoke validate ... --json` with its reports in a folder of its own (no fleet history but its own)."""
    reports = tempfile.mkdtemp(prefix="validate-", dir=env["INVOKE_GPUPROV_REPORTS"].rsplit("/", 1)[0])
    proc = invoke("validate", *args, "--json", check_code=check_code, env={**env, "INVOKE_GPUPROV_REPORTS": reports})
    return json.loads(proc.stdout)


def textfile_checks(state, name: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(on_host(state, name, f"cat {TEXTFILE}"))}
    assert {s.labels["host"] for f in families.values() for s in f.samples} == {name}
    return {s.labels["check"]: s.value for s in families["gpuprov_check_ok"].samples}


def test_a_host_answering_with_a_forged_document_fails_alone(fleet):
    state, env, (first, second, liar) = fleet
    script = f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(FORGED)}\nEOF\n"
    on_host(state, liar, f"rm -f {PYTHON} && printf '%s' {shlex.quote(script)} > {PYTHON} && chmod 0755 {PYTHON}")
    run = validate(env, "--all", "--only", "perf.matmul,host.shm", check_code=1)
    hosts = {h["host"]: h for h in run["hosts"]}
    saved = json.loads(Path(run["report"]).read_text())   # the run report holds every host, the forged one too
    assert sorted(h["host"] for h in saved["hosts"]) == sorted((first, second, liar))

    forged = hosts[liar]
    assert forged["status"] == "error" and forged["results"] == [] and forged["error"]["step"] == "suite"
    assert forged["error"]["error"] == (
        "the suite printed no valid result document (results[0].figures.bf16_tflops: perf.matmul bf16_tflops "
        "1e+300 TFLOP/s is above what the GPU can do: 1038.45 (the datasheet's bf16_tflops 989 + 5 %)); exit 0")
    # the run went on: the forged host's textfile says its validation failed
    assert forged["textfile"] == {"path": TEXTFILE}
    assert textfile_checks(state, liar) == {"validation": 0.0}

    for name in (first, second):
        entry = hosts[name]
        assert entry["error"] is None and entry["textfile"] == {"path": TEXTFILE}, entry
        found = {r["check"]: r for r in entry["results"]}
        assert {c: r["status"] for c, r in found.items()} == {"host.shm": "pass", "perf.matmul": "skip",
                                                              "fleet.perf.matmul": "skip"}, found
        # judged without the forged host: one other host (not two), and three are needed for a verdict
        assert found["fleet.perf.matmul"]["reason"].startswith(
            "only 1 other H100-SXM (CPU, quick) host to compare with, at least 3 needed")
        assert textfile_checks(state, name) == {c: 1.0 if r["status"] == "pass" else 0.0 for c, r in found.items()}
