"""The NVIDIA driver at the resolved branch, version and kernel-module flavor; other branches replaced."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuprov.core.operations import Change, OpContext, locked, package_change
from gpuprov.provision.ops import pins
from gpuprov.provision.ops.base import stack_packages
from gpuprov.stack.families import DRIVER_FAMILIES

COMPONENT = "driver"
_DRIVER_PREFIXES = ("nvidia-", "libnvidia-", "cuda-drivers", "xserver-xorg-video-nvidia", "kmod-nvidia",
                    "linux-modules-nvidia-", "linux-objects-nvidia-", "linux-signatures-nvidia-")
# Packages with NVIDIA names that belong to other components and never to a driver branch.
_NOT_DRIVER = re.compile(r"(lib)?nvidia-container.*|nvidia-docker2?")
_KERNEL_MODULE_WORDS = {"dkms", "source", "modules", "objects", "signatures"}
_PROPRIETARY_META = re.compile(r"(cuda-drivers|nvidia-driver)-\d{3}(-server)?")
# NVIDIA's branch-locking package (R590 on): apt must know its pins before it resolves the driver (DIG-590).
PINNING = "nvidia-driver-pinning-"


def branch_of(name: str) -> str | None:
    """The driver branch a package name carries (`libnvidia-compute-570` -> "570"), if any."""
    for word in name.split("-"):
        if len(word) == 3 and word.isdigit() and 300 <= int(word) <= 999:
            return word
    return None


def flavor_of(name: str) -> str | None:
    """"open" / "proprietary" for kernel-module and flavor meta packages, None for flavor-neutral ones."""
    words = set(name.split("-"))
    if "open" in words:
        return "open"
    if words & _KERNEL_MODULE_WORDS or _PROPRIETARY_META.fullmatch(name):
        return "proprietary"
    return None


def version_branch(version: str) -> str | None:
    """The driver branch of a driver-versioned package's version (`595.58.03-1` -> "595"), if any."""
    match = re.match(r"(?:\d+:)?(\d{3})\.\d+", version or "")
    return match.group(1) if match else None


def stale_packages(ctx: OpContext) -> tuple[str, ...]:
    """Installed driver packages of another branch (by name, or by version for the unversioned names
    NVIDIA uses from R590 on, such as `nvidia-open`) or of the other kernel-module flavor."""
    driver = ctx.stack["driver"]
    wanted = {p.name for p in stack_packages(ctx, "driver")}
    stale = []
    for name, version in sorted((ctx.facts.get("packages") or {}).items()):
        if name in wanted or not name.startswith(_DRIVER_PREFIXES) or _NOT_DRIVER.fullmatch(name):
            continue
        branch, flavor = branch_of(name) or version_branch(version), flavor_of(name)
        if (branch and branch != str(driver["branch"])) or (flavor and flavor != driver["kernel_modules"]):
            stale.append(name)
    return tuple(stale)


def held_driver_packages(ctx: OpContext) -> tuple[str, ...]:
    """Held (dnf: versionlocked) packages of the installed driver, which a new driver moves; the stack's
    other packages with driver-like names (fabric manager, NSCQ, container toolkit) keep their own holds."""
    others = {p.name for section in pins.SECTIONS if section != "driver" for p in stack_packages(ctx, section)}
    return tuple(sorted(name for name in locked(ctx) if name.startswith(DRIVER_FAMILIES) and name not in others))


def driver_change(ctx: OpContext) -> Change | None:
    """The driver package change this plan makes (None when the driver packages are in state): the holds of
    the installed driver lifted, the apt pins for the new driver written, NVIDIA's version-pinning package
    installed before the driver."""
    wanted = stack_packages(ctx, "driver")
    change = package_change(ctx, COMPONENT, wanted, remove=stale_packages(ctx), reboot=True,
                            unhold=held_driver_packages(ctx),
                            first=tuple(p.name for p in wanted if p.name.startswith(PINNING)))
    if change is None:
        return None
    driver = ctx.stack["driver"]
    summary = f"driver {driver['version']} ({driver['kernel_modules']} kernel modules): {change.summary}"
    prefs = pins.preferences_change(ctx)
    if prefs is None:
        return Change(COMPONENT, summary, change.commands, reboot=True)
    return Change(COMPONENT, f"{summary}; apt pins for it first ({pins.APT_PREFERENCES})",
                  (*prefs.commands, *change.commands), reboot=True, diff=prefs.diff)


def changes(ctx: OpContext) -> Iterator[Change]:
    change = driver_change(ctx)
    if change is not None:
        yield change
