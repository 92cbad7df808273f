"""The CUDA toolkit at the exact version, with every package of its release; the forward-compatibility package
only when the stack asks.

NVIDIA's toolkit metapackage depends on its parts by a minimum version (cuda-toolkit-13-2 13.2.1-1 on
`cuda-compiler-13-2 (>= 13.2.1)`, which depends on `cuda-nvcc-13-2` by that part's own version, ...), so a plain
install takes the newest parts the repository has: a later patch release of the same toolkit. On apt the parts
are resolved on the host from the repository's Depends of the locked release (Apt.install_release). The
toolkit's family (its parts, named `*-X-Y`, and the shared config and Nsight packages it pulls) is held and
pinned by the pins op.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.core.operations import Change, OpContext, at_version, package_change
from gpuprov.provision.ops.base import stack_packages
from gpuprov.stack.families import family_pattern

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
    pattern = family_pattern(ctx.stack)
    if ctx.family != "debian" or pattern is None:
        change = package_change(ctx, COMPONENT, wanted, remove=stale)
        if change is not None:
            yield change
        return
    missing = [p for p in wanted if not at_version(ctx, p)]
    remove = tuple(name for name in stale if ctx.installed(name) is not None)
    if not missing and not remove:
        return
    pm = ctx.pm
    parts = [f"install {pm.spec(p)} (installed: {ctx.installed(p.name) or 'none'}) with every package of its "
             "release at that release's version" for p in missing]
    parts += [f"remove {name} {ctx.installed(name)}" for name in remove]
    yield Change(COMPONENT, "; ".join(parts), (pm.update(), pm.install_release(wanted, pattern, remove)))
