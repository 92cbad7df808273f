"""Provision one host: facts, stack (from its lock when there is one), preflight, plan, apply, reboot, verify."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.errors import GpuprovError, InputError

REBOOT_POLICIES = ("never", "if-needed", "always")


@dataclass(frozen=True)
class Options:
    """What the operator asked for on the command line."""

    dry_run: bool = False
    reboot: str = "if-needed"
    only: frozenset[str] | None = None
    skip_preflight: bool = False
    update_lock: bool = False
    locks_dir: Path = Path("locks")
    reboot_timeout: int = 900


@dataclass
class HostRun:
    """Everything that happened on one host, for the summary table and the JSON report."""

    host: str
    status: str = "unchanged"            # unchanged | changed | planned | failed
    facts_before: dict | None = None
    stack: dict | None = None
    preflight: list = field(default_factory=list)
    plan: dict | None = None
    steps: list = field(default_factory=list)
    facts_after: dict | None = None
    mismatches: list = field(default_factory=list)
    reboot: str = "not needed"           # not needed | required | done
    lock: str | None = None

    def to_dict(self) -> dict:
        return {"host": self.host, "status": self.status, "reboot": self.reboot, "lock": self.lock,
                "stack": self.stack, "preflight": [c.to_dict() for c in self.preflight], "plan": self.plan,
                "steps": [s.to_dict() for s in self.steps], "mismatches": self.mismatches,
                "facts_before": self.facts_before, "facts_after": self.facts_after}


def stack_for(host, facts: dict, options: Options) -> tuple[dict, str | None]:
    """Resolve the host's stack; when a lock governs it, refuse to drift unless told --update-lock."""
    from gpuprov.stack.lock import drift, load_lock, lock_path_for, write_lock
    from gpuprov.stack.resolve import resolve_for_host

    resolved = resolve_for_host(host.vars, facts["os"]["key"], facts)
    path = lock_path_for(host, options.locks_dir)
    if path is None:
        return resolved.to_dict(), None
    lock = load_lock(path)
    differences = drift(lock, resolved)
    if differences and not options.update_lock:
        raise InputError("the resolved stack differs from the lock " + str(path) + ": " + "; ".join(differences),
                         host=host.name, step="lock",
                         hint="rerun with --update-lock to move the lock (review the diff in the pull request), "
                              "or revert the inventory change")
    if differences:
        write_lock(path, resolved, lock.get("inputs", {}))
    return resolved.to_dict(), str(path)


def provision_host(conn, host, inventory_dir: Path, options: Options,
                   say: Callable[[str, str], None] = lambda host, what: None) -> HostRun:
    """The whole job on one connected host. Raises GpuprovError with the run so far attached."""
    from gpuprov.facts.gather import gather
    from gpuprov.ops import MANAGED_FILES
    from gpuprov.plan import plan_host, require_supported_os
    from gpuprov.stack.check import check_host

    run = HostRun(host.name)
    try:
        say(host.name, "facts")
        run.facts_before = gather(conn, MANAGED_FILES)
        require_supported_os(host.name, run.facts_before)
        run.stack, run.lock = stack_for(host, run.facts_before, options)
        only = set(options.only) if options.only else None
        plan = plan_host(host, run.facts_before, run.stack, inventory_dir, only)
        run.plan = plan.to_dict()
        if not options.skip_preflight:
            say(host.name, "preflight")
            _preflight(conn, host, run, inventory_dir, probe=bool(plan.changes))
        if options.dry_run:
            run.status = "planned" if plan.changes else "unchanged"
            run.reboot = "required" if plan.reboot_needed else "not needed"
            return run
        run.facts_after = run.facts_before
        if plan.changes:
            say(host.name, f"apply {len(plan.changes)} changes")
            run.status = "changed"
            _apply_and_settle(conn, host, run, plan.changes, inventory_dir, only)
        reboot_now = options.reboot == "always" and plan.changes or (
            options.reboot == "if-needed" and (plan.reboot_needed or run.facts_after.get("reboot_required")))
        if reboot_now:
            say(host.name, "reboot")
            reboot_and_wait(conn, options.reboot_timeout)
            run.reboot = "done"
            run.facts_after = gather(conn, MANAGED_FILES)
            # what waited for the new driver to be loaded (services, CDI spec) is planned again now
            after = plan_host(host, run.facts_after, run.stack, inventory_dir, only)
            if after.changes:
                run.plan["changes"] += after.to_dict()["changes"]
                _apply_and_settle(conn, host, run, after.changes, inventory_dir, only)
        run.mismatches = [m.to_dict() for m in check_host(run.facts_after, run.stack)]
        if run.reboot != "done" and (plan.reboot_needed or run.facts_after.get("reboot_required")
                                     or _needs_reboot(run.mismatches)):
            run.reboot = "required"
        return run
    except GpuprovError as exc:
        run.status = "failed"
        run.steps = run.steps + getattr(exc, "steps", [])  # the batches before, and the failed one
        exc.run = run
        raise


def _preflight(conn, host, run: HostRun, inventory_dir: Path, probe: bool) -> None:
    """Preflight from facts; the remote probe (sources, headers) only when something will be installed."""
    from gpuprov.plan import repo_spec
    from gpuprov.preflight import evaluate, run_preflight

    repo = repo_spec(host, run.facts_before, inventory_dir)
    if probe:
        run.preflight = run_preflight(conn, run.facts_before, repo, run.stack)
    else:
        run.preflight = evaluate(run.facts_before, None, repo, run.stack)
    failed = [c for c in run.preflight if c.status == "fail"]
    if failed:
        raise GpuprovError("preflight failed: " + "; ".join(f"{c.name}: {c.detail}" for c in failed),
                           host=host.name, step="preflight",
                           hint="; ".join(c.remedy for c in failed if c.remedy) + " (or rerun with --skip-preflight)")


def _apply_and_settle(conn, host, run: HostRun, changes: list, inventory_dir: Path, only: set[str] | None) -> None:
    """Apply changes, gather facts again, and apply once more what the new state makes possible
    (services and the CDI spec once the new driver answers). Never repeats a change it just applied."""
    from gpuprov.apply import apply_changes
    from gpuprov.facts.gather import gather
    from gpuprov.ops import MANAGED_FILES
    from gpuprov.plan import change_dict, plan_host

    run.steps += apply_changes(conn, changes)
    run.facts_after = gather(conn, MANAGED_FILES)
    applied = {(c.component, c.summary) for c in changes}
    follow_up = [c for c in plan_host(host, run.facts_after, run.stack, inventory_dir, only).changes
                 if (c.component, c.summary) not in applied]
    if follow_up:
        run.steps += apply_changes(conn, follow_up)
        run.plan["changes"] += [change_dict(c) for c in follow_up]
        run.facts_after = gather(conn, MANAGED_FILES)


def _needs_reboot(mismatches: list[dict]) -> bool:
    return any("reboot" in (m.get("remedy") or "").lower() for m in mismatches)


def boot_id(conn) -> str:
    """Identifies one boot: the kernel's boot id plus PID 1's start time (a restarted container counts too)."""
    command = "echo \"$(cat /proc/sys/kernel/random/boot_id) $(cut -d' ' -f22 /proc/1/stat)\""
    return conn.run(command, timeout=30).stdout.strip()


def reboot_and_wait(conn, timeout: int) -> None:
    """Reboot the host, wait until it answers SSH with a new boot id; raise after `timeout` seconds."""
    before = boot_id(conn)
    conn.run("nohup sh -c " + shlex.quote("sleep 1; systemctl reboot") + " >/dev/null 2>&1 &", sudo=True, timeout=30)
    conn.close()
    deadline = time.monotonic() + timeout
    time.sleep(3)
    while time.monotonic() < deadline:
        try:
            conn.open()
            if boot_id(conn) != before:
                return
            conn.close()
        except GpuprovError:
            pass
        time.sleep(3)
    raise GpuprovError(f"the host did not come back within {timeout}s after the reboot", host=conn.host.name,
                       step="reboot", hint="check the host's console; rerun provision once it is up")
