"""Before a rollout touches a host: the target lock (adopted, or a copy for a dry run), the journal it continues,
the scheduler's view of the hosts (who is drained or down outside this rollout, who runs jobs), the budget, the
order (idle hosts first, then busy ones by the time their jobs have left, unavailable ones last) and the batches
(the canary, then --batch at a time, never more than --max-unavailable leaves room for).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuprov.core.batches import BatchPlan, Size
from gpuprov.core.errors import InputError, literal
from gpuprov.rollout.job import Budget, RolloutJob, RolloutOptions
from gpuprov.rollout.journal import Journal, open_journal


def arguments(hosts: list, to_lock: str | None, update_lock: bool, drain: str) -> dict:
    """What makes two runs the same rollout (a rerun resumes it): the hosts, where they go, how they drain."""
    return {"hosts": sorted(h.name for h in hosts), "to_lock": to_lock, "update_lock": bool(update_lock),
            "drain": drain}


@dataclass
class Prepared:
    """A rollout ready to run: the fleet in its order and batches, the job, and why it may not start."""

    fleet: object
    job: RolloutJob
    journal: Journal
    blocked: str | None = None
    cleanup: Path | None = None

    def run(self) -> int:
        from gpuprov.core.runtime import run_fleet

        try:
            if self.blocked:
                if not self.job.dry_run:
                    self.journal.set_status("blocked", self.blocked)
                print(literal(self.blocked), file=sys.stderr)
                print(f"nothing started; rerun the same command once hosts are back (journal "
                      f"{literal(str(self.journal.path))})", file=sys.stderr)
                return 1
            return run_fleet(self.fleet, self.job)
        finally:
            if self.cleanup is not None:
                shutil.rmtree(self.cleanup, ignore_errors=True)


def prepare(fleet, *, kind: str, locks: Path, to_lock: str | None, update_lock: bool, batch: Size,
            max_unavailable: Size, canary: int, wait_jobs_s: float, validate: str, checks, wheelhouse: Path,
            dry_run: bool) -> Prepared:
    from gpuprov.rollout.connect import scheduler_for

    args = arguments(fleet.hosts, to_lock, update_lock, kind)
    journal = open_journal(fleet.reports, args, [h.name for h in fleet.hosts], dry_run=dry_run)
    locks_dir, cleanup = _target_locks(fleet.hosts, locks, to_lock, journal, dry_run)
    scheduler = scheduler_for(kind, fleet)
    states = scheduler.nodes(fleet.hosts)
    others = {name: ("down" if node.down else "drained") + (f": {node.reason}" if node.reason else "")
              for name, node in states.items()
              if (node.drained or node.down) and not node.drained_by(journal.run_id)}
    limit = max_unavailable.of(len(fleet.hosts))
    budget = Budget(limit=limit, shown=f"{max_unavailable} ({limit} host{'s' if limit != 1 else ''})", others=others)
    room = min(batch.of(len(fleet.hosts)), limit - len(others))
    order = _order(fleet.hosts, scheduler, others, journal)
    sizes = ((Size(count=min(canary, room)),) if canary else ()) + (Size(count=max(room, 1)),)
    settings = dataclasses.replace(fleet.settings, batches=BatchPlan(serial=sizes))
    fleet = dataclasses.replace(fleet, hosts=order, settings=settings)
    options = RolloutOptions(drain=kind, wait_jobs_s=wait_jobs_s, validate=validate, checks=checks,
                             update_lock=update_lock, locks_dir=locks_dir, wheelhouse=wheelhouse, dry_run=dry_run)
    job = RolloutJob(options, journal, scheduler, fleet.inventory.path.parent, budget, order)
    blocked = budget.blocked(1) if any(h.name not in others for h in order) and room < 1 else None
    return Prepared(fleet, job, journal, blocked, cleanup)


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


def _target_locks(hosts: list, locks: Path, to_lock: str | None, journal: Journal,
                  dry_run: bool) -> tuple[Path, Path | None]:
    """The locks folder the run installs from: with --to-lock, the target becomes the hosts' governing lock (the
    one replaced is kept in the history); a dry run adopts it in a copy of the folder instead."""
    if to_lock is None:
        return locks, None
    from gpuprov.stack.lock import adopt_lock, lock_path_for, target_lock

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
    if not dry_run:
        if not recorded:
            journal.data["target_lock"] = str(source)
            journal.set_status("running")
        adopt_lock(source, path)
        return locks, None
    copy = Path(tempfile.mkdtemp(prefix="gpuprov-rollout-locks-"))
    shutil.copytree(locks, copy, dirs_exist_ok=True)
    adopt_lock(source, copy / path.relative_to(locks))
    return copy, copy
