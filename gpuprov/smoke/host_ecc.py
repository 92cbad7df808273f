"""host.ecc: no uncorrectable ECC error left unresolved, no pending page retirement, no pending row remap, no remap
failure.

Counters come from `--query-gpu` (`ecc.errors.uncorrected.volatile.total`: since the driver loaded;
`...aggregate.total`: the GPU's lifetime; `retired_pages.pending`, pre-Ampere); row remapping (Ampere and newer)
from `nvidia-smi -q -x` `<remapped_rows>`. NVIDIA's row-remapping guidance ("NVIDIA GPU Memory Error Management",
docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt: Row Remapping, Error Recovery and Response Flags; NVML
nvmlDeviceGetRemappedRows): a remapped row replaces a degraded DRAM row with a spare one, "persistent throughout
the life of the GPU"; "isPending indicates whether or not there are pending remappings. A reset will be required
to actually remap the row"; "failureOccurred will be set if a row remapping ever failed in the past", NVIDIA's
RMA criterion. So:

- a pending remap fails until the GPU is reset; a remap failure fails (the GPU goes back to NVIDIA, RMA);
- uncorrectable errors since the driver loaded fail (the GPU has not been reset since);
- lifetime uncorrectable errors that row remapping resolved (rows remapped for uncorrectable errors, none pending,
  no failure, no SRAM uncorrectable error, which row remapping does not repair) are history: a warning;
- lifetime uncorrectable errors without that evidence (no row remapper, its state unreadable as under MIG, no row
  remapped for them, or SRAM errors) fail, as before.
"""

from __future__ import annotations

import time

from . import nvsmi
from .core import FAIL, PASS, WARN, Result, check

NAME = "host.ecc"


def remap_history(aggregate: float, remap: dict | None, sram: int | None) -> str:
    """Why `aggregate` lifetime uncorrectable errors count as resolved by row remapping, or "" when they do not."""
    if not remap or sram:
        return ""
    rows = remap.get("uncorrectable")
    if not rows or remap.get("pending") != "No" or remap.get("failure") != "No":
        return ""
    return (f"{int(aggregate)} uncorrectable ECC errors in the GPU's lifetime, resolved by {rows} rows remapped "
            "(no remap pending or failed)")


def unresolved(remap: dict | None, sram: int | None) -> str:
    """Why lifetime uncorrectable errors are not known to be resolved by row remapping."""
    if sram:
        return f"{sram} of them in SRAM, which row remapping does not repair"
    if remap is None:
        return "no row-remapping state to show them resolved (pre-Ampere GPU, or unreadable while MIG is enabled)"
    if remap.get("pending") == "Yes" or remap.get("failure") == "Yes":
        return "row remapping has not resolved them"
    return "no row was remapped for them"


@check(NAME, timeout=60)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    rows = nvsmi.query(ctx)
    report = nvsmi.query_xml(ctx)
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
        sram = xml.get("sram_uncorrectable_aggregate")
        per_gpu[label] = {"ecc_mode": mode, "uncorrected_volatile": volatile, "uncorrected_aggregate": aggregate,
                          "retired_pages_pending": pending_pages, "remapped_rows": remap}
        if volatile:
            failures.append(f"{label}: {int(volatile)} uncorrectable ECC errors since the driver loaded")
        if aggregate:
            history = remap_history(aggregate, remap, sram)
            if history:
                warnings.append(f"{label}: {history}")
            else:
                failures.append(f"{label}: {int(aggregate)} uncorrectable ECC errors in the GPU's lifetime "
                                f"({unresolved(remap, sram)})")
        if pending_pages == "Yes":
            failures.append(f"{label}: page retirement pending (reset the GPU)")
        if remap:
            if remap.get("pending") == "Yes":
                rows_unc = remap.get("uncorrectable")
                failures.append(f"{label}: row remap pending"
                                + (f" ({rows_unc} rows remapped for uncorrectable errors)" if rows_unc else "")
                                + ": reset the GPU to apply it")
            if remap.get("failure") == "Yes":
                failures.append(f"{label}: row remapping failed: the GPU has no spare rows left, replace it (RMA)")
        if mode == "Disabled":
            warnings.append(f"{label}: ECC is disabled (uncorrectable errors then go undetected)")
    figures = {"per_gpu": per_gpu}
    thresholds = {"uncorrected_volatile": 0, "uncorrected_aggregate": "0, or resolved by row remapping (warn)",
                  "remap_pending": "No", "remap_failure": "No"}
    seconds = time.monotonic() - start
    if failures:
        return Result(NAME, FAIL, "; ".join(failures + warnings), figures, thresholds, seconds)
    if warnings:
        return Result(NAME, WARN, "; ".join(warnings), figures, thresholds, seconds)
    return Result(NAME, PASS, f"no uncorrectable ECC error, pending retirement or row remap on {len(rows)} GPUs",
                  figures, thresholds, seconds)
