"""Provision one host: facts, stack (its lock when there is one), preflight, plan, apply, reboot, verify.

Facts are gathered once before, and come back with each apply batch (and once after a reboot). Work that
runs on the host (GPU processes, containers, Slurm jobs) refuses every disruptive step unless the
operator said --disrupt; the rest of the plan still applies.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.busy import DISRUPT_FLAG, REFUSED_MARK, REFUSED_RC, guard, running_work, work_for
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.runtime import HostJob, HostRecord, error_line
from gpuprov.stack.host import stack_for

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
    # locks_dir, update_lock, dry_run and moved_locks are how this run uses the locks (gpuprov.stack.host.LockUse)


@dataclass
class ProvisionRecord(HostRecord):
    """A host's provisioning: its stack and lock, preflight, the stack check after the run, the reboot."""

    stack: dict | None = None
    lock: str | None = None
    preflight: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)
    reboot: str = "not needed"           # not needed | required | done | refused | required by the OS
    reboot_detail: str = ""
    busy: list = field(default_factory=list)
    held_back: dict = field(default_factory=dict)   # refused change -> the work that refused it (not reported)

    def details(self) -> dict:
        return {"reboot": self.reboot, "reboot_detail": self.reboot_detail, "busy": self.busy, "lock": self.lock,
                "stack": self.stack, "preflight": [c.to_dict() for c in self.preflight],
                "mismatches": self.mismatches}


def wanted_packages(stack: dict, facts: dict) -> list:
    """The stack's packages the host lacks at their exact version: what preflight looks up."""
    from gpuprov.core.packages import Package
    from gpuprov.stack.resolve import PACKAGE_SECTIONS

    installed = facts.get("packages") or {}
    wanted = {}
    for section in PACKAGE_SECTIONS:
        for pkg in (stack.get(section) or {}).get("packages", []):
            if installed.get(pkg["name"]) != pkg["version"]:
                wanted[pkg["name"]] = Package(pkg["name"], pkg["version"])
    return list(wanted.values())


class ProvisionJob(HostJob):
    """`invoke provision`: the resolved stack on each host, under its lock; disruptive steps refused while work
    runs there (unless --disrupt), the reboot by policy, the stack checked after."""

    kind = "provision"
    columns = ("host", "status", "changes", "reboot", "stack", "detail")
    variables = ("hardware", "stack", "mirror", "container_engine")

    def __init__(self, options: Options, inventory_dir: Path):
        super().__init__(options.dry_run)
        self.options, self.inventory_dir = options, inventory_dir
        self.only = set(options.only) if options.only else None

    def new_record(self, host) -> ProvisionRecord:
        return ProvisionRecord(host.name)

    def managed_files(self, host) -> tuple[str, ...]:
        from gpuprov.provision.ops import MANAGED_FILES

        return MANAGED_FILES

    def plan(self, conn, record: ProvisionRecord) -> list:
        from gpuprov.provision.plan import plan_host, require_supported_os

        require_supported_os(conn.host.name, record.facts_before)
        record.stack, record.lock, record.notices = stack_for(conn.host, record.facts_before, self.options)
        plan = plan_host(conn.host, record.facts_before, record.stack, self.inventory_dir, self.only)
        record.plan = plan.to_dict()
        return plan.changes

    def refuse(self, conn, record: ProvisionRecord, changes: list) -> list:
        """Disruptive steps while work runs (and what completes them), then preflight for the host itself."""
        record.busy = running_work(record.facts_before)
        allowed, record.held_back = _split_refused(changes, record.facts_before, self.options.disrupt)
        record.plan["changes"] = _plan_changes(changes, record.held_back)
        if not self.options.skip_preflight:
            _preflight(conn, conn.host, record, self.inventory_dir, probe=bool(allowed))
        return allowed

    def planned(self, record: ProvisionRecord, changes: list) -> None:
        record.status = "planned" if record.plan["changes"] else "unchanged"
        _decide_reboot(record, self.options, planned_reboot=any(c.reboot for c in changes))

    def apply(self, conn, record: ProvisionRecord, changes: list) -> None:
        _apply_and_settle(conn, conn.host, record, changes, record.held_back, self.inventory_dir, self.options)

    def verify(self, conn, record: ProvisionRecord, say) -> None:
        """The reboot (by policy, unless work runs), what waited for the new driver, then the stack check."""
        from gpuprov.provision.plan import plan_host

        if record.held_back and record.status == "unchanged":
            record.status = "refused"
        if not _decide_reboot(record, self.options):
            _verify(record)
            return
        say("reboot")
        refused_by = reboot_and_wait(conn, self.options.reboot_timeout, self.options.disrupt)
        if refused_by:
            record.reboot, record.reboot_detail = "refused", (f"not rebooting: {refused_by}; rerun with "
                                                              f"{DISRUPT_FLAG} to interrupt it")
            _verify(record)
            return
        record.reboot, record.reboot_detail = "done", f"rebooted for: {record.reboot_detail}"
        record.facts_after = self.gather(conn, record)
        # what waited for the new driver to be loaded (services, CDI spec) is planned again now
        after, held_back = _split_refused(plan_host(conn.host, record.facts_after, record.stack,
                                                    self.inventory_dir, self.only).changes,
                                          record.facts_after, self.options.disrupt)
        record.plan["changes"] += _plan_changes([*after, *held_back], held_back)
        if after:
            _apply_and_settle(conn, conn.host, record, after, held_back, self.inventory_dir, self.options)
        _verify(record)

    def failing(self, entry: dict) -> bool:
        """A disruptive step or the reboot was refused (at plan time or on the host) in a real run: the host is
        not where the operator asked it to be."""
        if entry.get("plan") is None or entry["status"] in ("planned", "failed", "skipped"):
            return False
        return (entry.get("reboot") == "refused" or any(c.get("refused") for c in entry["plan"]["changes"])
                or any(step.get("status") == "refused" for step in entry.get("steps") or []))

    def row(self, entry: dict) -> dict:
        stack = entry.get("stack") or {}
        driver = (stack.get("driver") or {}).get("version", "")
        cuda = (stack.get("cuda") or {}).get("version", "")
        changes = (entry.get("plan") or {}).get("changes", [])
        refused = [c for c in changes if c.get("refused")]
        details = [error_line(entry)] if entry.get("error") else []
        if refused:
            details.append(f"{len(refused)} disruptive steps refused: work runs there (--disrupt overrides)")
        if entry.get("reboot_detail"):
            details.append(entry["reboot_detail"])
        if entry.get("mismatches"):
            details.append("; ".join(m["what"] for m in entry["mismatches"]))
        return {"host": entry["host"], "status": entry["status"], "changes": len(changes),
                "reboot": entry.get("reboot", ""), "stack": f"driver {driver} / CUDA {cuda}" if driver else "",
                "detail": "; ".join(details)[:160]}

    def report_fields(self) -> dict:
        return {"dry_run": self.dry_run, "reboot_policy": self.options.reboot}


@dataclass
class PreflightRecord(HostRecord):
    """A host's preflight checks."""

    checks: list = field(default_factory=list)

    def details(self) -> dict:
        return {"checks": [c.to_dict() for c in self.checks]}


class PreflightJob(HostJob):
    """`invoke preflight`: the read-only checks that must pass before provisioning; changes nothing."""

    kind = "preflight"
    columns = ("host", "check", "status", "detail", "remedy")
    variables = ("hardware", "stack", "mirror")

    def __init__(self, inventory_dir: Path):
        super().__init__(dry_run=False)
        self.inventory_dir = inventory_dir

    def new_record(self, host) -> PreflightRecord:
        return PreflightRecord(host.name)

    def verify(self, conn, record: PreflightRecord, say) -> None:
        from gpuprov.provision.plan import repo_spec
        from gpuprov.provision.preflight import run_preflight

        say("preflight")
        record.checks = run_preflight(conn, record.facts_before, repo_spec(conn.host, record.facts_before,
                                                                          self.inventory_dir), None)
        record.status = "fail" if any(c.status == "fail" for c in record.checks) else "pass"

    def failing(self, entry: dict) -> bool:
        return entry["status"] == "fail"

    def rows(self, entries: list[dict]) -> list[dict]:
        """One row per host and check; a host that could not be checked, as its `connect` row."""
        rows = []
        for entry in entries:
            if entry.get("error"):
                rows.append({"host": entry["host"], "check": "connect", "status": "fail",
                             "detail": error_line(entry), "remedy": entry["error"].get("hint") or ""})
            rows += [{"host": entry["host"], "check": c["name"], "status": c["status"], "detail": c["detail"],
                      "remedy": c["remedy"]} for c in entry.get("checks") or []]
        return rows

    def title(self) -> str:
        return "preflight"

    def report_fields(self) -> dict:
        return {}


def _split_refused(changes: list, facts: dict, disrupt: bool) -> tuple[list, dict]:
    """The changes that may run now, and {change: running work} for each one refused: a disruptive change
    while work runs, and what completes a refused component (Change.requires). The package index refresh a
    refused change carried is kept for the changes that still run."""
    from gpuprov.core.packages import for_family
    from gpuprov.provision.ops import Change

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
    from gpuprov.core.operations import change_dict

    return [change_dict(c, refused.get(c)) for c in changes]


def _preflight(conn, host, run: ProvisionRecord, inventory_dir: Path, probe: bool) -> None:
    """Preflight from facts; the remote probe (sources, versions, headers) only when something is installed."""
    from gpuprov.provision.plan import repo_spec
    from gpuprov.provision.preflight import evaluate, run_preflight

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


def _apply_and_settle(conn, host, run: ProvisionRecord, changes: list, refused: dict, inventory_dir: Path,
                      options: Options) -> None:
    """Apply changes (the facts come back with them), then apply once more what the new state plans that
    was neither just applied nor refused (services and the CDI spec once the new driver answers)."""
    from gpuprov.core.apply import apply_changes
    from gpuprov.provision.ops import MANAGED_FILES
    from gpuprov.provision.plan import plan_host

    steps, run.facts_after = apply_changes(conn, changes, disrupt=options.disrupt, managed_files=MANAGED_FILES,
                                           known=run.facts_after)
    run.steps += steps
    done = {(c.component, c.summary) for c in [*changes, *refused]}
    only = set(options.only) if options.only else None
    later = plan_host(host, run.facts_after, run.stack, inventory_dir, only).changes
    follow_up, held_back = _split_refused([c for c in later if (c.component, c.summary) not in done],
                                          run.facts_after, options.disrupt)
    run.plan["changes"] += _plan_changes([*follow_up, *held_back], held_back)
    if follow_up:
        steps, run.facts_after = apply_changes(conn, follow_up, disrupt=options.disrupt,
                                               managed_files=MANAGED_FILES, known=run.facts_after)
        run.steps += steps


def _decide_reboot(run: ProvisionRecord, options: Options, planned_reboot: bool = False) -> bool:
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


def _verify(run: ProvisionRecord) -> None:
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
