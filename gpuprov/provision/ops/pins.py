"""Pins and holds for every NVIDIA package of the stack, every package of its driver and every package of its
CUDA toolkit's release; unattended upgrades kept away from them.

apt: one preferences file (the driver's packages pinned at its version, the toolkit's at their installed
versions) and `apt-mark hold`; dnf: versionlock entries with the epoch. The packages a driver or toolkit
metapackage pulls in are known only on the host, so the hold selects them there (by name: families.DRIVER_FAMILIES
and families.family_pattern), in the same run; whether they are held is judged from the facts (every installed
package of those names held: no change).
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.core.errors import InputError
from gpuprov.core.operations import Change, OpContext, at_version, file_change, locked
from gpuprov.core.packages import VERSIONLOCK_LIST, Package
from gpuprov.inventory.checks import RELEASE_LABEL
from gpuprov.provision.ops.base import driver_moves, stack_packages
from gpuprov.stack import families
from gpuprov.stack.families import DRIVER_FAMILIES, UNATTENDED, driver_packages, unattended
from gpuprov.stack.resolve import PACKAGE_SECTIONS

COMPONENT = "pins"
SECTIONS = PACKAGE_SECTIONS
APT_PREFERENCES = "/etc/apt/preferences.d/gpuprov-nvidia"
FILES = (APT_PREFERENCES, UNATTENDED, VERSIONLOCK_LIST)
# Packages of the stack's other sections whose names change between stacks (cuda-toolkit-12-8 -> 12-9, the DCGM
# CUDA plugin): a hold on such a name that the stack no longer lists is released. Driver packages of another
# branch are the driver op's (it removes them); cuda-compat-* the cuda op's.
RELEASED = ("cuda-", "libnccl", "datacenter-gpu-manager")
VERSIONLOCK_PLUGIN = "python3-dnf-plugin-versionlock"
# apt_preferences(5): a version with priority >= 1000 is installed even as a downgrade, 500 <= P < 990 "unless
# there is a version available belonging to the target release or the installed version is more recent", and
# every archive without a pin gets 500; the first specific record that matches a version sets its priority. The
# driver's own packages get 1001 at the driver's version (and the stack's packages at their exact versions): any
# other version matches no specific record and falls to the repository's 600, so another point release of the
# branch never wins over the installed one, not even in `apt-get dist-upgrade`. NVIDIA's repository as a whole
# gets 600, the value of NVIDIA's own cuda-<distro>.pin: above the distribution's archives (500), so a package
# the stack does not name (a dependency of a metapackage, e.g. libnvidia-cfg1-570) comes from NVIDIA's build and
# not from the distribution's own NVIDIA packaging even when that carries a higher version; below 990 and 1000,
# so an explicit target release still wins and nothing is ever downgraded for it.
REPO_PRIORITY = 600


def pinned_packages(ctx: OpContext) -> list[Package]:
    """Every package of the stack, each once, sorted by name."""
    packages: dict[str, Package] = {}
    for section in SECTIONS:
        for pkg in stack_packages(ctx, section):
            other = packages.setdefault(pkg.name, pkg)
            if other.version != pkg.version:
                raise InputError(f"the stack wants {pkg.name} at both {other.version} and {pkg.version}",
                                 host=ctx.host, step=COMPONENT, hint="re-resolve the stack")
    return [packages[name] for name in sorted(packages)]


def preferences(packages: list[Package], driver_version: str, label: str | None,
                toolkit: list[Package] | None = None) -> str:
    """The apt preferences: the driver's packages at its version, the stack's exact versions, the toolkit's
    release at the versions installed (`toolkit`, see toolkit_packages), the repository."""
    globs = " ".join(f"{prefix}*" for prefix in DRIVER_FAMILIES)
    stanzas = [f"Package: {globs}\nPin: version {driver_version}-*\nPin-Priority: 1001\n"]
    stanzas += [f"Package: {p.name}\nPin: version {p.version}\nPin-Priority: 1001\n"
                for p in [*packages, *(toolkit or [])]]
    if label is not None:
        stanzas.append(f"Package: *\nPin: release l={label}\nPin-Priority: {REPO_PRIORITY}\n")
    return ("# Managed by gpuprov: the NVIDIA stack stays at the versions gpuprov resolved; its driver's packages\n"
            "# at the driver's version, and NVIDIA's repository before the distribution's NVIDIA packaging.\n\n"
            + "\n".join(stanzas))


def toolkit_packages(ctx: OpContext) -> list[Package]:
    """The installed packages of the stack's CUDA toolkit release that the stack does not name itself (its
    parts: cuda-compiler-13-2, libcublas-13-2, ...), at their installed versions, sorted by name."""
    installed = ctx.facts.get("packages") or {}
    stack = {p.name for p in pinned_packages(ctx)}
    return [Package(name, installed[name]) for name in families.family_packages(installed, ctx.stack)
            if name not in stack]


def repo_label(ctx: OpContext) -> str | None:
    label = ctx.repo.label
    if label is not None and not RELEASE_LABEL.fullmatch(label):
        raise InputError(f"repository label {label!r} cannot be pinned (letters, digits, spaces and ._+:~/- only)",
                         host=ctx.host, step=COMPONENT, hint="fix mirror.label in the inventory (the `Label:` "
                         "line of the mirror's Release file)")
    return label


def preferences_change(ctx: OpContext) -> Change | None:
    """The apt preferences file brought to the stack (None when in state or not an apt host)."""
    if ctx.family != "debian":
        return None
    content = preferences(pinned_packages(ctx), ctx.stack["driver"]["version"], repo_label(ctx),
                          toolkit_packages(ctx))
    return file_change(ctx, COMPONENT, APT_PREFERENCES, content,
                       "apt pins: driver, exact versions, CUDA toolkit release, repository")


def unheld(ctx: OpContext) -> list[str]:
    """Packages the hold must (re)cover: stack packages without a hold at the wanted version (counting the
    holds the install ops lift this run) and installed packages of the driver families and of the toolkit's
    release (families.family_pattern) without one."""
    held, pm = locked(ctx), ctx.pm
    installed = ctx.facts.get("packages") or {}
    debian = ctx.family == "debian"

    def lacks(name: str, version: str) -> bool:
        return name not in held or not (debian or any(pm.same_version(v, version) for v in held[name]))

    out = {p.name for p in pinned_packages(ctx) if not at_version(ctx, p) or lacks(p.name, p.version)}
    out |= {name for name in driver_packages(installed) if lacks(name, installed[name])}
    out |= {name for name in families.family_packages(installed, ctx.stack) if lacks(name, installed[name])}
    return sorted(out)


def released(ctx: OpContext) -> list[str]:
    """Held packages of the stack's sections that the stack no longer lists, other than the packages of its
    toolkit's release (see RELEASED)."""
    wanted = {p.name for p in pinned_packages(ctx)}
    pattern = families.family_pattern(ctx.stack)
    return sorted(name for name in locked(ctx) if name.startswith(RELEASED) and not name.startswith(
        ("cuda-drivers", "cuda-compat-")) and name not in wanted and not families.in_family(name, pattern))


def hold_change(ctx: OpContext) -> Change | None:
    """Hold the stack's packages and every installed package of the driver families and of the toolkit's
    release, selected on the host."""
    missing = unheld(ctx)
    if not missing:
        return None
    pm = ctx.pm
    commands = []
    if ctx.family == "rhel" and ctx.file(VERSIONLOCK_LIST) is None:
        commands.append(pm.install_names([VERSIONLOCK_PLUGIN]))
    commands.append(pm.hold_installed([p.name for p in pinned_packages(ctx)], DRIVER_FAMILIES,
                                      families.family_pattern(ctx.stack)))
    return Change(COMPONENT, "hold the stack's packages and every installed package of the NVIDIA driver and "
                  f"of the CUDA toolkit's release (not held now: {', '.join(missing)})", tuple(commands))


def changes(ctx: OpContext) -> Iterator[Change]:
    if ctx.family == "debian":
        # a driver change writes the preferences itself, before apt resolves the new driver's dependencies
        planned = [None if driver_moves(ctx) else preferences_change(ctx),
                   file_change(ctx, COMPONENT, UNATTENDED, unattended(), "unattended-upgrades blacklist")]
        yield from (change for change in planned if change is not None)
    stale = released(ctx)
    if stale:
        yield Change(COMPONENT, f"release the holds of {', '.join(stale)} (no longer in the stack)",
                     (ctx.pm.unhold(stale),))
    hold = hold_change(ctx)
    if hold is not None:
        yield hold
