"""Kernel side of the driver: headers and dkms for module builds, nouveau kept off (initramfs rebuilt)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuprov.ops.base import Change, OpContext, q, unified_diff, write_file

COMPONENT = "kernel"
NOUVEAU_BLACKLIST = "/etc/modprobe.d/gpuprov-blacklist-nouveau.conf"
FILES = (NOUVEAU_BLACKLIST,)
BLACKLIST_CONTENT = ("# Managed by gpuprov: nouveau must stay unloaded so the NVIDIA driver can bind the GPUs.\n"
                     "blacklist nouveau\noptions nouveau modeset=0\n")
_KERNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def header_packages(ctx: OpContext) -> list[str]:
    """Headers for the running kernel (from the facts, never `$(uname -r)` at run time) plus dkms."""
    kernel = ctx.facts.get("kernel") or ""
    if not _KERNEL.fullmatch(kernel):
        raise ctx.error(COMPONENT, f"cannot tell the running kernel's headers package from kernel {kernel!r}",
                        "check `uname -r` on the host")
    if ctx.family == "debian":
        return [f"linux-headers-{kernel}", "dkms"]
    return [f"kernel-devel-{kernel}", "kernel-headers", "dkms"]


def changes(ctx: OpContext) -> Iterator[Change]:
    if not ctx.facts.get("kernel_headers"):
        names = header_packages(ctx)
        yield Change(COMPONENT, f"install {' '.join(names)} (headers for the running kernel are missing; "
                     "the driver's kernel modules are built against them)",
                     (ctx.pm.update(), ctx.pm.install_names(names)))

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
