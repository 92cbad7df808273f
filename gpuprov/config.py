"""Configuration defaults; `invoke.yaml` and INVOKE_GPUPROV_* variables override them."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULTS: dict = {
    "inventory": "inventories/lab.yaml",
    "parallel": 32,
    "connect_timeout": 10,
    "connect_retries": 2,
    "command_timeout": 1800,
    "known_hosts": "~/.ssh/known_hosts",
    "reports": "reports",
    "locks": "locks",
}


def setting(c, key: str):
    """One gpuprov setting from an Invoke context's config, falling back to the defaults."""
    section = c.config.get("gpuprov", {}) if c is not None else {}
    return section.get(key, DEFAULTS[key])


def path_setting(c, key: str) -> Path:
    """A path setting with `~` and environment variables expanded."""
    return Path(os.path.expandvars(os.path.expanduser(str(setting(c, key)))))
