"""`invoke rollout`: move hosts to a new stack through the scheduler, one host job on the fleet runtime.

Each host goes through a state machine, every state written to the journal before it is acted on:

    selected -> draining -> drained -> upgrading -> [rebooting] -> validating -> resumed
                         \\-> skipped (jobs past --wait-jobs: the drain is lifted, nothing killed)
    any step that fails -> failed (left drained, the reason in the scheduler and the report; the first failure
                           stops new batches, and a rerun tries the host again from its drain)
    a host already on the target stack -> current (never drained)

Upgrading is provision (reboot never; disruptive steps still refused if work runs outside the scheduler), rebooting
is provision again with its reboot policy (it reboots over SSH and completes what waited for the new driver), and
validating is validate's suite on the host. A rerun resumes: a resumed or current host is not touched again, a host
left in a middle state goes on from there (provision is idempotent, so an upgrade is never applied twice).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.errors import GpuprovError
from gpuprov.core.runtime import HostJob, HostRecord, Say, error_line
from gpuprov.rollout.journal import Journal
from gpuprov.rollout.scheduler import REASON_PREFIX, Job, NodeState, Scheduler

POLL_S = 5.0           # how often a draining host's jobs are looked at
RESUME_WAIT_S = 120.0  # how long a resumed node may take to be back in service before the next batch
RESUME_POLL_S = 1.0    # how often it is looked at meanwhile (slurmd registers within seconds)
MIDDLE = ("draining", "drained", "upgrading", "rebooting", "validating", "failed")   # a host the run left drained


@dataclass(frozen=True)
class RolloutOptions:
    """What the operator asked for."""

    wait_jobs_s: float = 3600.0            # how long a draining host may wait for its jobs
    validate: str = "quick"                # quick | burn-in | none
    checks: tuple[str, ...] | None = None  # validate --only
    update_lock: bool = False
    locks_dir: Path = Path("locks")        # the locks the run installs (a copy with the target lock in a dry run)
    wheelhouse: Path = Path("build/wheelhouse")
    reboot_timeout: int = 900
    dry_run: bool = False


@dataclass
class RolloutRecord(HostRecord):
    """A host's rollout: its state, the stacks it moves between, what it waited for, what failed."""

    state: str = "selected"
    from_stack: str = ""
    to_stack: str = ""
    reason: str = ""                                   # why it failed, was skipped, or is current
    jobs: list = field(default_factory=list)           # the jobs it waited for (last seen)
    failed_checks: list = field(default_factory=list)  # validation's failed results (name, message, figures)
    provision: dict | None = None                      # the upgrade's summary: changes, reboot, stack check
    validation: dict | None = None                     # the suite's counts

    def details(self) -> dict:
        return {"state": self.state, "from": self.from_stack, "to": self.to_stack, "reason": self.reason,
                "jobs": self.jobs, "failed_checks": self.failed_checks, "provision": self.provision,
                "validation": self.validation}


@dataclass
class Budget:
    """Hosts unavailable at once: this run's hosts in flight plus hosts drained by others or down."""

    limit: int
    shown: str                                  # `50% (2 hosts)`
    others: dict[str, str] = field(default_factory=dict)   # host -> why it is unavailable (not ours)

    def blocked(self, starting: int) -> str | None:
        """Why `starting` more hosts may not start now (None: they may)."""
        if len(self.others) + starting <= self.limit:
            return None
        used = ", ".join(f"{name} ({why})" for name, why in sorted(self.others.items()))
        return (f"blocked: max-unavailable {self.shown} used by {len(self.others)} host"
                f"{'s' if len(self.others) != 1 else ''} drained or down outside this rollout: {used}")


class RolloutJob(HostJob):
    """The rollout's host job; see the module's docstring."""

    kind = "rollout"
    task = "rollout"
    columns = ("host", "state", "from", "to", "detail")
    variables = ("scheduler",)

    def __init__(self, options: RolloutOptions, journal: Journal, scheduler: Scheduler, inventory_dir: Path,
                 budget: Budget, hosts: list):
        super().__init__(options.dry_run)
        self.options, self.journal, self.scheduler = options, journal, scheduler
        self.inventory_dir, self.budget, self.hosts = inventory_dir, budget, hosts
        self.moved_locks: dict = {}      # --update-lock moves each lock once per run (provision's Options)
        self.stopping = threading.Event()  # Ctrl-C: hosts in flight finish their step, then stop where they are

    # -- one host ----------------------------------------------------------------------------------------------
    def new_record(self, host) -> RolloutRecord:
        entry = self.journal.host(host.name)
        return RolloutRecord(host.name, state=entry.get("state", "selected"), from_stack=entry.get("from", ""),
                             to_stack=entry.get("to", ""))

    def run_host(self, conn, say: Say) -> RolloutRecord:
        record = self.new_record(conn.host)
        try:
            self._run(conn, record, say)
        except GpuprovError as exc:
            self._fail(conn.host, record, exc.step or record.state, exc.message.splitlines()[0])
            record.status = "failed"
            if not self.dry_run:
                _write_metric(conn, self.journal, "failed", record)
            exc.run = record
            raise
        return record

    def _run(self, conn, record: RolloutRecord, say: Say) -> None:
        host, started = conn.host, record.state
        if started in ("resumed", "current"):
            record.status, record.reason = "unchanged", f"{started} earlier in rollout {self.journal.run_id}"
            problem = None if self.dry_run else self._resume_if_ours(host)   # a run stopped before the resume
            if problem:
                record.notices.append(problem)
            return
        say("plan")
        plan = self._provision(conn, say, dry_run=True)
        record.from_stack = record.from_stack or _stack_words(plan.facts_before, None)
        record.to_stack = _stack_words(None, plan.stack)
        node = self.scheduler.nodes([host])[host.name]
        # a node another rollout left drained after a failure is this run's to take over (a failed host rolled
        # back alone); any other drain is someone else's
        ours = node.drained_by(self.journal.run_id) or node.failed_rollout()
        if started == "failed" or (started in MIDDLE and not ours):
            # tried again from the drain: its jobs are waited for again (a failure while draining, or a node
            # someone resumed since, may run jobs); the upgrade itself is idempotent
            started = record.state = "selected"
        if plan.status == "unchanged" and not ours:
            record.state = record.status = "current"
            record.reason = "already on the target stack"
            if not self.dry_run:
                self._move(conn, record, "current", record.reason)
            return
        if not ours and (node.drained or node.down):
            record.status, record.state = "skipped", "skipped"
            record.reason = ("down" if node.down else "drained") + f" outside this rollout: {node.reason or '-'}"
            if not self.dry_run:
                self.journal.transition(host.name, "skipped", record.reason)
                _write_metric(conn, self.journal, "skipped", record)
            return
        if self.dry_run:
            record.status, record.plan = "planned", plan.plan
            record.reason = f"would drain, upgrade ({len((plan.plan or {}).get('changes', []))} changes), " \
                            f"{'validate' if self.options.validate != 'none' else 'not validate'} and resume"
            return
        if started in ("selected", "draining", "skipped") and not self._drain(conn, record, say, node):
            return
        self._check_stop(host, record)
        if record.state in ("drained", "upgrading"):
            self._move(conn, record, "upgrading", f"{record.from_stack} -> {record.to_stack}")
            say("upgrade")
            upgraded = self._provision(conn, say, reboot="never")
            record.provision = _provision_summary(upgraded)
            if upgraded.reboot == "required":
                self._move(conn, record, "rebooting", upgraded.reboot_detail)
        self._check_stop(host, record)
        if record.state == "rebooting" or record.state == "upgrading":
            say("reboot" if record.state == "rebooting" else "stack check")
            settled = self._provision(conn, say, reboot="if-needed")
            record.provision = _provision_summary(settled, record.provision)
            if settled.mismatches or settled.reboot in ("refused", "required"):
                what = "; ".join(m.get("what", "") for m in settled.mismatches) or settled.reboot_detail
                raise GpuprovError(f"the host is not on the target stack after the upgrade: {what}",
                                   host=host.name, step="upgrading", hint="see the provision steps in the report")
        self._check_stop(host, record)
        if record.state in ("upgrading", "rebooting", "validating"):
            self._validate(conn, record, say)
        self._move(conn, record, "resumed", f"on {record.to_stack}")
        problem = self._resume_if_ours(host)
        if problem:
            record.notices.append(problem)
        record.status = "changed"

    def _drain(self, conn, record: RolloutRecord, say: Say, node: NodeState) -> bool:
        """Drain the node and wait for its jobs (up to --wait-jobs); False when the host was skipped."""
        host = conn.host
        reason = f"{REASON_PREFIX} {self.journal.run_id}: {record.from_stack} -> {record.to_stack}"
        self._move(conn, record, "draining", "waiting for running jobs to end")
        self.scheduler.drain(host, reason)
        deadline = time.monotonic() + self.options.wait_jobs_s
        waited: set[str] = set()
        while True:
            jobs = self.scheduler.jobs(host)
            record.jobs = [job.to_dict() for job in jobs]
            if not jobs:
                break
            waits = "waits for " + ", ".join(job.describe() for job in jobs)
            if {job.id for job in jobs} != waited:      # the history names each set of jobs waited for, once
                waited = {job.id for job in jobs}
                self.journal.transition(host.name, "draining", waits, jobs=record.jobs, seen=_now())
            else:
                self.journal.note(host.name, jobs=record.jobs, detail=waits, seen=_now())
            if time.monotonic() >= deadline or self.stopping.is_set():
                return self._skip(conn, record, jobs, node)
            say(waits)
            self.stopping.wait(min(POLL_S, max(deadline - time.monotonic(), 0.1)))
        self._move(conn, record, "drained", "no job runs on the node", jobs=[])
        return True

    def _skip(self, conn, record: RolloutRecord, jobs: list[Job], before: NodeState) -> bool:
        """Jobs outlived --wait-jobs: nothing is killed; the drain is lifted (it was ours) and the host named."""
        record.status = record.state = "skipped"
        why = ("interrupted (Ctrl-C)" if self.stopping.is_set() else
               f"--wait-jobs {_duration(self.options.wait_jobs_s)} passed")
        record.reason = (f"{why} while jobs still run: " + ", ".join(job.describe() for job in jobs)
                         + "; drain lifted, rerun the rollout later")
        self.journal.transition(conn.host.name, "skipped", record.reason, jobs=record.jobs)
        # back to how the rollout found it: in service, or drained by this run before its upgrade; a host left
        # drained after a failure (this run's or another's) stays drained
        if not before.drained or (before.drained_by(self.journal.run_id) and not before.failed_rollout()):
            problem = self._resume(conn.host)
            if problem:
                record.notices.append(problem)
        _write_metric(conn, self.journal, record.state)
        return False

    def _validate(self, conn, record: RolloutRecord, say: Say) -> None:
        from gpuprov.validation.host import RunOptions, ValidateJob

        self._move(conn, record, "validating", f"validate {self.options.validate}")
        if self.options.validate == "none":
            record.validation = {"level": "none"}
            return
        job = ValidateJob(RunOptions(level=self.options.validate, only=self.options.checks,
                                     locks_dir=self.options.locks_dir, wheelhouse=self.options.wheelhouse,
                                     textfile=False))
        result = job.run_host(conn, say).to_dict()
        record.validation = {"level": self.options.validate, "status": result["status"], "counts": result["counts"]}
        record.failed_checks = [{"check": item["check"], "reason": item["reason"], "figures": item["figures"],
                                 "thresholds": item["thresholds"]}
                                for item in result.get("results") or [] if item["status"] == "fail"]
        if result["status"] in ("fail", "error"):     # gpuprov.validation.host.host_status
            failed = "; ".join(f"{c['check']}: {c['reason']}" for c in record.failed_checks) or error_line(result)
            raise GpuprovError(f"validation failed: {failed}", host=conn.host.name, step="validating",
                               hint="the node stays drained; fix the host, then rerun the rollout, or roll this "
                                    "host back alone: invoke rollout --host NAME --to-lock previous (it gets a "
                                    "lock of its own)")

    def _provision(self, conn, say: Say, *, dry_run: bool = False, reboot: str = "never"):
        """A provision pass on the host (its record), with the run's locks; the drained host's own work guard
        still refuses a disruptive step while work runs outside the scheduler."""
        from gpuprov.provision.run import Options, ProvisionJob

        # the plan pass moves no lock, and must not mark it moved for the real passes (provision's moved_locks)
        options = Options(dry_run=dry_run, reboot=reboot, update_lock=self.options.update_lock,
                          disrupt=dry_run, locks_dir=self.options.locks_dir,
                          reboot_timeout=self.options.reboot_timeout, moved_locks={} if dry_run else self.moved_locks)
        return ProvisionJob(options, self.inventory_dir).run_host(conn, say)

    # -- journal, scheduler and metric ---------------------------------------------------------------------------
    def _move(self, conn, record: RolloutRecord, state: str, detail: str, **fields) -> None:
        """Record the state (journal first), then show it in the host's Prometheus textfile."""
        self.journal.transition(conn.host.name, state, detail, **{"from": record.from_stack, "to": record.to_stack,
                                                                   **fields})
        record.state = state
        if state != "rebooting":
            _write_metric(conn, self.journal, state, record)

    def _fail(self, host, record: RolloutRecord, step: str, why: str) -> None:
        """A failed host stays drained, with the reason in the scheduler (only a node this run drained)."""
        record.state, record.reason = "failed", f"{step}: {why}"
        if self.dry_run:
            return
        self.journal.transition(host.name, "failed", record.reason, failed_checks=record.failed_checks)
        try:
            node = self.scheduler.nodes([host])[host.name]
            if node.drained_by(self.journal.run_id):
                self.scheduler.set_reason(host, f"{REASON_PREFIX} {self.journal.run_id}: failed {record.reason}"[:250])
        except GpuprovError as exc:
            record.notices.append(f"could not record the failure in the scheduler: {exc.message}")

    def _resume_if_ours(self, host) -> str | None:
        """Resume a node this run drained, and wait until the scheduler has it back in service (Slurm shows a
        resumed node not responding until slurmd registers again), so the next batch counts it available."""
        node = self.scheduler.nodes([host])[host.name]
        if not (node.drained and node.drained_by(self.journal.run_id)):
            return None
        return self._resume(host)

    def _resume(self, host) -> str | None:
        """Lift this run's drain and wait until the scheduler has the node back in service; what is wrong if
        it is not back within RESUME_WAIT_S."""
        self.scheduler.resume(host)
        deadline = time.monotonic() + RESUME_WAIT_S
        node = self.scheduler.nodes([host])[host.name]
        while (node.drained or node.down) and time.monotonic() < deadline:
            time.sleep(RESUME_POLL_S)
            node = self.scheduler.nodes([host])[host.name]
        return None if not (node.drained or node.down) else (
            f"resumed, but the scheduler does not have the node back in service after {RESUME_WAIT_S:g} s: "
            f"{node.state or '-'} ({node.reason or 'no reason'}); check it before it counts as unavailable")

    # -- the fleet's view ---------------------------------------------------------------------------------------
    def hooks(self, fleet):
        from gpuprov.core.batches import BatchHooks

        return BatchHooks(before_batch=self._before_batch, interrupted=self._interrupted)

    def _interrupted(self) -> None:
        self.stopping.set()
        if not self.dry_run:
            self.journal.set_status("interrupted", "interrupted (Ctrl-C): rerun the same command to resume")

    def _check_stop(self, host, record: RolloutRecord) -> None:
        """After Ctrl-C a host stops between steps, drained, where the journal says: a rerun resumes it there."""
        if self.stopping.is_set():
            raise GpuprovError(f"interrupted (Ctrl-C) after {record.state}: the node stays drained", host=host.name,
                               step=record.state, hint="rerun the same command: the host goes on from there")

    def _before_batch(self, index: int, hosts: list) -> None:
        """max-unavailable: hosts drained or down outside this rollout, plus this batch, within the budget."""
        if self.dry_run:
            return
        states = self.scheduler.nodes(self.hosts)
        starting_names = {h.name for h in hosts}
        self.budget.others = {name: _unavailable(node) for name, node in states.items()
                              if (node.drained or node.down) and not node.drained_by(self.journal.run_id)}
        self.budget.others.update({name: "failed in this rollout, left drained" for name, node in states.items()
                                   if node.drained and node.drained_by(self.journal.run_id)
                                   and name not in starting_names
                                   and self.journal.host(name).get("state") == "failed"})
        starting = [h for h in hosts if h.name not in self.budget.others
                    and self.journal.host(h.name).get("state") not in ("resumed", "current")]
        blocked = self.budget.blocked(len(starting))
        if blocked:
            self.journal.set_status("blocked", blocked)
            raise GpuprovError(blocked, step="rollout.budget",
                               hint="wait for those hosts to come back (or raise --max-unavailable), then rerun "
                                    "the same command: it resumes")

    def failing(self, entry: dict) -> bool:
        return entry.get("state") in ("failed", "skipped", "selected") and not self.dry_run

    def finish(self, fleet, records: list, entries: list[dict]) -> dict:
        if self.dry_run:
            return {"run_id": self.journal.run_id, "journal": None}
        for entry in entries:    # a host that failed before its work began (connect, host key): said in the journal
            if entry.get("status") == "failed" and self.journal.host(entry["host"]).get("state") == "selected":
                self.journal.transition(entry["host"], "failed", f"connect: {error_line(entry)}")
        done = all(self.journal.host(e["host"]).get("state") in ("resumed", "current") for e in entries)
        if done:
            self.journal.set_status("complete", "every host is on the target stack")
        elif self.journal.data.get("status") == "running":
            left = [e["host"] for e in entries if self.journal.host(e["host"]).get("state") not in ("resumed",
                                                                                                     "current")]
            self.journal.set_status("stopped", "not done: " + ", ".join(left))
        return {"run_id": self.journal.run_id, "journal": str(self.journal.path),
                "rollout_status": self.journal.data["status"], "message": self.journal.data.get("message", "")}

    def row(self, entry: dict) -> dict:
        return {"host": entry["host"], "state": entry.get("state") or entry.get("status", ""),
                "from": entry.get("from", ""), "to": entry.get("to", ""),
                "detail": (entry.get("reason") or error_line(entry))[:160]}

    def title(self) -> str:
        return f"rollout {self.journal.run_id}" + (" (dry run)" if self.dry_run else "")

    def report_fields(self) -> dict:
        return {"dry_run": self.dry_run, "run_id": self.journal.run_id, "arguments": self.journal.data["arguments"],
                "budget": {"max_unavailable": self.budget.shown, "outside": self.budget.others}}


def _write_metric(conn, journal: Journal, state: str, record: RolloutRecord | None = None) -> None:
    """The host's rollout state in its node_exporter textfile folder; a host that cannot take it gets a notice."""
    from gpuprov.rollout.status import metric_text, place_metric

    problem = place_metric(conn, metric_text(journal.run_id, state, time.time()))
    if problem and record is not None:
        record.notices.append(problem)


def _unavailable(node: NodeState) -> str:
    return ("down" if node.down else "drained") + (f": {node.reason}" if node.reason else "")


def _stack_words(facts: dict | None, stack: dict | None) -> str:
    """`driver 550.127.08` (the loaded driver, from the host's facts), or the target stack's `driver 570.133.20
    CUDA 12.8`."""
    if stack is not None:
        driver = (stack.get("driver") or {}).get("version", "?")
        cuda = (stack.get("cuda") or {}).get("version")
        return f"driver {driver}" + (f" CUDA {cuda}" if cuda else "")
    return f"driver {(facts or {}).get('loaded_driver_version') or 'none'}"


def _provision_summary(run, earlier: dict | None = None) -> dict:
    changes = len((run.plan or {}).get("changes", [])) + (earlier or {}).get("changes", 0)
    return {"changes": changes, "reboot": run.reboot if run.reboot != "not needed" else (earlier or {}).get(
        "reboot", run.reboot), "mismatches": run.mismatches}


def _duration(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 120 else f"{seconds / 60:g} min"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

