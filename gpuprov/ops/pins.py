"""Pins and holds for every NVIDIA package of the stack; unattended upgrades kept away from them."""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.errors import InputError
from gpuprov.ops.base import VERSIONLOCK_LIST, Change, OpContext, at_version, file_change, locked, stack_packages
from gpuprov.ops.pkg import Package

COMPONENT = "pins"
SECTIONS = ("driver", "cuda", "nccl", "container_toolkit", "fabricmanager", "dcgm")
APT_PREFERENCES = "/etc/apt/preferences.d/gpuprov-nvidia"
UNATTENDED = "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"
FILES = (APT_PREFERENCES, UNATTENDED, VERSIONLOCK_LIST)
# Unattended-Upgrade::Package-Blacklist entries are regular expressions matched at the start of names.
BLACKLIST = ("nvidia-", "libnvidia-", "cuda-", "libcuda", "libnccl", "datacenter-gpu-manager",
             "xserver-xorg-video-nvidia", "linux-modules-nvidia-", "linux-objects-nvidia-",
             "linux-signatures-nvidia-")
VERSIONLOCK_PLUGIN = "python3-dnf-plugin-versionlock"


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


def preferences(packages: list[Package]) -> str:
    stanzas = [f"Package: {p.name}\nPin: version {p.version}\nPin-Priority: 1001\n" for p in packages]
    return ("# Managed by gpuprov: the NVIDIA stack stays at the versions gpuprov resolved.\n\n"
            + "\n".join(stanzas))


def unattended() -> str:
    entries = "".join(f'    "{entry}";\n' for entry in BLACKLIST)
    return ("// Managed by gpuprov: unattended-upgrades must never move the NVIDIA stack (a driver/library\n"
            "// mismatch breaks NVML until a reboot); gpuprov upgrades it deliberately.\n"
            f"Unattended-Upgrade::Package-Blacklist {{\n{entries}}};\n")


def to_lock(ctx: OpContext, packages: list[Package]) -> list[Package]:
    """Packages without a hold at the wanted version, counting the holds the install ops lift this run."""
    held = locked(ctx)
    pm = ctx.pm
    result = []
    for pkg in packages:
        versions = held.get(pkg.name)
        wrong_lock = ctx.family == "rhel" and not any(pm.same_version(v, pkg.version) for v in versions or ())
        if versions is None or not at_version(ctx, pkg) or wrong_lock:
            result.append(pkg)
    return result


def changes(ctx: OpContext) -> Iterator[Change]:
    packages = pinned_packages(ctx)
    pm = ctx.pm
    if ctx.family == "debian":
        for path, content, what in ((APT_PREFERENCES, preferences(packages), "apt pins at exact versions"),
                                    (UNATTENDED, unattended(), "unattended-upgrades blacklist")):
            change = file_change(ctx, COMPONENT, path, content, what)
            if change is not None:
                yield change
    lock = to_lock(ctx, packages)
    if not lock:
        return
    commands = []
    if ctx.family == "rhel":
        if ctx.file(VERSIONLOCK_LIST) is None:
            commands.append(pm.install_names([VERSIONLOCK_PLUGIN]))
        held = locked(ctx)
        stale = [p.name for p in lock if p.name in held and at_version(ctx, p)]
        if stale:
            commands.append(pm.unhold(stale))
    commands.append(pm.hold(lock))
    yield Change(COMPONENT, "hold " + ", ".join(pm.spec(p) for p in lock), tuple(commands))
