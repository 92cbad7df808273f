"""promtool, Prometheus's own checker of rule files and queries: found on PATH, or installed from Debian's
`prometheus` package (as root, without recommends, with a policy-rc.d that keeps the server from starting)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpuprov.core.errors import GpuprovError

STEP = "promtool"
PACKAGE = "prometheus"
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
# invoke-rc.d(8): exit status 101 of policy-rc.d means "action forbidden", so the package's service stays stopped
POLICY_DENY = "#!/bin/sh\nexit 101\n"
TIMEOUT = 600
HINT = "install Debian's prometheus package (apt-get install --no-install-recommends prometheus) or put promtool " \
       "on PATH"


def promtool_path(install: bool = False) -> str:
    """The promtool binary: on PATH, or (with install, as root on a Debian-family host) from Debian's package."""
    found = shutil.which("promtool")
    if found:
        return found
    if not install:
        raise GpuprovError("promtool is not on PATH", step=STEP, hint=HINT)
    if os.geteuid() != 0:
        raise GpuprovError("promtool is not on PATH and installing it needs root", step=STEP, hint=HINT)
    if not shutil.which("apt-get"):
        raise GpuprovError("promtool is not on PATH and this machine has no apt-get", step=STEP, hint=HINT)
    _apt_install()
    found = shutil.which("promtool")
    if not found:
        raise GpuprovError(f"the {PACKAGE} package is installed but promtool is not on PATH", step=STEP,
                           hint="check `dpkg -L prometheus | grep promtool` and PATH")
    return found


def _apt_install() -> None:
    """apt-get install the package (refreshing the package lists first when apt does not know it), with a
    policy-rc.d that forbids starting services, removed afterwards (an existing one is left as it is)."""
    if _run(["apt-cache", "show", PACKAGE], check=False).returncode != 0:
        _run(["apt-get", "update"])
    placed = not POLICY_RC_D.exists()
    if placed:
        POLICY_RC_D.write_text(POLICY_DENY)
        POLICY_RC_D.chmod(0o755)
    try:
        _run(["apt-get", "install", "-y", "--no-install-recommends", PACKAGE])
    finally:
        if placed:
            POLICY_RC_D.unlink(missing_ok=True)


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise GpuprovError(f"{command[0]} did not finish within {TIMEOUT} s", step=STEP,
                           command=" ".join(command)) from None
    if check and done.returncode != 0:
        raise GpuprovError(f"{command[0]} failed with exit code {done.returncode}", step=STEP,
                           command=" ".join(command), output=done.stdout + done.stderr, hint=HINT)
    return done
