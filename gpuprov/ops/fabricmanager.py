"""Fabric Manager on NVSwitch systems: exactly the driver's version, enabled and running."""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.ops.base import Change, OpContext, package_change, service_change, stack_packages

COMPONENT = "fabricmanager"
SERVICE = "nvidia-fabricmanager"


def changes(ctx: OpContext) -> Iterator[Change]:
    fm = ctx.stack.get("fabricmanager")
    if fm is None:
        return
    if str(fm["version"]) != str(ctx.stack["driver"]["version"]):
        raise ctx.error(COMPONENT, f"Fabric Manager {fm['version']} does not match driver "
                        f"{ctx.stack['driver']['version']}; it would refuse to start",
                        "re-resolve the stack: Fabric Manager must be exactly the driver's version")
    change = package_change(ctx, COMPONENT, stack_packages(ctx, "fabricmanager"))
    if change is not None:
        yield change
    service = service_change(ctx, COMPONENT, SERVICE, ctx.service(SERVICE))
    if service is not None:
        yield service
