"""host.clocks: no clock-event (throttle) reason other than idle or the application-clocks setting under load.

Reasons come from `nvidia-smi -q -x` `<clocks_event_reasons>` (`<clocks_throttle_reasons>` before driver 535),
sampled while a short GPU load runs (load.py). Judged:

- fail: HW slowdown, HW thermal slowdown, HW power brake slowdown (the board's power brake, e.g. a PSU or power
  cable fault), SW thermal slowdown, sync boost, display clock setting: something holds the clocks down that a
  healthy, well-cooled, well-powered GPU does not show;
- warn: SW power cap: the GPU is at its configured power limit. A full matmul load can reach the limit on a
  healthy GPU, so it is reported with the figures rather than failed; `--strict` fails it;
- ignored: GPU idle and applications clocks setting.

Without a load (no torch, or torch sees no CUDA device), the reasons are read at idle: a hardware slowdown shows
there too and fails; otherwise the check skips, saying what went unjudged.
"""

from __future__ import annotations

import time

from . import load, nvsmi
from .core import FAIL, PASS, SKIP, WARN, Result, check

NAME = "host.clocks"
ALLOWED = {"gpu_idle", "applications_clocks_setting"}
WARN_ONLY = {"sw_power_cap"}
SAMPLES = 3
SETTLE_SECONDS = 2.0
INTERVAL_SECONDS = 0.5

LABELS = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake slowdown",
    "sw_thermal_slowdown": "SW thermal slowdown",
    "sw_power_cap": "SW power cap",
    "sync_boost": "sync boost",
    "display_clocks_setting": "display clock setting",
}


def active_reasons(reports: list[dict]) -> dict[str, set[str]]:
    """Per GPU (bus id), every reason seen active in any sample."""
    out: dict[str, set[str]] = {}
    for report in reports:
        for gpu in report["gpus"]:
            reasons = gpu["clock_reasons"] or {}
            out.setdefault(gpu["bus_id"], set()).update(name for name, on in reasons.items() if on)
    return out


@check(NAME, timeout=120)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    reports, gpu_load = load.sample_xml(ctx, SETTLE_SECONDS, SAMPLES, INTERVAL_SECONDS)
    seen = active_reasons(reports)
    no_reasons = [gpu["bus_id"] for gpu in reports[0]["gpus"] if gpu["clock_reasons"] is None]
    figures = {"under_load": gpu_load.active, "samples": len(reports),
               "active": {bus: sorted(names) for bus, names in seen.items()}}
    thresholds = {"allowed": sorted(ALLOWED), "warn": sorted(WARN_ONLY)}
    bad, capped = [], []
    for bus, names in seen.items():
        order = list(LABELS)
        hard = sorted(names - ALLOWED - WARN_ONLY, key=lambda n: (order.index(n) if n in order else len(order), n))
        if hard:
            bad.append(f"{bus}: {', '.join(LABELS.get(n, n) for n in hard)}")
        if names & WARN_ONLY:
            capped.append(bus)
    when = "under load" if gpu_load.active else "at idle"
    seconds = time.monotonic() - start
    if not seen:
        return Result(NAME, FAIL, "nvidia-smi -q -x listed no GPU", figures, thresholds, seconds)
    if bad:
        return Result(NAME, FAIL, f"clocks held down {when}: " + "; ".join(bad), figures, thresholds, seconds)
    if len(no_reasons) == len(seen):
        return Result(NAME, SKIP, "nvidia-smi reports no clock event reasons for these GPUs", figures,
                      thresholds, seconds)
    if capped:
        return Result(NAME, WARN, f"SW power cap active {when} on {', '.join(capped)}: the GPUs run at their power "
                                  "limit", figures, thresholds, seconds)
    if not gpu_load.active:
        return Result(NAME, SKIP, f"no clock event reason active at idle on {len(seen)} GPUs; not judged under "
                                  f"load ({gpu_load.reason})", figures, thresholds, seconds)
    return Result(NAME, PASS, f"no clock event reason other than idle or application clocks under load on "
                              f"{len(seen)} GPUs", figures, thresholds, seconds)
