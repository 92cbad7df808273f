"""Shared pieces of the task modules: host selection options and error-to-exit-code handling."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from invoke.exceptions import Exit

from gpuprov.config import path_setting
from gpuprov.errors import GpuprovError

HOST_HELP = {
    "host": "host name from the inventory; repeat or give a comma list",
    "group": "group name from the inventory; repeat or give a comma list",
    "all": "every host in the inventory",
    "inventory": "inventory file (default: gpuprov.inventory in invoke.yaml)",
}


def exits_cleanly(fn: Callable) -> Callable:
    """Turn a GpuprovError into its message on stderr and its exit code (1 failure, 2 bad input)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GpuprovError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise Exit(code=exc.exit_code) from None

    return wrapper


def split_names(values: list[str] | None) -> list[str]:
    """`--host a,b --host c` -> ["a", "b", "c"]."""
    return [name.strip() for value in values or [] for name in value.split(",") if name.strip()]


def select_hosts(c, host: list[str] | None, group: list[str] | None, all_: bool, inventory: str | None):
    """Load the inventory and pick hosts the Fabric way. Returns (inventory, hosts)."""
    from gpuprov.inventory import load_inventory

    inv = load_inventory(inventory or path_setting(c, "inventory"))
    return inv, inv.select(hosts=split_names(host), groups=split_names(group), all_=all_)
