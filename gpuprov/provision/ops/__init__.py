"""Operations: facts + resolved stack + repository in, `Change`s (quoted shell commands) out.

One module per component, applied in `COMPONENTS` order. A host already in the desired state yields no
change, so a second run changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from gpuprov.core.errors import InputError
from gpuprov.core.operations import Change, OpContext, RepoSpec
from gpuprov.provision.ops import (
    container_toolkit,
    cuda,
    dcgm,
    driver,
    engine,
    fabricmanager,
    kernel,
    nccl,
    pins,
    sources,
)

__all__ = ["COMPONENTS", "MANAGED_FILES", "Change", "OpContext", "RepoSpec", "plan_changes"]

_MODULES = (sources, kernel, driver, cuda, nccl, engine, container_toolkit, fabricmanager, dcgm, pins)
COMPONENTS: tuple[str, ...] = tuple(module.COMPONENT for module in _MODULES)
MANAGED_FILES: tuple[str, ...] = (*sources.FILES, *kernel.FILES, *container_toolkit.FILES, *pins.FILES)


def plan_changes(ctx: OpContext, only: set[str] | None = None) -> list[Change]:
    """Every change the host needs, components in order; [] when it is in the desired state.

    The package index is refreshed once per plan: before the first change that needs it.
    """
    unknown = sorted(set(only or ()) - set(COMPONENTS))
    if unknown:
        raise InputError(f"unknown component(s): {', '.join(unknown)}", host=ctx.host, step="plan",
                         hint=f"choose from: {', '.join(COMPONENTS)}")
    refresh = ctx.pm.update()
    refreshed = False
    planned = []
    for module in _MODULES:
        if only is not None and module.COMPONENT not in only:
            continue
        for change in module.changes(ctx):
            if refreshed and refresh in change.commands:
                commands = tuple(command for command in change.commands if command != refresh)
                if not commands:
                    continue
                change = replace(change, commands=commands)
            refreshed = refreshed or refresh in change.commands
            planned.append(change)
    return planned
