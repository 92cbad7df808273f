"""The lab for lab tests: three hosts (hgx-h100, l40s, a100-pcie), brought up once per session.

Modules that need other hosts (`gpuprov.lab.up` with other profiles) or provision the session's hosts leave the
lab changed; before each module the lab is checked and, when it is not the session's bare hosts, recreated. A
module that brings up a fleet of its own declares `OWN_FLEET = True` and is not given the bare hosts first: they
would be replaced at once (a recreation costs about 20 s on CI's two cores).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

LAB_PROFILES = ["hgx-h100", "l40s", "a100-pcie"]
REPO_ROOT = Path(__file__).resolve().parents[2]
# A bare lab host: no package source beyond what the image has, no NVIDIA or Docker package installed.
BARE = ("! ls -A /etc/apt/sources.list.d | grep -q . && ! ls -A /etc/apt/preferences.d | grep -q . && "
        "! dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' 'nvidia*' 'libnvidia*' 'cuda*' 'libnccl*' "
        "'datacenter-gpu-manager*' 'docker.io' 2>/dev/null | grep -q '^[hi]i'")


@pytest.fixture(scope="session")
def lab():
    """A running LabState of bare hosts (recreated from the image); downed at the end unless
    GPUPROV_KEEP_LAB=1."""
    import gpuprov.lab
    from gpuprov.lab.state import LabPaths

    paths = LabPaths(REPO_ROOT)
    state = gpuprov.lab.up(len(LAB_PROFILES), LAB_PROFILES, paths=paths, progress=print, fresh=True)
    yield state
    if os.environ.get("GPUPROV_KEEP_LAB") != "1":
        gpuprov.lab.down(paths=paths)


def lab_is_bare(state) -> bool:
    """The session's hosts, running, each still bare."""
    import gpuprov.lab

    now = {h.name: h for h in gpuprov.lab.status()}
    if sorted(now) != sorted(h.name for h in state.hosts):
        return False
    for host in state.hosts:
        current = now[host.name]
        if current.state != "running" or current.profile != host.profile or current.container_id != host.container_id:
            return False
        probe = subprocess.run(["docker", "exec", host.container_id, "sh", "-c", BARE], capture_output=True,
                               timeout=60)
        if probe.returncode != 0:
            return False
    return True


@pytest.fixture(scope="module", autouse=True)
def bare_lab(request):
    """Before each module: the session's bare hosts (recreated when an earlier module changed them), except for a
    module with a fleet of its own (OWN_FLEET), which gets None."""
    import gpuprov.lab

    if getattr(request.module, "OWN_FLEET", False):
        return None
    lab = request.getfixturevalue("lab")
    if not lab_is_bare(lab):
        again = gpuprov.lab.up(len(LAB_PROFILES), LAB_PROFILES, paths=lab.paths, progress=print, fresh=True)
        lab.hosts[:] = again.hosts
    return lab


@pytest.fixture(scope="session")
def lab_inventory(lab) -> Path:
    """Path of the inventory written for the session's lab."""
    return lab.inventory
