"""Provision one host: facts, stack (its lock when there is one), preflight, plan, apply, reboot, verify.

Facts are gathered once before, and come back with each apply batch (and once after a reboot). Work that
runs on the host (GPU processes, containers, Slurm jobs) refuses every disruptive step unless the
operator said --disrupt; the rest of the plan still applies.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.busy import DISRUPT_FLAG, REFUSED_MARK, REFUSED_RC, guard, running_work, work_for
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
    disrupt: bool = False
    locks_dir: Path = Path("locks")
    reboot_timeout: int = 900
    moved_locks: dict = field(default_factory=dict, compare=False)  # --update-lock: path -> (host, stack)


@dataclass
class HostRun:
    """Everything that happened on one host, for the summary table and the JSON report."""

    host: str
    status: str = "unchanged"            # unchanged | changed | planned | refused | failed
    facts_before: dict | None = None
    stack: dict | None = None
    preflight: list = field(default_factory=list)
    plan: dict | None = None
    steps: list = field(default_factory=list)
    facts_after: dict | None = None
    mismatches: list = field(default_factory=list)
    reboot: str = "not needed"           # not needed | required | done | refused | required by the OS
    reboot_detail: str = ""
    busy: list = field(default_factory=list)
    notices: list = field(default_factory=list)
    lock: str | None = None

    def to_dict(self) -> dict:
        return {"host": self.host, "status": self.status, "reboot": self.reboot,
                "reboot_detail": self.reboot_detail, "busy": self.busy, "notices": self.notices,
                "lock": self.lock, "stack": self.stack, "preflight": [c.to_dict() for c in self.preflight],
                "plan": self.plan, "steps": [s.to_dict() for s in self.steps], "mismatches": self.mismatches,
                "facts_before": self.facts_before, "facts_after": self.facts_after}


def stack_for(host, facts: dict, options: Options) -> tuple[dict, str | None, list[str]]:
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


def _move_lock(host, path: Path, lock: dict, resolved, options: Options) -> tuple[dict, str, list[str]]:
    """--update-lock: move the lock to the resolved stack, once per run; the hosts that share it (a group's)
    must resolve the same stack. A dry run writes nothing."""
    from gpuprov.stack.lock import drift, write_lock

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
        write_lock(path, resolved, lock.get("inputs", {}), lock.get("images"))
        return resolved.to_dict(), str(path), [f"moved the lock {path} to the resolved stack"]


def wanted_packages(stack: dict, facts: dict) -> list:
    """The stack's packages the host lacks at their exact version: what preflight looks up."""
    from gpuprov.ops.pkg import Package
    from gpuprov.stack.resolve import PACKAGE_SECTIONS

    installed = facts.get("packages") or {}
    wanted = {}
    for section in PACKAGE_SECTIONS:
        for pkg in (stack.get(section) or {}).get("packages", []):
            if installed.get(pkg["name"]) != pkg["version"]:
                wanted[pkg["name"]] = Package(pkg["name"], pkg["version"])
    return list(wanted.values())


def provision_host(conn, host, inventory_dir: Path, options: Options,
                   say: Callable[[str, str], None] = lambda host, what: None) -> HostRun:
    """The whole job on one connected host. Raises GpuprovError with the run so far attached."""
    from gpuprov.facts.gather import gather
    from gpuprov.ops import MANAGED_FILES
    from gpuprov.plan import plan_host, require_supported_os

    run = HostRun(host.name)
    try:
        say(host.name, "facts")
        run.facts_before = gather(conn, MANAGED_FILES)
        require_supported_os(host.name, run.facts_before)
        run.stack, run.lock, run.notices = stack_for(host, run.facts_before, options)
        only = set(options.only) if options.only else None
        plan = plan_host(host, run.facts_before, run.stack, inventory_dir, only)
        run.busy = running_work(run.facts_before)
        allowed, refused = _split_refused(plan.changes, run.facts_before, options.disrupt)
        run.plan = plan.to_dict() | {"changes": _plan_changes(plan.changes, refused)}
        if not options.skip_preflight:
            say(host.name, "preflight")
            _preflight(conn, host, run, inventory_dir, probe=bool(allowed))
        run.facts_after = run.facts_before
        if options.dry_run:
            run.status = "planned" if plan.changes else "unchanged"
            _decide_reboot(run, options, planned_reboot=any(c.reboot for c in allowed))
            return run
        if allowed:
            say(host.name, f"apply {len(allowed)} changes")
            run.status = "changed"
            _apply_and_settle(conn, host, run, allowed, refused, inventory_dir, options)
        if refused and run.status == "unchanged":
            run.status = "refused"
        if _decide_reboot(run, options):
            say(host.name, "reboot")
            refused_by = reboot_and_wait(conn, options.reboot_timeout, options.disrupt)
            if refused_by:
                run.reboot, run.reboot_detail = "refused", (f"not rebooting: {refused_by}; rerun with "
                                                            f"{DISRUPT_FLAG} to interrupt it")
                _verify(run)
                return run
            run.reboot, run.reboot_detail = "done", f"rebooted for: {run.reboot_detail}"
            run.facts_after = gather(conn, MANAGED_FILES)
            # what waited for the new driver to be loaded (services, CDI spec) is planned again now
            after, held_back = _split_refused(plan_host(host, run.facts_after, run.stack, inventory_dir,
                                                        only).changes, run.facts_after, options.disrupt)
            run.plan["changes"] += _plan_changes([*after, *held_back], held_back)
            if after:
                _apply_and_settle(conn, host, run, after, held_back, inventory_dir, options)
        _verify(run)
        return run
    except GpuprovError as exc:
        run.status = "failed"
        run.steps = run.steps + getattr(exc, "steps", [])  # the batches before, and the failed one
        exc.run = run
        raise


def _split_refused(changes: list, facts: dict, disrupt: bool) -> tuple[list, dict]:
    """The changes that may run now, and {change: running work} for each one refused: a disruptive change
    while work runs, and what completes a refused component (Change.requires). The package index refresh a
    refused change carried is kept for the changes that still run."""
    from gpuprov.ops import Change
    from gpuprov.ops.pkg import for_family

    refused: dict = {}
    if not disrupt:
        for change in changes:
            work = work_for(change.disruptive, facts) if change.disruptive else []
            if work:
                refused[change] = work
        stopped = {c.component: work for c, work in refused.items()}
        refused |= {c: stopped[c.requires] for c in changes if c.requires in stopped}
    allowed = [c for c in changes if c not in refused]
    refresh = for_family(facts["os"]["family"]).update() if refused else None
    if allowed and any(refresh in c.commands for c in refused) and not any(refresh in c.commands for c in allowed):
        allowed.insert(0, Change("sources", "refresh the package index (a refused step carried it)", (refresh,)))
    return allowed, refused


def _plan_changes(changes: list, refused: dict) -> list[dict]:
    from gpuprov.plan import change_dict

    return [change_dict(c, refused.get(c)) for c in changes]


def _preflight(conn, host, run: HostRun, inventory_dir: Path, probe: bool) -> None:
    """Preflight from facts; the remote probe (sources, versions, headers) only when something is installed."""
    from gpuprov.plan import repo_spec
    from gpuprov.preflight import evaluate, run_preflight

    repo = repo_spec(host, run.facts_before, inventory_dir)
    if probe:
        run.preflight = run_preflight(conn, run.facts_before, repo, run.stack,
                                      wanted=wanted_packages(run.stack, run.facts_before))
    else:
        run.preflight = evaluate(run.facts_before, None, repo, run.stack)
    failed = [c for c in run.preflight if c.status == "fail"]
    if not failed:
        return
    message = "preflight failed: " + "; ".join(f"{c.name}: {c.detail}" for c in failed)
    hint = "; ".join(c.remedy for c in failed if c.remedy)
    versions = next((c for c in failed if c.name == "package_versions"), None)
    if run.lock and versions is not None:
        raise InputError(_lock_lacks(run.lock, versions.detail, wanted_packages(run.stack, run.facts_before))
                         + "\n" + message, host=host.name, step="preflight",
                         hint=hint + "; or move the lock with --update-lock")
    raise GpuprovError(message, host=host.name, step="preflight", hint=hint + " (or rerun with --skip-preflight)")


def _lock_lacks(path: str, detail: str, wanted: list) -> str:
    """`FILE:LINE:COL: key: message` for each locked package version the repository lacks."""
    from gpuprov.stack.lock import load_lock, locate, package_key

    lock = load_lock(path)
    lines = []
    for pkg in wanted:
        key = package_key(lock, pkg.name)
        if key and f"{pkg.name}={pkg.version} " in detail:
            lines.append(f"{locate(path, key)}: {key}: {pkg.name}={pkg.version} is not in the repository")
    return "\n".join(lines) or f"{path}: the lock names packages the repository lacks"


def _apply_and_settle(conn, host, run: HostRun, changes: list, refused: dict, inventory_dir: Path,
                      options: Options) -> None:
    """Apply changes (the facts come back with them), then apply once more what the new state plans that
    was neither just applied nor refused (services and the CDI spec once the new driver answers)."""
    from gpuprov.apply import apply_changes
    from gpuprov.ops import MANAGED_FILES
    from gpuprov.plan import plan_host

    steps, run.facts_after = apply_changes(conn, changes, disrupt=options.disrupt, managed_files=MANAGED_FILES)
    run.steps += steps
    done = {(c.component, c.summary) for c in [*changes, *refused]}
    only = set(options.only) if options.only else None
    later = plan_host(host, run.facts_after, run.stack, inventory_dir, only).changes
    follow_up, held_back = _split_refused([c for c in later if (c.component, c.summary) not in done],
                                          run.facts_after, options.disrupt)
    run.plan["changes"] += _plan_changes([*follow_up, *held_back], held_back)
    if follow_up:
        steps, run.facts_after = apply_changes(conn, follow_up, disrupt=options.disrupt,
                                               managed_files=MANAGED_FILES)
        run.steps += steps


def _decide_reboot(run: HostRun, options: Options, planned_reboot: bool = False) -> bool:
    """Whether to reboot now; sets run.reboot and run.reboot_detail either way.

    `if-needed` reboots for what gpuprov applied that takes effect at the next boot: every such step records
    itself in /run/gpuprov/reboot-pending, which the facts after the batch read (this run's changes and
    earlier runs'); a dry run counts the `planned_reboot` changes instead. An OS-level
    /var/run/reboot-required alone is reported, not acted on."""
    facts = run.facts_after or run.facts_before or {}
    pending = list(facts.get("gpuprov_reboot_pending") or [])
    needed = planned_reboot or bool(pending)
    os_only = not needed and facts.get("reboot_required")
    if os_only:
        pkgs = ", ".join(facts.get("reboot_required_pkgs") or []) or "no package named"
        run.reboot, run.reboot_detail = "required by the OS", f"reboot required by the OS: {pkgs}"
    elif needed:
        run.reboot = "required"
        run.reboot_detail = "; ".join(pending) or "changes of this run take effect at the next boot"
    if options.reboot == "never" or (options.reboot == "if-needed" and not needed):
        return False
    work = running_work(facts)
    if work and not options.disrupt:
        run.reboot = "refused"
        run.reboot_detail = (f"not rebooting: work runs on the host ({'; '.join(work)}); rerun with "
                             f"{DISRUPT_FLAG} to interrupt it")
        return False
    return True


def _verify(run: HostRun) -> None:
    """Compare the host with its stack after the run; a pending driver load keeps the reboot required."""
    from gpuprov.stack.check import check_host

    run.mismatches = [m.to_dict() for m in check_host(run.facts_after, run.stack)]
    if run.reboot == "not needed" and any("reboot" in (m.get("remedy") or "").lower() for m in run.mismatches):
        run.reboot = "required"


def boot_id(conn) -> str:
    """Identifies one boot: the kernel's boot id plus PID 1's start time (a restarted container counts too)."""
    command = "echo \"$(cat /proc/sys/kernel/random/boot_id) $(cut -d' ' -f22 /proc/1/stat)\""
    return conn.run(command, timeout=30).stdout.strip()


def reboot_and_wait(conn, timeout: int, disrupt: bool = False) -> str | None:
    """Reboot the host unless work runs there now (checked on the host, unless `disrupt`), then wait until it
    answers SSH with a new boot id; raise after `timeout` seconds. Returns what refused the reboot, or None."""
    before = boot_id(conn)
    script = ("" if disrupt else guard("reboot") + "\n") + (
        "nohup sh -c " + shlex.quote("sleep 1; systemctl reboot") + " >/dev/null 2>&1 &\n")
    result = conn.run("sh -s", sudo=True, stdin=script, timeout=60)
    if result.rc == REFUSED_RC and REFUSED_MARK in result.stdout:
        return "; ".join(line for line in result.stdout.splitlines()[1:] if line.strip()) or "work runs there"
    conn.close()
    deadline = time.monotonic() + timeout
    time.sleep(3)
    while time.monotonic() < deadline:
        try:
            conn.open()
            if boot_id(conn) != before:
                return None
            conn.close()
        except GpuprovError:
            pass
        time.sleep(3)
    raise GpuprovError(f"the host did not come back within {timeout}s after the reboot", host=conn.host.name,
                       step="reboot", hint="check the host's console; rerun provision once it is up")
