"""One fleet runtime for every host job: the host record, the job protocol, the fleet loop and its exit code.

A capability adds a `HostJob`: the variables it reads, the facts it needs, how it plans, what it refuses, how it
applies (the batched apply by default), how it verifies, its table row. `run_fleet` does the rest for every job
alike: the executor over the selected hosts (in batches when asked), per-host progress, Ctrl-C (the report is still
written, exit 130), the entry of a host whose work raised, the JSON report (with the run's `shard`: which of a
sharded run's shards it is, null when unsharded), the tables and the exit code.

Ctrl-C: the first starts no new host and waits for those in progress, the second closes their connections and
stops waiting (gpuprov.core.executor); the report is written either way. Once a run was interrupted, the next
Ctrl-C ends the process at once, quietly, with exit 130 (`_Ending`): a host that does not let go of its thread
would otherwise keep the process in Python's exit, where a Ctrl-C prints a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov.core.errors import GpuprovError, InputError, literal

Say = Callable[[str], None]


@dataclass
class HostRecord:
    """What happened on one host, for every job: status, plan, steps, facts before and after, notices, error.

    A job that keeps fields of its own (provision's stack and reboot, harden's guard, monitoring's endpoints...)
    extends the record with them and returns them from `details`: the report has them beside the common ones."""

    host: str
    status: str = "unchanged"          # unchanged | planned | changed | refused | failed | skipped, or the job's own
    plan: Any = None                   # the planned changes (change_dict), or the job's plan document
    steps: list = field(default_factory=list)
    facts_before: dict | None = None
    facts_after: dict | None = None
    notices: list[str] = field(default_factory=list)
    error: dict | None = None

    def details(self) -> dict:
        """The job's own fields, for the report."""
        return {}

    def to_dict(self) -> dict:
        data = {"host": self.host, "status": self.status, **self.details(), "notices": self.notices,
                "plan": self.plan, "steps": [s.to_dict() if hasattr(s, "to_dict") else s for s in self.steps],
                "facts_before": self.facts_before, "facts_after": self.facts_after}
        if self.error is not None:
            data["error"] = self.error
        return data


class HostJob:
    """A unit of work the fleet loop runs on each host; subclasses override what differs.

    `run_host` is the whole per-host flow: facts, plan, refusals, (dry run: stop), apply, verify. A step that
    raises GpuprovError fails the host with the record so far attached (`exc.run`), so that the report keeps what
    happened before the failure."""

    kind = "job"                                   # the report's name: <reports>/<kind>-<stamp>.json
    task = ""                                      # the invoke task that runs it (hints say to rerun it)
    columns: tuple[str, ...] = ("host", "status", "changes", "detail")
    variables: tuple[str, ...] = ()   # the inventory variables it reads (top-level names, each declared once)
    dry_run = False

    def __init__(self, dry_run: bool = False):
        self.dry_run = dry_run

    # -- the steps -------------------------------------------------------------------------------------------
    def new_record(self, host) -> HostRecord:
        return HostRecord(host.name)

    def managed_files(self, host) -> tuple[str, ...]:
        """The files the job may change: their contents come back with the facts."""
        return ()

    def gather(self, conn, record: HostRecord) -> dict:
        """The facts the job needs, in one round trip."""
        from gpuprov.facts.gather import gather

        return gather(conn, self.managed_files(conn.host))

    def plan(self, conn, record: HostRecord) -> list:
        """The changes that bring the host where it should be ([] when it is there); record.plan is set here."""
        return []

    def refuse(self, conn, record: HostRecord, changes: list) -> list:
        """The changes that may run now (the rest are refused, and the record says why)."""
        return changes

    def planned(self, record: HostRecord, changes: list) -> None:
        """A dry run ends here."""
        record.status = "planned" if changes else "unchanged"

    def apply(self, conn, record: HostRecord, changes: list) -> None:
        """The batched apply: one script over stdin, the facts coming back at its end."""
        from gpuprov.core.apply import apply_changes

        steps, record.facts_after = apply_changes(conn, changes, managed_files=self.managed_files(conn.host),
                                                  known=record.facts_after,
                                                  task=self.task or self.kind)
        record.steps += steps

    def verify(self, conn, record: HostRecord, say: Say) -> None:
        """After the apply (or when nothing was to change): check the host is where it should be."""

    def run_host(self, conn, say: Say) -> HostRecord:
        record = self.new_record(conn.host)
        try:
            say("facts")
            record.facts_before = record.facts_after = self.gather(conn, record)
            changes = self.refuse(conn, record, self.plan(conn, record))
            if self.dry_run:
                self.planned(record, changes)
                return record
            if changes:
                say(f"apply {len(changes)} changes")
                record.status = "changed"
                self.apply(conn, record, changes)
            self.verify(conn, record, say)
            return record
        except GpuprovError as exc:
            record.status = "failed"
            record.steps += getattr(exc, "steps", [])   # the batches before, and the failed one
            exc.run = record
            raise

    # -- the fleet's view ------------------------------------------------------------------------------------
    def failing(self, entry: dict) -> bool:
        """Whether a host that did not fail is still not where the operator asked (exit 1)."""
        return False

    def hooks(self, fleet: Fleet):
        """Hooks before and after each batch and the gate that can stop the run (gpuprov.core.batches.BatchHooks),
        for a job that drives a rolling change (drain a batch, change it, resume it); None for most jobs."""
        return None

    def finish(self, fleet: Fleet, records: list, entries: list[dict]) -> dict:
        """After every host: fleet-wide work (verdicts across hosts, follow-up runs); returns report fields."""
        return {}

    def row(self, entry: dict) -> dict:
        plan = entry.get("plan")
        changes = plan.get("changes", []) if isinstance(plan, dict) else plan or []
        return {"host": entry["host"], "status": entry.get("status", "failed"), "changes": str(len(changes)),
                "detail": error_line(entry)}

    def rows(self, entries: list[dict]) -> list[dict]:
        """The summary table: one row per host by default."""
        return [self.row(entry) for entry in entries]

    def print_details(self, entries: list[dict]) -> None:
        """Above the summary table: each host's notices, error and, in a dry run, its plan."""
        from gpuprov.core.report import print_host

        for entry in entries:
            print_host(entry, self.dry_run)

    def siblings(self, report: Path, entries: list[dict]) -> dict[str, str]:
        """Files written beside the JSON report (validate's JUnit): {name: path}, printed and in --json."""
        return {}

    def title(self) -> str:
        return self.kind + (" (dry run)" if self.dry_run else "")

    def report_fields(self) -> dict:
        """The run-level fields of the report (the options the run was asked with)."""
        return {"dry_run": self.dry_run}


@dataclass
class Fleet:
    """The selected hosts and how to reach them, and where the run's reports go."""

    inventory: Any
    hosts: list
    settings: Any                      # gpuprov.core.executor.Settings
    reports: Path
    new_reports: bool = False          # the reports folder was created for this run (said once, on stderr)
    quiet: bool = False                # --json: no progress, one JSON document on stdout
    on_event: Callable[[Any, str], None] = field(default=lambda host, event: None)
    shard: dict | None = None          # --shard K/N: gpuprov.core.shards.shard_record, the report's `shard`
    verbose: bool = False              # -v: each command run on a host is printed on stderr (echoing)
    terse: bool = False                # -q: only the failed hosts' details above the summary table

    def run(self, hosts: list, work: Callable, hooks=None) -> list:
        """`work(conn)` on `hosts` with the run's settings (batches and `hooks` included): the executor's outcomes.
        A job's follow-up runs use it too."""
        from gpuprov.core.executor import run_on_hosts

        if self.verbose:
            work = _echoing_work(work)
        return run_on_hosts(hosts, work, self.settings, jump_of=self.inventory.jump_host, on_event=self.on_event,
                            hooks=hooks)


def _echoing_work(work: Callable) -> Callable:
    return lambda conn: work(echoing(conn))


_ECHO_LOCK = threading.Lock()
ECHO_LIMIT = 400   # characters of a command shown by -v (the rest is counted, not shown)


def _echo(text: str) -> None:
    from gpuprov.core.report import console, styled
    from gpuprov.core.secrets import mask

    with _ECHO_LOCK:
        console(stderr=True).print(styled(mask(text), "dim"), soft_wrap=True)


class Echoing:
    """A host connection that prints each command it runs, then its exit status and time, on stderr (-v/--verbose):
    masked (gpuprov.core.secrets), control characters escaped, a long command cut at ECHO_LIMIT characters."""

    def __init__(self, conn):
        self._conn = conn

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    def run(self, command: str, **kwargs):
        from gpuprov.core.secrets import mask

        name = literal(self._conn.host.name)
        shown = literal(mask(command))
        if len(shown) > ECHO_LIMIT:
            shown = f"{shown[:ECHO_LIMIT]}... ({len(shown) - ECHO_LIMIT} more characters)"
        stdin = kwargs.get("stdin")
        extra = (" (as root)" if kwargs.get("sudo") else "") + (
            f" (stdin: {len(stdin.splitlines())} lines)" if stdin else "")
        _echo(f"{name}: $ {shown}{extra}")
        try:
            result = self._conn.run(command, **kwargs)
        except GpuprovError as exc:
            _echo(f"{name}: failed: {literal(exc.message.splitlines()[0] if exc.message else type(exc).__name__)}")
            raise
        _echo(f"{name}: exit {result.rc} ({result.duration:.1f}s)")
        return result

    def fresh(self, **kwargs):
        return Echoing(self._conn.fresh(**kwargs))

    def open(self):
        self._conn.open()
        return self


def echoing(conn):
    """`conn` printing each command it runs (Echoing), for -v/--verbose."""
    return conn if isinstance(conn, Echoing) else Echoing(conn)


class _Ending:
    """Installed once a run was interrupted: the next Ctrl-C ends the process at once, with one line on stderr and
    exit 130 (os._exit: threads of hosts still in progress are not waited for). A Ctrl-C while the report is being
    written waits for the write (milliseconds of local I/O) so that the report is never left half written. Only in
    the main thread (where Python runs signal handlers); the handler before it is put back once no other thread
    would keep the process from ending."""

    def __init__(self):
        self.writing = False
        self.pending = False
        self.previous = None
        self.installed = False

    def install(self) -> None:
        if not self.installed and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self.handle)
            self.installed = True

    def handle(self, signum, frame) -> None:
        if self.writing:
            self.pending = True
            return
        self.end()

    def end(self, report: str = "") -> None:
        print(f"interrupted again: exiting now{report}; hosts still in progress are left as they are",
              file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(130)

    @contextlib.contextmanager
    def report(self) -> Iterator[None]:
        """The report is written in here: a Ctrl-C meanwhile ends the process right after it."""
        self.writing = True
        try:
            yield
        finally:
            self.writing = False
            if self.pending:
                self.end()

    def release(self) -> None:
        """Put the previous handler back when no thread would hold the process at its exit."""
        others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon
                  and t.is_alive()]
        if self.installed and not others:
            signal.signal(signal.SIGINT, self.previous)
            self.installed = False


def error_line(entry: dict) -> str:
    """The first line of a host's error, for a table cell."""
    return ((entry.get("error") or {}).get("error") or "").split("\n", 1)[0][:160]


def failed_entry(job: HostJob, outcome) -> dict:
    """A host's report entry when its work raised: the record it carried so far (the error's `run`), its status
    (failed, or skipped after --max-fail, a gate or Ctrl-C) and the error."""
    record = getattr(outcome.error, "run", None) or job.new_record(outcome.host)
    record.status = "skipped" if outcome.skipped else "failed"
    record.error = outcome.error.to_dict()
    return record.to_dict()


def exit_code(job: HostJob, outcomes: list, entries: list[dict], interrupted: bool, stopped: bool = False) -> int:
    """The one exit-code policy: 130 interrupted (Ctrl-C); 1 when a batch hook or the gate stopped the run; 2 when
    every failed host failed on bad input and every other host is where the operator asked; 1 when a host failed
    or is not where the operator asked (job.failing); else 0."""
    if interrupted:
        return 130
    if stopped:
        return 1
    failed = [o for o in outcomes if not o.ok]
    failing = any(job.failing(entry) for entry, outcome in zip(entries, outcomes, strict=True) if outcome.ok)
    if failed and not failing and all(isinstance(o.error, InputError) for o in failed):
        return 2
    return 1 if failed or failing else 0


def run_fleet(fleet: Fleet, job: HostJob) -> int:
    """Run `job` on every selected host; write the report, print it (or the JSON document) and return the exit
    code. Ctrl-C starts no new host; what completed is reported, and the code is 130."""
    from gpuprov.core.executor import HookError, RunInterrupted
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import summary_table, write_json_report

    interrupted, stopped = False, None
    ending = _Ending()
    try:
        outcomes = fleet.run(fleet.hosts, lambda conn: job.run_host(conn, lambda what: fleet.on_event(conn.host,
                                                                                                      what)),
                             hooks=job.hooks(fleet))
    except RunInterrupted as stop:
        outcomes, interrupted = stop.outcomes, True
        ending.install()
    except HookError as exc:
        outcomes, stopped = exc.outcomes, exc
    except KeyboardInterrupt:   # a Ctrl-C while the executor still handled the one before: nothing to report
        ending.end(", without a report")
    records = [o.value if o.ok else None for o in outcomes]
    entries = [o.value.to_dict() if o.ok else failed_entry(job, o) for o in outcomes]
    extra = {}
    if not interrupted:
        try:
            extra = job.finish(fleet, records, entries)
        except KeyboardInterrupt:   # Ctrl-C in a follow-up run: the report still has what completed
            interrupted = True
            ending.install()
    payload = {**job.report_fields(), "interrupted": interrupted, "shard": fleet.shard, **extra, "hosts": entries}
    if stopped is not None:
        payload["stopped"] = stopped.to_dict()
    with ending.report():
        report = write_json_report(fleet.reports, job.kind, payload)
        files = {"report": str(report), **job.siblings(report, entries)}
    if fleet.new_reports:
        print(f"created the folder {literal(str(fleet.reports))} (gpuprov.reports)", file=sys.stderr)
    if fleet.quiet:
        print(dump_json({**files, **payload}))
    else:
        job.print_details([entry for entry in entries if entry.get("error")] if fleet.terse else entries)
        summary_table(job.title(), job.rows(entries), list(job.columns))
        print("\n".join(f"{name}: {literal(path)}" for name, path in files.items()))
    if interrupted:
        print(f"interrupted (Ctrl-C): the report {literal(str(report))} has what completed", file=sys.stderr)
    if stopped is not None:
        print(f"error: {stopped}", file=sys.stderr)
    ending.release()
    return exit_code(job, outcomes, entries, interrupted, stopped is not None)
