"""Kernel side of the driver: headers and dkms for module builds, nouveau kept off (initramfs rebuilt).

Besides the running kernel's headers, the headers metapackage of the kernel series the host follows is
installed: it moves with the kernel metapackage, so the next kernel arrives with its headers and DKMS builds
the driver's module for it before the reboot.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuprov.core.operations import Change, OpContext, q, unified_diff, write_file

COMPONENT = "kernel"
NOUVEAU_BLACKLIST = "/etc/modprobe.d/gpuprov-blacklist-nouveau.conf"
FILES = (NOUVEAU_BLACKLIST,)
BLACKLIST_CONTENT = ("# Managed by gpuprov: nouveau must stay unloaded so the NVIDIA driver can bind the GPUs.\n"
                     "blacklist nouveau\noptions nouveau modeset=0\n")
_KERNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# Debian/Ubuntu kernel releases: VERSION-ABI-FLAVOUR ("6.1.0-18-cloud-amd64", "6.8.0-1015-aws").
_DEB_RELEASE = re.compile(r"\d+\.\d+\.\d+-\d+-(?P<flavour>[a-z][a-z0-9-]*)")
# NVIDIA Driver Installation Guide, RHEL 9 compatible distributions: `dnf install kernel-devel-matched
# kernel-headers` (kernel-devel-matched moves with the kernel package).
RHEL_HEADERS_META = "kernel-devel-matched"


def headers_meta(os_id: str | None, version_id: str | None, kernel: str, installed: dict) -> str | None:
    """The headers metapackage of the kernel series the host runs (None when the release tells none).

    Debian: linux-headers-<flavour> (amd64, cloud-amd64, arm64, rt-amd64...). Ubuntu: the series of the installed
    kernel metapackage (linux-image-generic-hwe-22.04 -> linux-headers-generic-hwe-22.04,
    linux-image-oem-22.04d -> linux-headers-oem-22.04d), else linux-headers-<flavour> (generic, aws, gcp, azure,
    nvidia, lowlatency, generic-64k...; `oem` exists only per series)."""
    match = _DEB_RELEASE.fullmatch(kernel)
    if not match:
        return None
    flavour = match["flavour"]
    if os_id == "ubuntu" and version_id:
        series = re.compile(rf"linux-image-{re.escape(flavour)}-((?:hwe-)?{re.escape(version_id)}[a-z]?)")
        for name in sorted(installed):
            found = series.fullmatch(name)
            if found:
                return f"linux-headers-{flavour}-{found[1]}"
        if flavour == "oem":
            return None
    return f"linux-headers-{flavour}"


def header_packages(ctx: OpContext) -> list[str]:
    """The kernel packages module builds need: the running kernel's headers (from the facts, never
    `$(uname -r)` at run time), the headers metapackage of its series, dkms."""
    kernel = ctx.facts.get("kernel") or ""
    if not _KERNEL.fullmatch(kernel):
        raise ctx.error(COMPONENT, f"cannot tell the running kernel's headers package from kernel {kernel!r}",
                        "check `uname -r` on the host")
    if ctx.family == "debian":
        os_release = ctx.facts.get("os") or {}
        meta = headers_meta(os_release.get("id"), os_release.get("version_id"), kernel,
                            ctx.facts.get("packages") or {})
        return [f"linux-headers-{kernel}", *([meta] if meta else []), "dkms"]
    return [f"kernel-devel-{kernel}", RHEL_HEADERS_META, "kernel-headers", "dkms"]


def missing_header_packages(ctx: OpContext) -> list[str]:
    """The packages of header_packages the host lacks (the running kernel's headers: judged by their files)."""
    running, *rest = header_packages(ctx)
    return ([] if ctx.facts.get("kernel_headers") else [running]) + [name for name in rest
                                                                      if ctx.installed(name) is None]


def changes(ctx: OpContext) -> Iterator[Change]:
    names = missing_header_packages(ctx)
    if names:
        why = ("headers for the running kernel are missing; the driver's kernel modules are built against them"
               if not ctx.facts.get("kernel_headers") else
               "DKMS builds the driver's module with them; the headers metapackage brings the next kernel's")
        yield Change(COMPONENT, f"install {' '.join(names)} ({why})", (ctx.pm.update(), ctx.pm.install_names(names)))

    current = ctx.file(NOUVEAU_BLACKLIST)
    if current != BLACKLIST_CONTENT:
        tool = "update-initramfs" if ctx.family == "debian" else "dracut"
        # a host that boots without an initramfs (no generator installed) has nothing to rebuild
        rebuild = f"if command -v {tool} >/dev/null; then {tool} {'-u' if tool == 'update-initramfs' else '-f'}; fi"
        restore = (f"rm -f {q(NOUVEAU_BLACKLIST)}" if current is None
                   else write_file(NOUVEAU_BLACKLIST, current))
        # A failed initramfs rebuild puts the old file back, so the next run retries the rebuild.
        command = (f"{write_file(NOUVEAU_BLACKLIST, BLACKLIST_CONTENT)} && "
                   f"{{ {rebuild} || {{ {restore}; false; }}; }}")
        yield Change(COMPONENT, f"blacklist nouveau in {NOUVEAU_BLACKLIST} and rebuild the initramfs ({tool})",
                     (command,), reboot=True, diff=unified_diff(NOUVEAU_BLACKLIST, current, BLACKLIST_CONTENT))
