"""host.persistence: persistence mode is on for every GPU (`--query-gpu=persistence_mode`).

Without it the driver tears the GPUs down when the last client exits and every new job pays the initialisation
(seconds per GPU) and may see the GPUs in a different state.
"""

from __future__ import annotations

import time

from . import nvsmi
from .core import FAIL, PASS, Result, check

NAME = "host.persistence"


@check(NAME, timeout=60)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    rows = nvsmi.query(ctx)
    modes = {f"{row['index']} ({row['pci.bus_id']})": nvsmi.value(row["persistence_mode"]) for row in rows}
    off = [gpu for gpu, mode in modes.items() if mode != "Enabled"]
    figures = {"persistence_mode": modes}
    seconds = time.monotonic() - start
    if off:
        return Result(NAME, FAIL, f"persistence mode is off on GPU {', '.join(off)}: enable nvidia-persistenced",
                      figures, {"persistence_mode": "Enabled"}, seconds)
    return Result(NAME, PASS, f"persistence mode on for all {len(rows)} GPUs", figures,
                  {"persistence_mode": "Enabled"}, seconds)
