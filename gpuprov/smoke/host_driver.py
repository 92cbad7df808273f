"""host.driver: the loaded driver is the provisioned one, and its kernel module matches its libraries.

The version comes from `nvidia-smi --query-gpu=driver_version` (what NVML reports for the loaded module). A
driver/library mismatch (a driver upgrade without a reboot) shows as nvidia-smi failing with NVIDIA's "Failed to
initialize NVML: Driver/library version mismatch" (NVML refuses to start when its library and the loaded module
differ, so a version NVML reports is the loaded module's); this check owns that failure, and a missing or
unloaded driver, so the other nvidia-smi checks skip on it (see nvsmi.unavailable). The first line of
`/proc/driver/nvidia/version` is recorded (module version and flavour, open or proprietary), not judged: inside a
container it is the host kernel's, whatever the container's libraries.
"""

from __future__ import annotations

import re
import time

from . import nvsmi
from .core import FAIL, PASS, SKIP, Result, check, version_matches

NAME = "host.driver"
PROC_VERSION = "/proc/driver/nvidia/version"


def kernel_module(path: str | None = None) -> dict | None:
    """The loaded kernel module from /proc/driver/nvidia/version: {"version", "flavour"} (None: not readable)."""
    try:
        with open(path or PROC_VERSION, encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
    except OSError:
        return None
    match = re.search(r"(Open )?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", first)
    if not match:
        return None
    return {"version": match.group(2), "flavour": "open" if match.group(1) else "proprietary"}


@check(NAME, timeout=60)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    expected = ctx.expect("driver")
    thresholds = {"driver": expected}
    rows = nvsmi.query(ctx)
    versions = sorted({row["driver_version"] for row in rows})
    module = kernel_module()
    figures = {"driver_version": versions[0] if len(versions) == 1 else versions, "kernel_module": module}
    seconds = time.monotonic() - start
    if len(versions) != 1:
        return Result(NAME, FAIL, f"GPUs report different driver versions: {', '.join(versions)}", figures,
                      thresholds, seconds)
    found = versions[0]
    if not expected:
        return Result(NAME, SKIP, f"driver {found} loaded; the config names no provisioned driver version",
                      figures, thresholds, seconds)
    if not version_matches(expected, found):
        return Result(NAME, FAIL, f"driver {found} is loaded, {expected} was provisioned", figures, thresholds,
                      seconds)
    return Result(NAME, PASS, f"driver {found}, as provisioned; kernel module and libraries agree", figures,
                  thresholds, seconds)
