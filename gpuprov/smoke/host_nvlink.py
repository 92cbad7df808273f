"""host.nvlink: on SXM systems every NVLink of every GPU is up (`nvidia-smi nvlink -s`).

A link that is down prints as `Link n: <inactive>`; a GPU whose links are all down prints NVML's "Unable to
retrieve NVLink information as all links are inactive" instead of its links; a GPU without NVLink prints "Device
does not have or support Nvlink" (a fail on SXM, where NVLink is expected). In MIG mode nvidia-smi cannot query
the links ("Nvlink queries are not supported for Devices in MIG mode"): skip. PCIe form factors have no NVLink
to check: skip. Per-GPU link speeds are recorded; links running at different speeds on one host are reported.
"""

from __future__ import annotations

import time

from . import nvsmi
from .core import FAIL, PASS, SKIP, Result, check

NAME = "host.nvlink"


@check(NAME, timeout=60)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    form = ctx.expect("form_factor")
    if form != "sxm":
        reason = ("the config names no form factor" if not form
                  else f"{ctx.expect('gpu') or 'this GPU'} is a {form} part: no NVLink expected")
        return Result(NAME, SKIP, reason, {}, {"form_factor": form})
    rc, out, err = ctx.run(nvsmi.NVLINK_ARGV, timeout=60)
    gpus = nvsmi.parse_nvlink_status(out)
    if rc != 0 and not gpus:  # nvidia-smi itself failed (no driver, a mismatch): not an NVLink finding
        raise nvsmi.classify_failure(rc, out, err)
    seconds = time.monotonic() - start
    figures = {"gpus": {f"GPU {g['index']}": {"links": len(g["links"]),
                                              "active": sum(1 for s in g["links"].values() if s is not None),
                                              "gbs": sorted({s for s in g["links"].values() if s is not None}),
                                              **({"message": g["message"]} if g["message"] else {})}
                        for g in gpus}}
    thresholds = {"inactive_links": 0}
    if not gpus:
        return Result(NAME, FAIL, f"nvidia-smi nvlink -s listed no GPU (exit {rc}): {(out or err).strip()[:200]}",
                      figures, thresholds, seconds)
    if all(g["message"] and "MIG mode" in g["message"] for g in gpus):
        return Result(NAME, SKIP, "GPUs are in MIG mode: nvidia-smi cannot query NVLink there", figures,
                      thresholds, seconds)
    problems = []
    for gpu in gpus:
        label = f"GPU {gpu['index']}"
        if gpu["message"] and not gpu["links"]:
            problems.append(f"{label}: {gpu['message']}")
            continue
        down = sorted(link for link, speed in gpu["links"].items() if speed is None)
        if down:
            problems.append(f"{label}: {len(down)} of {len(gpu['links'])} links inactive (link "
                            f"{', '.join(map(str, down))})")
    counts = {len(g["links"]) for g in gpus if g["links"]}
    if len(counts) > 1:
        problems.append(f"GPUs report different NVLink counts: {sorted(counts)}")
    if problems:
        return Result(NAME, FAIL, "NVLink down: " + "; ".join(problems), figures, thresholds, seconds)
    speeds = sorted({s for g in gpus for s in g["links"].values()})
    return Result(NAME, PASS, f"all {sum(len(g['links']) for g in gpus)} NVLinks of {len(gpus)} GPUs active at "
                              f"{', '.join(f'{s:g}' for s in speeds)} GB/s", figures, thresholds, seconds)
