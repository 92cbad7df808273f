"""host.fabric: on NVSwitch systems the fabric manager runs and every GPU's fabric state is Completed/Success.

`systemctl is-active nvidia-fabricmanager` must answer `active`; `nvidia-smi -q -x` `<fabric><state>` must be
`Completed` and `<status>` `Success` on every GPU (the GPU joined the NVLink fabric; until then CUDA fails to
initialise on it). Where systemd cannot be asked (no systemctl, or not booted with systemd, as in a container),
the service state is recorded as unknown and the GPUs' fabric state decides. Hosts without NVSwitch
(`expect.nvswitch` false) skip.
"""

from __future__ import annotations

import time

from . import nvsmi
from .core import FAIL, PASS, SKIP, Result, check

NAME = "host.fabric"
SERVICE = "nvidia-fabricmanager"
UNIT_STATES = ("active", "inactive", "failed", "activating", "deactivating", "reloading", "refreshing", "unknown")


@check(NAME, timeout=60)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    if not ctx.expect("nvswitch"):
        reason = ("the config does not say whether this host has NVSwitch" if ctx.expect("nvswitch") is None
                  else "no NVSwitch on this host: no fabric manager needed")
        return Result(NAME, SKIP, reason, {}, {"nvswitch": ctx.expect("nvswitch")})
    rc, out, err = ctx.run(["systemctl", "is-active", SERVICE], timeout=30)
    service = out.strip()
    if service not in UNIT_STATES:  # no systemd to ask (a container): the GPUs' fabric state still tells
        detail = (err.strip() or out.strip() or f"exit {rc}").splitlines()
        service = "systemctl not found" if rc == 127 else f"unknown ({detail[0][:120]})"
    report = nvsmi.query_xml(ctx)
    states = {gpu["bus_id"]: (gpu["fabric"] or {}) for gpu in report["gpus"]}
    figures = {"fabricmanager": service,
               "fabric": {bus: f"{f.get('state')}/{f.get('status')}" for bus, f in states.items()}}
    thresholds = {"fabricmanager": "active", "fabric": "Completed/Success"}
    problems = []
    if service in UNIT_STATES and service != "active":
        problems.append(f"{SERVICE} is {service}, not active")
    not_done = [f"{bus} {f.get('state') or 'no fabric state'}/{f.get('status') or '-'}"
                for bus, f in states.items() if (f.get("state"), f.get("status")) != ("Completed", "Success")]
    if not_done:
        problems.append("GPU fabric state not Completed/Success: " + "; ".join(not_done))
    if not states:
        problems.append("nvidia-smi -q -x listed no GPU")
    seconds = time.monotonic() - start
    if problems:
        return Result(NAME, FAIL, "; ".join(problems), figures, thresholds, seconds)
    return Result(NAME, PASS, f"{SERVICE} {service}; fabric Completed/Success on all {len(states)} GPUs", figures,
                  thresholds, seconds)
