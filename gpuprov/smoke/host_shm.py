"""host.shm: /dev/shm is at least the config's `shm_min_gib`.

PyTorch DataLoader workers hand batches to the training process through shared memory; a small /dev/shm (a
container's 64 MiB default) kills workers with "bus error" or "No space left on device" mid-epoch.
"""

from __future__ import annotations

import os
import time

from .core import FAIL, PASS, SKIP, Result, check

NAME = "host.shm"
SHM = "/dev/shm"
GIB = 1024**3


def shm_bytes(path: str | None = None) -> tuple[int, int]:
    """(total, free) bytes of the filesystem at `path` (default /dev/shm)."""
    stat = os.statvfs(path or SHM)
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize


@check(NAME, timeout=30)
def run(ctx) -> Result:
    start = time.monotonic()
    minimum = ctx.config.get("shm_min_gib")
    try:
        total, free = shm_bytes()
    except OSError as exc:
        return Result(NAME, FAIL, f"cannot read {SHM}: {exc}", {}, {"shm_min_gib": minimum},
                      time.monotonic() - start)
    figures = {"shm_gib": round(total / GIB, 2), "shm_free_gib": round(free / GIB, 2)}
    thresholds = {"shm_min_gib": minimum}
    seconds = time.monotonic() - start
    if minimum is None:
        return Result(NAME, SKIP, f"{SHM} is {total / GIB:.2f} GiB; the config sets no shm_min_gib", figures,
                      thresholds, seconds)
    if total < float(minimum) * GIB:
        return Result(NAME, FAIL, f"{SHM} is {total / GIB:.2f} GiB, below {minimum} GiB: DataLoader workers run out "
                                  "of shared memory (for containers: --shm-size or --ipc=host)", figures, thresholds,
                      seconds)
    return Result(NAME, PASS, f"{SHM} is {total / GIB:.2f} GiB (at least {minimum} GiB)", figures, thresholds,
                  seconds)
