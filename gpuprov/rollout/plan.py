"""Before a rollout touches a host: the target lock (adopted, or a copy for a dry run), the journal it continues,
the scheduler's view of the hosts (who is drained or down outside this rollout, who runs jobs), the budget, the
order (idle hosts first, then busy ones by the time their jobs have left, unavailable ones last) and the batches
(the canary, then --batch at a time, never more than --max-unavailable leaves room for).
"""

from __future__ import annotations

import dataclasses
import fcntl
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.batches import BatchPlan, Size
from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.rollout.job import Budget, RolloutJob, RolloutOptions
from gpuprov.rollout.journal import Journal, open_journal


def arguments(hosts: list, to_lock: str | None, update_lock: bool, drain: str) -> dict:
    """What makes two runs the same rollout (a rerun resumes it): the hosts, where they go, how they drain."""
    return {"hosts": sorted(h.name for h in hosts), "to_lock": to_lock, "update_lock": bool(update_lock),
            "drain": drain}


@dataclass
class Prepared:
    """A rollout ready to run: the fleet in its order and batches, the job, why it may not start, and the target
    lock it adopts once it starts (governing path, source)."""

    fleet: object
    job: RolloutJob
    journal: Journal
    blocked: str | None = None
    targets: list[tuple[Path, Path]] = field(default_factory=list)   # --to-lock: (lock file, the lock it becomes)

    def run(self) -> int:
        """Nothing is written before here: the hosts are taken (no other rollout may run on them), then the
        journal written and the target lock adopted, then the fleet run."""
        from gpuprov.core.runtime import run_fleet

        with _hosts_taken(self.fleet.reports, [h.name for h in self.fleet.hosts], self.job.dry_run):
            if self.blocked:
                if not self.job.dry_run:
                    self.journal.set_status("blocked", self.blocked)
                print(literal(self.blocked), file=sys.stderr)
                print(f"nothing started; rerun the same command once hosts are back (journal "
                      f"{literal(str(self.journal.path))})", file=sys.stderr)
                return 1
            if self.job.dry_run:
                return self._dry_run(run_fleet)
            if self.targets:
                self.journal.data["target_lock"] = str(self.targets[0][1])
            self.journal.set_status("running")
            from gpuprov.stack.lock import adopt_lock

            for path, source in self.targets:
                adopt_lock(source, path)
            return run_fleet(self.fleet, self.job)

    def _dry_run(self, run_fleet) -> int:
        """A dry run plans against the target lock adopted in a copy of the locks folder."""
        if not self.targets:
            return run_fleet(self.fleet, self.job)
        from gpuprov.stack.lock import adopt_lock

        locks = self.job.options.locks_dir
        copy = Path(tempfile.mkdtemp(prefix="gpuprov-rollout-locks-"))
        try:
            shutil.copytree(locks, copy, dirs_exist_ok=True)
            for path, source in self.targets:
                adopt_lock(source, copy / path.relative_to(locks))
            self.job.options = dataclasses.replace(self.job.options, locks_dir=copy)
            return run_fleet(self.fleet, self.job)
        finally:
            shutil.rmtree(copy, ignore_errors=True)


def prepare(fleet, *, kind: str, locks: Path, to_lock: str | None, update_lock: bool, batch: Size,
            max_unavailable: Size, canary: int, wait_jobs_s: float, validate: str, checks, wheelhouse: Path,
            dry_run: bool) -> Prepared:
    """Everything checked and read, nothing written (Prepared.run writes)."""
    from gpuprov.rollout.connect import scheduler_for

    args = arguments(fleet.hosts, to_lock, update_lock, kind)
    journal = open_journal(fleet.reports, args, [h.name for h in fleet.hosts], dry_run=True)
    targets = _targets(fleet.inventory, fleet.hosts, locks, to_lock, journal)
    scheduler = scheduler_for(kind, fleet)
    states = scheduler.nodes(fleet.hosts)
    others = {name: ("down" if node.down else "drained") + (f": {node.reason}" if node.reason else "")
              for name, node in states.items()
              if (node.drained or node.down) and not node.drained_by(journal.run_id) and not node.failed_rollout()}
    limit = max_unavailable.of(len(fleet.hosts))
    budget = Budget(limit=limit, shown=f"{max_unavailable} ({limit} host{'s' if limit != 1 else ''})", others=others)
    room = min(batch.of(len(fleet.hosts)), limit - len(others))
    order = _order(fleet.hosts, scheduler, others, journal)
    sizes = ((Size(count=min(canary, room)),) if canary else ()) + (Size(count=max(room, 1)),)
    settings = dataclasses.replace(fleet.settings, batches=BatchPlan(serial=sizes))
    fleet = dataclasses.replace(fleet, hosts=order, settings=settings)
    options = RolloutOptions(wait_jobs_s=wait_jobs_s, validate=validate, checks=checks,
                             update_lock=update_lock, locks_dir=locks, wheelhouse=wheelhouse, dry_run=dry_run)
    job = RolloutJob(options, journal, scheduler, fleet.inventory.path.parent, budget, order)
    blocked = budget.blocked(1) if any(h.name not in others for h in order) and room < 1 else None
    return Prepared(fleet, job, journal, blocked, targets)


@contextmanager
def _hosts_taken(reports: Path, names: list[str], dry_run: bool):
    """Hold a lock per host (`<reports>/.rollout-locks/<host>.lock`) for the run: a second rollout on any of the
    hosts from this controller's reports folder stops before it touches anything. A dry run takes none."""
    if dry_run:
        yield
        return
    folder = reports / ".rollout-locks"
    folder.mkdir(parents=True, exist_ok=True)
    handles = []
    try:
        for name in sorted(names):
            handle = open(folder / f"{name}.lock", "a+")   # noqa: SIM115 - held open for the whole run
            handles.append(handle)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise GpuprovError(f"another rollout runs on {name} (it holds {folder / (name + '.lock')})",
                                   host=name, step="rollout",
                                   hint="wait for it to end (invoke rollout --status shows where it is)") from None
        yield
    finally:
        for handle in handles:
            handle.close()


def _order(hosts: list, scheduler, others: dict, journal: Journal) -> list:
    """Idle hosts first (the canary among them), then busy hosts, soonest free first; unavailable ones last."""
    def key(item):
        index, host = item
        if host.name in others:
            return (2, 0, index)
        if journal.host(host.name).get("state") in ("resumed", "current"):
            return (0, 0, index)
        jobs = scheduler.jobs(host)
        if not jobs:
            return (0, 0, index)
        longest = max((job.time_left_s if job.time_left_s is not None else 10**9) for job in jobs)
        return (1, longest, index)

    return [host for _index, host in sorted(enumerate(hosts), key=key)]


def _targets(inventory, hosts: list, locks: Path, to_lock: str | None, journal: Journal) -> list[tuple[Path, Path]]:
    """--to-lock: [(lock file, the lock it becomes)], checked now and adopted when the run starts (each replaced
    lock kept in the history). When the selected hosts are every host their governing lock governs, that lock
    moves; when they are some of them (a failed host rolled back alone), each gets a lock of its own and the
    others keep theirs. A rerun takes the target its journal recorded: `previous` then means the same lock, not the
    one the first run replaced."""
    if to_lock is None:
        return []
    from gpuprov.stack.lock import lock_path_for, target_lock

    governing = {lock_path_for(h, locks) for h in hosts}
    if len(governing) != 1 or None in governing:
        raise InputError("--to-lock: the selected hosts must share one governing lock (a group's lock, "
                         f"{literal(str(locks))}/<group>.lock.yaml); found "
                         + (", ".join(sorted(str(p) for p in governing if p)) or "none"), step="rollout",
                         hint="select one lock's hosts with --group, or create the group's lock with "
                              "invoke stack.lock")
    path = governing.pop()
    recorded = journal.data.get("target_lock")
    source = Path(recorded) if recorded else target_lock(to_lock, path, locks)
    governed = {h.name for h in inventory.hosts.values() if lock_path_for(h, locks) == path}
    if governed <= {h.name for h in hosts}:
        return [(path, source)]
    return [(Path(locks) / f"{h.name}.lock.yaml", source) for h in hosts]
