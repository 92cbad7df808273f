"""DCGM packages at the exact version with the nvidia-dcgm service, and nvidia-persistenced enabled."""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.core.operations import Change, OpContext, package_change
from gpuprov.provision.ops.base import driver_service, stack_packages

COMPONENT = "dcgm"
SERVICES = ("nvidia-dcgm", "nvidia-persistenced")


def changes(ctx: OpContext) -> Iterator[Change]:
    change = package_change(ctx, COMPONENT, stack_packages(ctx, "dcgm"))
    if change is not None:
        yield change
    for service in SERVICES if ctx.stack.get("dcgm") is not None else SERVICES[1:]:
        change = driver_service(ctx, COMPONENT, service)
        if change is not None:
            yield change
