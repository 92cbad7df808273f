"""The CUDA toolkit at the exact version; the forward-compatibility package only when the stack asks."""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.ops.base import Change, OpContext, package_change, stack_packages

COMPONENT = "cuda"


def compat_name(ctx: OpContext) -> str:
    major, minor = str(ctx.stack["cuda"]["version"]).split(".")[:2]
    return f"cuda-compat-{major}-{minor}"


def changes(ctx: OpContext) -> Iterator[Change]:
    wanted = stack_packages(ctx, "cuda")
    names = {p.name for p in wanted}
    compat = compat_name(ctx)
    if ctx.stack.get("forward_compat") and compat not in names:
        raise ctx.error(COMPONENT, f"the stack asks for forward compatibility but lists no {compat} package",
                        "re-resolve the stack; the resolver must list the compat package with its version")
    # Compat libraries older than the running driver break CUDA (error 803): drop any not wanted.
    stale = tuple(sorted(name for name in ctx.facts.get("packages") or {}
                         if name.startswith("cuda-compat-") and name not in names))
    change = package_change(ctx, COMPONENT, wanted, remove=stale)
    if change is not None:
        yield change
