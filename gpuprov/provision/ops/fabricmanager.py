"""Fabric Manager on NVSwitch systems: exactly the driver's version, enabled and running; with it NSCQ (DCGM's
NVSwitch library, also at the driver's version) and, on fourth-generation NVSwitch systems (HGX/DGX B200, B300),
the NVLink Subnet Manager. Fabric Manager's service starts NVLSM itself (nvidia-fabricmanager-start.sh, Fabric
Manager user guide), so nvlsm has no service of its own to manage here.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.core.operations import Change, OpContext, package_change
from gpuprov.provision.ops.base import driver_service, stack_packages

COMPONENT = "fabricmanager"
SERVICE = "nvidia-fabricmanager"
# Sections installed with Fabric Manager; the first two must carry the driver's version.
SECTIONS = ("fabricmanager", "nscq", "nvlsm")


def changes(ctx: OpContext) -> Iterator[Change]:
    if ctx.stack.get("fabricmanager") is None:
        return
    driver_version = str(ctx.stack["driver"]["version"])
    for section, what in (("fabricmanager", "Fabric Manager"), ("nscq", "NSCQ")):
        entry = ctx.stack.get(section)
        if entry is not None and str(entry["version"]) != driver_version:
            raise ctx.error(COMPONENT, f"{what} {entry['version']} does not match driver {driver_version}; "
                            "it would refuse to work with it",
                            f"re-resolve the stack: {what} must be exactly the driver's version")
    wanted = [pkg for section in SECTIONS for pkg in stack_packages(ctx, section)]
    change = package_change(ctx, COMPONENT, wanted)
    if change is not None:
        yield change
    service = driver_service(ctx, COMPONENT, SERVICE)
    if service is not None:
        yield service
