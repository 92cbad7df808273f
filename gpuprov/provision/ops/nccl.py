"""NCCL runtime and development packages at the exact version the stack resolved."""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.core.operations import Change, OpContext, package_change
from gpuprov.provision.ops.base import stack_packages

COMPONENT = "nccl"


def changes(ctx: OpContext) -> Iterator[Change]:
    change = package_change(ctx, COMPONENT, stack_packages(ctx, "nccl"))
    if change is not None:
        yield change
