"""The stack a host is held to: its lock's (group or host) when one governs it, else what the inventory resolves
to; provision and validate read it the same way."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.errors import InputError


@dataclass(frozen=True)
class LockUse:
    """How a run uses the locks (provision's Options carries the same fields): where they are, whether to move
    them to the resolved stack (--update-lock), whether that is a dry run, and the locks this run moved so far."""

    locks_dir: Path = Path("locks")
    update_lock: bool = False
    dry_run: bool = False
    moved_locks: dict = field(default_factory=dict, compare=False)   # path -> (host, stack)


def stack_for(host, facts: dict, options: LockUse) -> tuple[dict, str | None, list[str]]:
    """The host's stack and the lock it came from, with notices for the operator.

    Under a lock the locked stack is installed exactly, whatever gpuprov's data or the inventory resolve to
    now (a difference is a notice); only --update-lock re-resolves and moves the lock."""
    from gpuprov.stack.lock import drift, load_lock, lock_path_for, newer_notice
    from gpuprov.stack.resolve import resolve_for_host

    os_key = facts["os"]["key"]
    path = lock_path_for(host, options.locks_dir)
    if path is None:
        return resolve_for_host(host.vars, os_key, facts).to_dict(), None, []
    lock = load_lock(path)
    if options.update_lock:
        return _move_lock(host, path, lock, resolve_for_host(host.vars, os_key, facts), options)
    locked = lock["stack"]
    if locked.get("os") != os_key:
        raise InputError(f"{path}: stack.os: the lock is for {locked.get('os')}, the host runs {os_key}",
                         host=host.name, step="lock",
                         hint="give this host its own lock (invoke stack.lock --host NAME) or --update-lock")
    try:
        resolved = resolve_for_host(host.vars, os_key, facts)
    except InputError as exc:
        return locked, str(path), [f"the inventory no longer resolves ({exc.message.splitlines()[0]}); "
                                   f"installing the lock {path}"]
    differences = drift(lock, resolved)
    if not differences:
        return locked, str(path), []
    newer = newer_notice(lock, resolved)
    return locked, str(path), [f"installing the lock {path}; " + (newer or (
        "the inventory resolves a different stack now (" + "; ".join(differences)
        + "): run with --update-lock to move the lock"))]


_LOCK_WRITES = threading.Lock()


def _move_lock(host, path: Path, lock: dict, resolved, options: LockUse) -> tuple[dict, str, list[str]]:
    """--update-lock: move the lock to the resolved stack, once per run, keeping the one it replaces in the locks
    folder's history/; the hosts that share it (a group's) must resolve the same stack. A dry run writes nothing."""
    from gpuprov.stack.lock import HISTORY, drift, write_lock

    with _LOCK_WRITES:
        first = options.moved_locks.get(str(path))
        if first is not None:
            if drift(first[1], resolved):
                raise InputError(f"{path}: hosts sharing this lock resolve to different stacks ({first[0]} and "
                                 f"{host.name}): " + "; ".join(drift(first[1], resolved)), host=host.name,
                                 step="lock", hint="lock them per host (invoke stack.lock --host NAME), or give "
                                 "them the same hardware and stack variables")
            return resolved.to_dict(), str(path), []
        options.moved_locks[str(path)] = (host.name, resolved.to_dict())
        if not drift(lock, resolved):
            return lock["stack"], str(path), []
        if options.dry_run:
            return resolved.to_dict(), str(path), [f"would move the lock {path} to the resolved stack (dry run: "
                                                   "not written)"]
        write_lock(path, resolved, lock.get("inputs", {}), lock.get("images"))  # keeps the replaced one in history
        return resolved.to_dict(), str(path), [f"moved the lock {path} to the resolved stack; the previous one is "
                                               f"kept in {path.parent / HISTORY} (invoke rollout --to-lock previous "
                                               "takes it back)"]
