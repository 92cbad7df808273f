"""tools.nccl_tests: nccl-tests' `all_reduce_perf` across the host's GPUs, judged from its output, not its exit code.

Runs `all_reduce_perf -b 8 -e 256M -f 2 -g N` (`-e 8G` at burn-in) with N the GPUs nvidia-smi lists. The
upstream tool (NVIDIA/nccl-tests) prints a results table, one row per size: size, count, type, redop, root, then
out-of-place time, algbw, busbw, #wrong and the same in place (`#wrong` is `N/A` where not checked), and ends with
`# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth    : X`; it has no JSON output (only CSV with
`-F FILE`), so the table is parsed. Verdict: any row with wrong elements, out-of-bounds values, or no result
rows -> fail; otherwise pass with the average and the peak bus bandwidth (the datasheet judgement is
perf.allreduce's). Not installed -> skip. The binary is the config's `nccl_tests` path, else `all_reduce_perf`
on PATH or under /opt/nccl-tests/build or /usr/local/nccl-tests/build.
"""

from __future__ import annotations

import os
import re
import shutil
import time

from . import nvsmi
from .core import FAIL, PASS, SKIP, Result, check

NAME = "tools.nccl_tests"
BINARY = "all_reduce_perf"
PLACES = ("/opt/nccl-tests/build", "/usr/local/nccl-tests/build", "/usr/local/bin")
MAX_BYTES = {"quick": "256M", "burn-in": "8G"}
TIMEOUT = {"quick": 300, "burn-in": 1500}

_ROW = re.compile(r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?P<root>-?\d+)\s+"
                  r"(?P<rest>.+)$")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_output(text: str) -> dict:
    """nccl-tests output -> {"rows": [{size, oop_busbw, oop_wrong, ip_busbw, ip_wrong, ...}], "oob": int|None,
    "oob_status": "OK"|"FAILED"|None, "avg_busbw": float|None, "errors": [lines that say an error]}."""
    rows, errors = [], []
    oob = oob_status = avg = None
    for raw in text.splitlines():
        line = re.sub(r"^\[\d+,\d+\]<std(?:out|err)>:", "", raw)  # mpirun --tag-output prefixes
        if line.lstrip().startswith("#"):
            body = line.lstrip("# ").strip()
            match = re.match(r"Out of bounds values\s*:\s*(\d+)\s*(\w+)?", body)
            if match:
                oob, oob_status = int(match.group(1)), match.group(2)
            match = re.match(r"Avg bus bandwidth\s*:\s*([\d.eE+-]+)", body)
            if match:
                avg = _num(match.group(1))
            continue
        row = _ROW.match(line)
        if row:
            rest = row.group("rest").split()
            if len(rest) >= 4:
                entry = {"size": int(row.group("size")), "type": row.group("type"), "redop": row.group("redop"),
                         "oop_time_us": _num(rest[0]), "oop_algbw": _num(rest[1]), "oop_busbw": _num(rest[2]),
                         "oop_wrong": rest[3]}
                if len(rest) >= 8:
                    entry.update({"ip_time_us": _num(rest[4]), "ip_algbw": _num(rest[5]), "ip_busbw": _num(rest[6]),
                                  "ip_wrong": rest[7]})
                rows.append(entry)
                continue
        if re.search(r"(?i)\b(error|failed|abort)\b", line) and "NCCL INFO" not in line:
            errors.append(line.strip())
    return {"rows": rows, "oob": oob, "oob_status": oob_status, "avg_busbw": avg, "errors": errors}


def wrong_rows(parsed: dict) -> list[str]:
    """Rows whose result check found wrong elements (`#wrong` neither 0 nor N/A)."""
    out = []
    for row in parsed["rows"]:
        for place in ("oop", "ip"):
            wrong = row.get(f"{place}_wrong")
            if wrong not in (None, "0", "N/A"):
                out.append(f"{row['size']} B {'out-of-place' if place == 'oop' else 'in-place'}: {wrong} wrong")
    return out


def find_binary(ctx) -> str | None:
    configured = ctx.config.get("nccl_tests")
    if configured:
        return configured
    found = shutil.which(BINARY)
    if found:
        return found
    for place in PLACES:
        candidate = os.path.join(place, BINARY)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


@check(NAME, timeout=1600)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    binary = find_binary(ctx)
    if not binary:
        return Result(NAME, SKIP, f"nccl-tests is not installed ({BINARY} not on PATH nor in {', '.join(PLACES)})",
                      {})
    gpus = len(nvsmi.query(ctx))
    argv = [binary, "-b", "8", "-e", MAX_BYTES.get(ctx.level, "256M"), "-f", "2", "-g", str(gpus)]
    rc, out, err = ctx.run(argv, timeout=TIMEOUT.get(ctx.level, 300))
    parsed = parse_output(out)
    busbw = [b for r in parsed["rows"] for b in (r.get("oop_busbw"), r.get("ip_busbw")) if b is not None]
    figures = {"gpus": gpus, "exit_code": rc, "rows": len(parsed["rows"]), "avg_busbw_gbs": parsed["avg_busbw"],
               "peak_busbw_gbs": max(busbw) if busbw else None, "out_of_bounds": parsed["oob"]}
    thresholds = {"wrong": 0, "out_of_bounds": 0}
    seconds = time.monotonic() - start
    command = " ".join(argv)
    if rc == 124:
        return Result(NAME, FAIL, f"`{command}` hung: {err.strip()}", figures, thresholds, seconds)
    if not parsed["rows"]:
        detail = (parsed["errors"] or (err.strip() or out.strip()).splitlines() or ["no output"])[-1]
        return Result(NAME, FAIL, f"`{command}` printed no result row (exit {rc}): {detail[:300]}", figures,
                      thresholds, seconds)
    wrong = wrong_rows(parsed)
    if wrong or parsed["oob"] or parsed["oob_status"] == "FAILED":
        return Result(NAME, FAIL, "all-reduce results wrong: " + "; ".join(wrong or [f"{parsed['oob']} out of "
                                                                                      "bounds values"]),
                      figures, thresholds, seconds)
    if parsed["oob"] is None:
        return Result(NAME, FAIL, f"`{command}` stopped before its summary (exit {rc}); last rows at "
                                  f"{parsed['rows'][-1]['size']} B", figures, thresholds, seconds)
    average = "n/a" if parsed["avg_busbw"] is None else f"{parsed['avg_busbw']:g}"
    peak = f"{max(busbw):g}" if busbw else "n/a"
    return Result(NAME, PASS, f"all_reduce_perf on {gpus} GPUs correct at every size; bus bandwidth average "
                              f"{average} GB/s, peak {peak} GB/s", figures, thresholds, seconds)
