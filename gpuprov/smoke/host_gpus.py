"""host.gpus: the GPU count and models equal the inventory's `hardware`, and no process is using the GPUs.

Reads `nvidia-smi --query-gpu` (count, names, bus ids) and `nvidia-smi -q -x` (each GPU's `<processes>`): a
compute process (type `C` or `C+G`) already running on a GPU being validated skews every figure the suite
measures, so it fails the check with its pid, name and memory. Graphics-only processes (type `G`, a display
server) are recorded, not failed.
"""

from __future__ import annotations

import time

from . import nvsmi
from .core import FAIL, PASS, SKIP, Result, check

NAME = "host.gpus"


@check(NAME, timeout=60)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    try:
        rows = nvsmi.query(ctx)
    except nvsmi.SmiError as error:
        if error.kind == "no_devices" and not nvsmi.gpus_expected(ctx):
            return Result(NAME, SKIP, "no GPU on this host and none expected", {}, seconds=time.monotonic() - start)
        raise
    names = [row["name"] for row in rows]
    figures = {"count": len(rows), "names": names, "bus_ids": [row["pci.bus_id"] for row in rows],
               "uuids": [row["uuid"] for row in rows]}
    expected_count = ctx.expect("count")
    expected_names = ctx.expect("gpu_names") or []
    thresholds = {"count": expected_count, "gpu_names": expected_names, "gpu": ctx.expect("gpu")}
    problems = []
    if expected_count is not None and len(rows) != int(expected_count):
        problems.append(f"{len(rows)} GPUs on the host, the inventory says {expected_count}")
    if expected_names:
        for row in rows:
            if row["name"] not in expected_names:
                problems.append(f"GPU {row['index']} ({row['pci.bus_id']}) is a {row['name']}, expected "
                                f"{' or '.join(expected_names)} ({ctx.expect('gpu')})")
    try:
        report = nvsmi.query_xml(ctx)
    except nvsmi.SmiError as error:
        problems.append(f"cannot list GPU processes: {error.message}")
        report = {"gpus": []}
    busy, graphics = [], []
    for index, gpu in enumerate(report["gpus"]):
        for proc in gpu["processes"]:
            text = (f"GPU {index} ({gpu['bus_id']}) runs pid {proc['pid']} {proc['name']} "
                    f"({proc['used_mib']} MiB)")
            (busy if "C" in (proc["type"] or "C") else graphics).append(text)
    figures["processes"] = busy
    if graphics:
        figures["graphics_processes"] = graphics
    if busy:
        problems.append("GPUs are in use, so no measurement here is trustworthy: " + "; ".join(busy))
    seconds = time.monotonic() - start
    if problems:
        return Result(NAME, FAIL, "; ".join(problems), figures, thresholds, seconds)
    if expected_count is None and not expected_names:
        return Result(NAME, SKIP, f"{len(rows)} x {', '.join(sorted(set(names)))} found; the config names no "
                                  "expected GPU count or model", figures, thresholds, seconds)
    return Result(NAME, PASS, f"{len(rows)} x {', '.join(sorted(set(names)))}, as the inventory says; no GPU "
                              "process running", figures, thresholds, seconds)
