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


def run_settings(c, inv, *, trust_new_hosts: bool = False, parallel: int | None = None,
                 max_fail: str | None = None):
    """Executor settings from invoke.yaml, the inventory (its known_hosts wins) and the task's flags."""
    from gpuprov.config import setting
    from gpuprov.executor import Settings

    return Settings(
        known_hosts=inv.known_hosts or path_setting(c, "known_hosts"),
        trust_new=trust_new_hosts,
        parallel=int(parallel or setting(c, "parallel")),
        connect_timeout=int(setting(c, "connect_timeout")),
        connect_retries=int(setting(c, "connect_retries")),
        command_timeout=int(setting(c, "command_timeout")),
        max_fail=max_fail,
    )


def gather_outcomes(c, inv, hosts, *, trust_new_hosts: bool = False, parallel: int | None = None,
                    quiet: bool = False) -> list:
    """Facts of every host, in parallel, with per-host progress: one executor Outcome per host."""
    from gpuprov.executor import run_on_hosts
    from gpuprov.facts.gather import gather
    from gpuprov.ops import MANAGED_FILES
    from gpuprov.report import progress_printer

    return run_on_hosts(hosts, lambda conn: gather(conn, MANAGED_FILES),
                        run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel),
                        jump_of=inv.jump_host, on_event=progress_printer(quiet=quiet))


def gather_all(c, inv, hosts, *, trust_new_hosts: bool = False, quiet: bool = False) -> dict:
    """Facts of every host: {name: facts} or {name: {"error": message}}."""
    outcomes = gather_outcomes(c, inv, hosts, trust_new_hosts=trust_new_hosts, quiet=quiet)
    return {o.host.name: o.value if o.ok else {"error": str(o.error)} for o in outcomes}
