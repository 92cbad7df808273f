"""tools.dcgm: NVIDIA DCGM's diagnostic, `dcgmi diag -r LEVEL -j`, read from its JSON, never from its exit code.

Level 1 (seconds: deployment checks) at `--level quick`, 3 (about 15 minutes of hardware stress) at `burn-in`;
the config's `dcgm_level` overrides. The JSON (NVIDIA/DCGM `nvvs/include/NvvsJsonStrings.h`): a root object
`DCGM GPU Diagnostic` (DCGM 3) or `DCGM Diagnostic` (DCGM 4) with `test_categories[].tests[]`, each test a
`name` and `results[]` of `status` (Pass/Fail/Warn/Skip, any case; "Not Run"), `gpu_ids`/`gpu_id`/`entity_id`,
and `warnings[]` (text, or objects with `warning` and `error_id`); a `runtime_error` when the run could not start.
dcgmi may print a line before the JSON; the document starts at the first `{`.

Verdict: any test failed -> fail (naming the tests, GPUs and DCGM's warnings); a warn -> warn; tests that were
skipped or not run are listed; no test result at all -> fail; dcgmi not installed -> skip.
"""

from __future__ import annotations

import json
import time

from .core import FAIL, PASS, SKIP, WARN, Result, check

NAME = "tools.dcgm"
LEVEL_FOR = {"quick": 1, "burn-in": 3}
TIMEOUT_FOR = {1: 120, 2: 600, 3: 2100, 4: 5400}


def _status(raw) -> str:
    word = " ".join(str(raw or "").lower().split())
    if word in ("pass", "passed"):
        return PASS
    if word in ("fail", "failed", "error"):
        return FAIL
    if word in ("warn", "warning"):
        return WARN
    if word in ("skip", "skipped", "not applicable", "n/a"):
        return SKIP
    return "not run"


def _warnings(result: dict) -> list[str]:
    out = []
    for item in result.get("warnings") or []:
        if isinstance(item, dict):
            text = item.get("warning") or item.get("message") or json.dumps(item)
            if item.get("error_id") is not None:
                text = f"{text} (DCGM error {item['error_id']})"
            out.append(str(text))
        elif item:
            out.append(str(item))
    return out


def parse_diag(text: str) -> dict:
    """dcgmi diag -j output -> {"version", "tests": [{"name", "category", "results": [{"gpu", "status",
    "warnings"}]}], "runtime_error"}. Raises ValueError when there is no JSON document."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON document in dcgmi's output")
    document = json.loads(text[start:text.rfind("}") + 1])
    root = document.get("DCGM GPU Diagnostic") or document.get("DCGM Diagnostic") or document
    tests = []
    categories = root.get("test_categories") or []
    pairs = [(c.get("category"), t) for c in categories if isinstance(c, dict) for t in (c.get("tests") or [])]
    pairs += [(None, t) for t in (root.get("tests") or [])]
    for category, test in pairs:
        if not isinstance(test, dict):
            continue
        results = []
        for result in test.get("results") or []:
            if not isinstance(result, dict):
                continue
            gpu = next((result[k] for k in ("gpu_ids", "gpu_id", "entity_id") if k in result), None)
            results.append({"gpu": gpu, "status": _status(result.get("status")), "warnings": _warnings(result)})
        tests.append({"name": test.get("name") or "unnamed test", "category": category, "results": results})
    metadata = document.get("metadata") or {}
    return {"version": root.get("version") or metadata.get("version"),
            "runtime_error": root.get("runtime_error") or document.get("runtime_error"), "tests": tests}


@check(NAME, timeout=5600, levels=("quick", "burn-in"))
def run(ctx) -> Result:
    start = time.monotonic()
    level = int(ctx.config.get("dcgm_level") or LEVEL_FOR.get(ctx.level, 1))
    argv = ["dcgmi", "diag", "-r", str(level), "-j"]
    rc, out, err = ctx.run(argv, timeout=TIMEOUT_FOR.get(level, 2100))
    thresholds = {"level": level}
    if rc == 127:
        return Result(NAME, SKIP, "dcgmi is not installed (DCGM)", {}, thresholds, time.monotonic() - start)
    try:
        diag = parse_diag(out)
    except ValueError as exc:
        detail = (err.strip() or out.strip()).splitlines()
        return Result(NAME, FAIL, f"`{' '.join(argv)}` gave no diagnostic document (exit {rc}): "
                                  f"{detail[-1][:300] if detail else exc}", {"exit_code": rc}, thresholds,
                      time.monotonic() - start)
    by_status: dict[str, list[str]] = {}
    details = []
    for test in diag["tests"]:
        statuses = [r["status"] for r in test["results"]] or ["not run"]
        for status in (FAIL, WARN, "not run", SKIP, PASS):
            if status in statuses:
                by_status.setdefault(status, []).append(test["name"])
                break
        for result in test["results"]:
            if result["status"] in (FAIL, WARN):
                details.append(f"{test['name']} GPU {result['gpu']}: {result['status']}"
                               + (f" ({'; '.join(result['warnings'])})" if result["warnings"] else ""))
    figures = {"dcgm_version": diag["version"], "exit_code": rc, "tests": len(diag["tests"]),
               **{status.replace(" ", "_"): names for status, names in by_status.items()}}
    seconds = time.monotonic() - start
    if diag["runtime_error"]:
        return Result(NAME, FAIL, f"dcgmi diag -r {level} could not run: {diag['runtime_error']}", figures,
                      thresholds, seconds)
    if not diag["tests"]:
        return Result(NAME, FAIL, f"dcgmi diag -r {level} reported no test (exit {rc})", figures, thresholds,
                      seconds)
    if FAIL in by_status:
        return Result(NAME, FAIL, f"dcgmi diag -r {level}: " + "; ".join(details), figures, thresholds, seconds)
    if WARN in by_status:
        return Result(NAME, WARN, f"dcgmi diag -r {level}: " + "; ".join(details), figures, thresholds, seconds)
    ran = by_status.get(PASS, [])
    if not ran:
        return Result(NAME, SKIP, f"dcgmi diag -r {level} ran no test: "
                      + ", ".join(by_status.get(SKIP, []) + by_status.get("not run", [])), figures, thresholds,
                      seconds)
    others = by_status.get(SKIP, []) + by_status.get("not run", [])
    return Result(NAME, PASS, f"dcgmi diag -r {level}: {len(ran)} tests passed"
                  + (f", {len(others)} skipped or not run ({', '.join(others)})" if others else ""), figures,
                  thresholds, seconds)
