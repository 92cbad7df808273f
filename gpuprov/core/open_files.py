"""Fitting a run's hosts in flight to the controller's open-files limit (RLIMIT_NOFILE): `fit_open_files`
raises the soft limit toward the hard one, or runs fewer hosts at once and says so, never silently.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from gpuprov.core.errors import GpuprovError

# Descriptors one host holds while its work runs. tests/unit/test_executor_open_files.py measures one connection
# running a command over a real SSH connection, direct and through a jump host: 3, its TCP socket (to the jump host
# when there is one: the host's session rides in the jump host's channel) and the pipe pair paramiko makes for the
# command's channel that `select` waits on (the identity file is read and closed during the handshake). A host's
# work may hold two connections at once (harden's fresh() while the first is open): 2 x 3.
FDS_PER_HOST = 6
FDS_MARGIN = 32      # files the run itself opens while hosts are in flight: reports, locks, logs, known_hosts


@dataclass(frozen=True)
class OpenFiles:
    """The open-files limit for a run: `parallel` hosts fit; `notice` says what was raised or lowered."""

    parallel: int
    soft: int
    hard: int
    notice: str | None = None


def _open_descriptors() -> int:
    """Descriptors this process holds now."""
    return len(os.listdir("/dev/fd"))


def fit_open_files(parallel: int, *, per_host: int = FDS_PER_HOST, in_use: int | None = None) -> OpenFiles:
    """Fit `parallel` hosts at once in RLIMIT_NOFILE, as pyinfra does: the soft limit is raised toward the hard
    limit when the hosts need more; if they still do not fit, fewer hosts at once (`parallel` lowered) and a
    notice saying so. GpuprovError when not even one host fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    base = (_open_descriptors() if in_use is None else in_use) + FDS_MARGIN
    need = base + parallel * per_host
    raised = None
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):  # macOS refuses more than OPEN_MAX whatever the hard limit says
                pass
            else:
                raised, soft = soft, target
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    fits = parallel if soft == resource.RLIM_INFINITY else min(parallel, (soft - base) // per_host)
    if fits < 1:
        raise GpuprovError(f"the open-files limit ({soft}, hard {shown}) leaves no room for one host: "
                           f"{base} descriptors are in use and a host needs {per_host}", step="open files",
                           hint="raise the limit (ulimit -n 4096, or LimitNOFILE= for a service), then rerun")
    notes = []
    if raised is not None:
        notes.append(f"open files: soft limit raised from {raised} to {soft} (hard {shown}) for {parallel} hosts "
                     "at once")
    if fits < parallel:
        notes.append(f"open files: the limit ({soft}, hard {shown}) fits {fits} hosts at once at {per_host} "
                     f"descriptors each, not {parallel}: running {fits} at once; raise the hard limit (ulimit -Hn, "
                     "limits.conf) to run more")
    return OpenFiles(fits, soft, hard, "; ".join(notes) or None)
