"""The lab for lab tests: three hosts (hgx-h100, l40s, a100-pcie), brought up once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LAB_PROFILES = ["hgx-h100", "l40s", "a100-pcie"]
REPO_ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture(scope="session")
def lab_inventory(lab) -> Path:
    """Path of the inventory written for the session's lab."""
    return lab.inventory
