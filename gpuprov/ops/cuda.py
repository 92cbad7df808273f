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

import re
from collections.abc import Iterator

from gpuprov.ops.base import Change, OpContext, at_version, package_change, stack_packages

COMPONENT = "cuda"
_TOOLKIT = re.compile(r"cuda-toolkit-(\d+)-(\d+)")


def compat_name(ctx: OpContext) -> str:
    major, minor = str(ctx.stack["cuda"]["version"]).split(".")[:2]
    return f"cuda-compat-{major}-{minor}"


def family_pattern(stack: dict) -> str | None:
    """The names of the stack's CUDA toolkit release as an extended regular expression: every package named for
    its major-minor (`cuda-compiler-13-2`, `libcublas-dev-13-2`, `gds-tools-13-2`,
    `cuda-toolkit-13-2-config-common`), the major's and the shared config packages and the versioned Nsight
    tools NVIDIA's toolkit pulls (`nsight-compute-2025.1.0`). None when the stack has no toolkit."""
    suffixes = sorted({match.groups() for p in (stack.get("cuda") or {}).get("packages") or []
                       if (match := _TOOLKIT.fullmatch(str(p.get("name"))))})
    if not suffixes:
        return None
    dashes = "|".join(f"{major}-{minor}" for major, minor in suffixes)
    majors = "|".join(sorted({f"{major}-" for major, _ in suffixes}))
    return (f"-({dashes})(-|$)|^cuda-toolkit-({majors})?config-common$|^nsight-(compute|systems)-[0-9]")


def in_family(name: str, pattern: str | None) -> bool:
    """Whether `name` is a package of the toolkit family `pattern` (see family_pattern)."""
    return pattern is not None and re.search(pattern, name) is not None


def family_packages(packages: dict[str, str], stack: dict) -> list[str]:
    """The installed packages (`packages`: name -> version, as facts list them) of the stack's toolkit family."""
    pattern = family_pattern(stack)
    return sorted(name for name in packages if in_family(name, pattern))


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
