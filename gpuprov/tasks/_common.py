"""Shared pieces of the task modules: the host options every host task takes, selection, exit codes.

A task that touches hosts is declared with `@host_task(help={...})` and takes, besides its own options,
`host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False`; it calls
`select_hosts(c, host, group, all, inventory)` and `run_settings(c, inv, ...)` (or `gather_outcomes`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from invoke import task
from invoke.exceptions import Exit

from gpuprov.config import path_setting
from gpuprov.errors import GpuprovError, InputError

HOST_HELP = {
    "host": "host name from the inventory; repeat or give a comma list",
    "group": "group name from the inventory; repeat or give a comma list",
    "all": "every host in the inventory (not together with --host or --group)",
    "inventory": "inventory file (default: gpuprov.inventory in invoke.yaml)",
    "parallel": "hosts worked on at once (default: gpuprov.parallel)",
    "trust_new_hosts": "record unknown host keys (trust on first use)",
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


def host_task(help: dict[str, str] | None = None) -> Callable[[Callable], object]:
    """@task for a task that touches hosts: the shared options' help (HOST_HELP) plus the task's own,
    repeatable --host/--group, and exit codes from errors (exits_cleanly)."""

    def decorate(fn: Callable):
        return task(iterable=["host", "group"], help={**HOST_HELP, **(help or {})})(exits_cleanly(fn))

    return decorate


def split_names(values: list[str] | None) -> list[str]:
    """`--host a,b --host c` -> ["a", "b", "c"]."""
    return [name.strip() for value in values or [] for name in value.split(",") if name.strip()]


def select_hosts(c, host: list[str] | None, group: list[str] | None, all_: bool, inventory: str | None):
    """Load the inventory and pick the hosts named by --host/--group, or every host with --all (alone).
    Returns (inventory, hosts); InputError (exit 2) for a conflict, an unknown name or an empty selection."""
    from gpuprov.inventory import load_inventory

    hosts, groups = split_names(host), split_names(group)
    if all_ and (hosts or groups):
        raise InputError("--all selects every host: give it alone, or name hosts with --host/--group",
                         step="select hosts")
    inv = load_inventory(inventory or path_setting(c, "inventory"))
    return inv, inv.select(hosts=hosts, groups=groups, all_=all_)


def parallel_setting(c, parallel: str | int | None) -> int:
    """--parallel, else gpuprov.parallel: a whole number >= 1 (InputError otherwise)."""
    from gpuprov.config import setting

    value = setting(c, "parallel") if parallel is None else parallel
    text = str(value).strip()
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise InputError(f"--parallel must be a whole number >= 1, not {value!r}", step="select hosts")
    return int(text)


def run_settings(c, inv, *, trust_new_hosts: bool = False, parallel: str | int | None = None,
                 max_fail: str | None = None):
    """Executor settings from invoke.yaml, the inventory (its known_hosts wins) and the task's flags."""
    from gpuprov.config import setting
    from gpuprov.executor import Settings

    return Settings(
        known_hosts=inv.known_hosts or path_setting(c, "known_hosts"),
        trust_new=trust_new_hosts,
        parallel=parallel_setting(c, parallel),
        connect_timeout=int(setting(c, "connect_timeout")),
        connect_retries=int(setting(c, "connect_retries")),
        command_timeout=int(setting(c, "command_timeout")),
        max_fail=max_fail,
    )


def gather_outcomes(c, inv, hosts, *, trust_new_hosts: bool = False, parallel: str | int | None = None,
                    quiet: bool = False) -> list:
    """Facts of every host, in parallel, with per-host progress: one executor Outcome per host."""
    from gpuprov.executor import run_on_hosts
    from gpuprov.facts.gather import gather
    from gpuprov.ops import MANAGED_FILES
    from gpuprov.report import progress_printer

    return run_on_hosts(hosts, lambda conn: gather(conn, MANAGED_FILES),
                        run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel),
                        jump_of=inv.jump_host, on_event=progress_printer(quiet=quiet))


def gather_all(c, inv, hosts, *, trust_new_hosts: bool = False, parallel: str | int | None = None,
               quiet: bool = False) -> dict:
    """Facts of every host: {name: facts} or {name: {"error": message}}."""
    outcomes = gather_outcomes(c, inv, hosts, trust_new_hosts=trust_new_hosts, parallel=parallel, quiet=quiet)
    return {o.host.name: o.value if o.ok else {"error": str(o.error)} for o in outcomes}
