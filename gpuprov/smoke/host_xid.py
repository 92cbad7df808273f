"""host.xid: no Xid error in the kernel log since boot, each one found named with NVIDIA's meaning.

The log is `journalctl -k -b -o cat` (this boot's kernel messages), else `dmesg` (the ring buffer, which can
have wrapped on a long-running host). Every `NVRM: Xid (PCI:...): N, ...` line is an event; xid.py gives each
number its meaning from NVIDIA's Xid catalog, its class and its verdict (memory, bus, NVLink and hardware Xids
fail; application faults such as 13/31/43 warn; informational ones are listed only).
"""

from __future__ import annotations

import collections
import time

from . import xid
from .core import FAIL, PASS, SKIP, Result, check

NAME = "host.xid"
SOURCES = (["journalctl", "-k", "-b", "-o", "cat", "--no-pager"], ["dmesg"])
MAX_LISTED = 20


def kernel_log(ctx) -> tuple[str | None, str, list[str]]:
    """(log text or None, the command that gave it, why each source before it gave nothing)."""
    failures = []
    for argv in SOURCES:
        rc, out, err = ctx.run(argv, timeout=60)
        lines = [line for line in out.splitlines() if line.strip() and line.strip() != "-- No entries --"]
        if rc == 0 and lines:
            return out, " ".join(argv), failures
        detail = (err or out).strip()
        if rc == 0:
            detail = "no kernel messages"
        failures.append(f"{' '.join(argv)}: {detail.splitlines()[-1] if detail else f'exit {rc}'}")
    return None, "", failures


@check(NAME, timeout=90)
def run(ctx) -> Result:
    start = time.monotonic()
    text, source, failures = kernel_log(ctx)
    if text is None:
        return Result(NAME, SKIP, "cannot read the kernel log: " + "; ".join(failures), {"sources": failures},
                      seconds=time.monotonic() - start)
    events = xid.parse_kernel_log(text)
    counts = collections.Counter((e.number, e.pci) for e in events)
    listed = []
    by_number: dict[int, dict] = {}
    for (number, pci), count in sorted(counts.items()):
        meaning = xid.classify(number)
        listed.append(f"{meaning.name()} x{count} on {pci} [{meaning.klass}, NVIDIA action {meaning.action or '-'}]")
        entry = by_number.setdefault(number, {"meaning": meaning.description, "mnemonic": meaning.mnemonic,
                                              "class": meaning.klass, "action": meaning.action,
                                              "verdict": meaning.status, "count": 0, "gpus": []})
        entry["count"] += count
        entry["gpus"].append(pci)
    figures = {"source": source, "events": len(events), "xids": {str(k): v for k, v in by_number.items()},
               "first_lines": [e.line for e in events[:5]]}
    thresholds = {"xid_events": 0}
    status = xid.verdict(events)
    seconds = time.monotonic() - start
    if not events:
        return Result(NAME, PASS, f"no Xid in the kernel log since boot ({source})", figures, thresholds, seconds)
    shown = "; ".join(listed[:MAX_LISTED]) + (f"; and {len(listed) - MAX_LISTED} more" if len(listed) > MAX_LISTED
                                               else "")
    if status == PASS:
        return Result(NAME, PASS, f"only informational Xids since boot: {shown}", figures, thresholds, seconds)
    prefix = ("Xid errors since boot" if status == FAIL
              else "Xids since boot that are application faults or that NVIDIA says to ignore")
    return Result(NAME, status, f"{prefix}: {shown}", figures, thresholds, seconds)
