"""The inotify limits systemd hosts need: each container's systemd holds several inotify instances,
and at the default fs.inotify.max_user_instances=128 hosts past about 22 exit silently."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from gpuprov.core.errors import GpuprovError

PROC = Path("/proc/sys/fs/inotify")
INSTANCES_PER_HOST = 64
WATCHES_PER_HOST = 8192
HEADROOM_INSTANCES = 128
HEADROOM_WATCHES = 65536


def inotify_targets(hosts: int, current_instances: int, current_watches: int) -> tuple[int, int]:
    """Limits enough for `hosts` systemd containers; never lower than the current values."""
    return (max(current_instances, INSTANCES_PER_HOST * hosts + HEADROOM_INSTANCES),
            max(current_watches, WATCHES_PER_HOST * hosts + HEADROOM_WATCHES))


def sysctl_command(instances: int, watches: int) -> str:
    return (f"sysctl -w fs.inotify.max_user_instances={instances} "
            f"fs.inotify.max_user_watches={watches}")


def ensure_inotify(hosts: int, progress: Callable[[str], None] = print, proc: Path = PROC) -> None:
    """Raise the limits for `hosts` hosts (as root), or refuse with the exact command to run."""
    current_i = int((proc / "max_user_instances").read_text())
    current_w = int((proc / "max_user_watches").read_text())
    want_i, want_w = inotify_targets(hosts, current_i, current_w)
    if (want_i, want_w) == (current_i, current_w):
        return
    if os.geteuid() != 0:
        raise GpuprovError(f"inotify limits too low for {hosts} lab hosts (max_user_instances={current_i}, "
                           f"max_user_watches={current_w})", step="lab inotify",
                           hint=f"run: sudo {sysctl_command(want_i, want_w)}")
    try:
        (proc / "max_user_instances").write_text(f"{want_i}\n")
        (proc / "max_user_watches").write_text(f"{want_w}\n")
    except OSError as exc:
        raise GpuprovError(f"cannot raise the inotify limits: {exc}", step="lab inotify",
                           command=sysctl_command(want_i, want_w),
                           hint="run that command on the machine running the engine") from exc
    progress(f"inotify: max_user_instances {current_i} -> {want_i}, max_user_watches {current_w} -> {want_w}")
