"""host.pcie: every GPU's PCIe link runs at its maximum generation and width while a load runs.

Read from `nvidia-smi -q -x` (`pci_gpu_link_info`: `max_link_gen`/`current_link_gen`, `max_link_width`/
`current_link_width`; the maximum is what the GPU and the slot can both do). An idle GPU drops its link
generation to save power, so the generation is judged only under a short GPU load (torch matmul, see load.py),
sampled a few times, the best sample counting. The width does not drop at idle: a link trained at x8 in an x16
slot fails with or without a load. Without a load the check fails on a narrow link and otherwise skips, saying
why the generation went unjudged.
"""

from __future__ import annotations

import time

from . import load, nvsmi
from .core import FAIL, PASS, SKIP, Result, check

NAME = "host.pcie"
SAMPLES = 3
SETTLE_SECONDS = 1.0
INTERVAL_SECONDS = 0.5


def best_links(reports: list[dict]) -> dict[str, dict]:
    """Per GPU (bus id), the highest current generation and width seen across the samples, with the maxima."""
    out: dict[str, dict] = {}
    for report in reports:
        for gpu in report["gpus"]:
            link = gpu["pcie"]
            seen = out.setdefault(gpu["bus_id"], {"max_gen": link["max_gen"], "max_width": link["max_width"],
                                                  "gen": None, "width": None})
            for key, field in (("gen", "current_gen"), ("width", "current_width")):
                if link[field] is not None and (seen[key] is None or link[field] > seen[key]):
                    seen[key] = link[field]
    return out


@check(NAME, timeout=120)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    reports, gpu_load = load.sample_xml(ctx, SETTLE_SECONDS, SAMPLES, INTERVAL_SECONDS)
    links = best_links(reports)
    figures = {"under_load": gpu_load.active, "samples": len(reports),
               "links": {bus: {"gen": f"{v['gen']}/{v['max_gen']}", "width": f"x{v['width']}/x{v['max_width']}"}
                         for bus, v in links.items()}}
    thresholds = {"gen": "max_link_gen", "width": "max_link_width"}
    narrow, slow, unknown = [], [], []
    for bus, link in links.items():
        if None in (link["width"], link["max_width"], link["gen"], link["max_gen"]):
            unknown.append(bus)
            continue
        if link["width"] < link["max_width"]:
            narrow.append(f"{bus} at x{link['width']} of x{link['max_width']}")
        if link["gen"] < link["max_gen"]:
            slow.append(f"{bus} at Gen{link['gen']} of Gen{link['max_gen']}")
    seconds = time.monotonic() - start
    if not links:
        return Result(NAME, FAIL, "nvidia-smi -q -x listed no GPU", figures, thresholds, seconds)
    if narrow:
        return Result(NAME, FAIL, "PCIe link trained below its width: " + "; ".join(narrow)
                      + ("" if not (slow and gpu_load.active) else "; below its generation under load: "
                         + "; ".join(slow)), figures, thresholds, seconds)
    if unknown and len(unknown) == len(links):
        return Result(NAME, SKIP, "nvidia-smi reports no PCIe link figures for these GPUs", figures, thresholds,
                      seconds)
    if not gpu_load.active:
        return Result(NAME, SKIP, f"link width at its maximum on all {len(links)} GPUs; generation not judged "
                                  f"without a GPU load ({gpu_load.reason})", figures, thresholds, seconds)
    if slow:
        return Result(NAME, FAIL, "PCIe link below its maximum generation under load: " + "; ".join(slow),
                      figures, thresholds, seconds)
    return Result(NAME, PASS, f"all {len(links)} GPUs at their maximum PCIe generation and width under load"
                  + (f" (no link figures for {', '.join(unknown)})" if unknown else ""), figures, thresholds,
                  seconds)
