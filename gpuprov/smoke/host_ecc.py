"""host.ecc: no uncorrectable ECC errors, no pending page retirement, no pending row remap, no remap failure.

Counters come from `--query-gpu` (`ecc.errors.uncorrected.volatile.total`: since the driver loaded;
`...aggregate.total`: the GPU's lifetime; `retired_pages.pending`, pre-Ampere); row remapping (Ampere and newer)
from `nvidia-smi -q -x` `<remapped_rows>`. NVIDIA's NVML documentation on row remapping: "isPending indicates
whether or not there are pending remappings. A reset will be required to actually remap the row.
failureOccurred will be set if a row remapping ever failed in the past." A pending remap fails until the GPU is
reset; a remap failure means the GPU needs replacing.
"""

from __future__ import annotations

import time

from . import nvsmi
from .core import FAIL, PASS, WARN, Result, check

NAME = "host.ecc"


@check(NAME, timeout=60)
def run(ctx) -> Result:
    start = time.monotonic()
    try:
        rows = nvsmi.query(ctx)
        report = nvsmi.query_xml(ctx)
    except nvsmi.SmiError as error:
        return nvsmi.unavailable(ctx, NAME, error, time.monotonic() - start)
    by_bus = {gpu["bus_id"].lower(): gpu for gpu in report["gpus"] if gpu["bus_id"]}
    failures, warnings, per_gpu = [], [], {}
    for row in rows:
        label = f"GPU {row['index']} ({row['pci.bus_id']})"
        xml = by_bus.get(row["pci.bus_id"].lower(), {})
        volatile = nvsmi.number(row["ecc.errors.uncorrected.volatile.total"])
        aggregate = nvsmi.number(row["ecc.errors.uncorrected.aggregate.total"])
        if volatile is None:
            volatile = xml.get("uncorrectable_volatile")
        if aggregate is None:
            aggregate = xml.get("uncorrectable_aggregate")
        mode = nvsmi.value(row["ecc.mode.current"])
        pending_pages = nvsmi.value(row["retired_pages.pending"])
        remap = xml.get("remapped_rows")
        per_gpu[label] = {"ecc_mode": mode, "uncorrected_volatile": volatile, "uncorrected_aggregate": aggregate,
                          "retired_pages_pending": pending_pages, "remapped_rows": remap}
        if volatile:
            failures.append(f"{label}: {int(volatile)} uncorrectable ECC errors since the driver loaded")
        if aggregate:
            failures.append(f"{label}: {int(aggregate)} uncorrectable ECC errors in the GPU's lifetime")
        if pending_pages == "Yes":
            failures.append(f"{label}: page retirement pending (reset the GPU)")
        if remap:
            if remap.get("pending") == "Yes":
                rows_unc = remap.get("uncorrectable")
                failures.append(f"{label}: row remap pending"
                                + (f" ({rows_unc} rows remapped for uncorrectable errors)" if rows_unc else "")
                                + ": reset the GPU to apply it")
            if remap.get("failure") == "Yes":
                failures.append(f"{label}: row remapping failed: the GPU has no spare rows left, replace it")
        if mode == "Disabled":
            warnings.append(f"{label}: ECC is disabled")
    figures = {"per_gpu": per_gpu}
    thresholds = {"uncorrected": 0, "remap_pending": "No", "remap_failure": "No"}
    seconds = time.monotonic() - start
    if failures:
        return Result(NAME, FAIL, "; ".join(failures + warnings), figures, thresholds, seconds)
    if warnings:
        return Result(NAME, WARN, "; ".join(warnings) + " (uncorrectable errors then go undetected)", figures,
                      thresholds, seconds)
    return Result(NAME, PASS, f"no uncorrectable ECC error, pending retirement or row remap on {len(rows)} GPUs",
                  figures, thresholds, seconds)
