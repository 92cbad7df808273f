"""A bounded pool of SSH connections: at most `parallel` hosts at once, each over one connection.

Fabric's ThreadingGroup starts one thread per host with no cap or timeout; fleets need a cap, connect and
command timeouts, and a failure budget (`max_fail`) after which no new host is started. Every host gets an
Outcome, whatever happens: a host's error or gpuprov bug is that host's failure, and Ctrl-C stops the run
with the outcomes so far (`RunInterrupted`), so that the caller can still write its report.

Batches (`Settings.batches`, a `BatchPlan` from `batch_plan()`, both in gpuprov.core.batches): Ansible's `serial`
(batches of N hosts, P% of the run's hosts or a list of sizes; a batch ends before the next starts;
`max_fail_percentage` judged per batch) or Salt's sliding window (`-b`: at most N or P% hosts in flight, a new one
starts as soon as one ends). Code that drives a rolling change passes `BatchHooks`: `before_batch`, `after_batch`
and a `gate` that can stop the run.
The pool is sized to the controller's open-files limit (gpuprov.core.open_files.fit_open_files), never
silently.
"""

from __future__ import annotations

import getpass
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov.core.batches import MAX_FAIL_PERCENTAGE_FLAG, BatchHooks, BatchPlan
from gpuprov.core.connection import HostConnection
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.known_hosts import KnownHosts, read_known_hosts
from gpuprov.core.open_files import fit_open_files


@dataclass(frozen=True)
class Settings:
    """How to reach hosts: host keys, timeouts, retries, parallelism, failure budget, batches."""

    known_hosts: Path
    trust_new: bool = False
    parallel: int = 32
    connect_timeout: int = 10
    connect_retries: int = 2
    command_timeout: int = 1800
    max_fail: str | None = None
    batches: BatchPlan | None = None


@dataclass
class Outcome:
    """What one host's work returned, or the error that stopped it."""

    host: Any
    value: Any = None
    error: GpuprovError | None = None
    duration: float = 0.0
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.skipped


def failure_budget(max_fail: str | None, total: int) -> int:
    """How many failed hosts are tolerated before no new host starts: `N` or `P%` of the hosts."""
    if max_fail in (None, ""):
        return total
    text = str(max_fail).strip()
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 <= percent <= 100:
                raise ValueError
            return int(total * percent / 100)
        count = int(text)
        if count < 0:
            raise ValueError
        return count
    except ValueError:
        raise InputError(f"--max-fail must be a count like 3 or a share like 10%, got {max_fail!r}") from None


_PASSWORDS: dict[str, str] = {}
_PASSWORD_LOCK = threading.Lock()


def sudo_password(host) -> str | None:
    """The sudo password from the environment variable the inventory names, else asked once on a terminal."""
    name = host.sudo_password_env
    if not name:
        return None
    if name in os.environ:
        return os.environ[name]
    with _PASSWORD_LOCK:
        if name not in _PASSWORDS:
            if not sys.stdin.isatty():
                raise InputError(f"the sudo password variable {name} is not set", host=host.name, step="sudo",
                                 hint=f"export {name}=... (it is never logged), or run from a terminal to be asked")
            _PASSWORDS[name] = getpass.getpass(f"sudo password ({name}) for {host.user}: ")
        return _PASSWORDS[name]


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped run_on_hosts. `outcomes` has one Outcome per host, in host order: what completed, and the
    hosts that were not started or not finished, as errors saying so."""

    def __init__(self, outcomes: list[Outcome]):
        super().__init__()
        self.outcomes = outcomes


def connect(host, settings: Settings, known_hosts: KnownHosts, jump=None) -> HostConnection:
    """A HostConnection (not yet open) for a host with the run's settings and its sudo password."""
    conn = HostConnection(host, known_hosts=known_hosts, trust_new=settings.trust_new,
                          connect_timeout=settings.connect_timeout, retries=settings.connect_retries,
                          command_timeout=settings.command_timeout, jump=jump)
    conn.set_sudo_password(sudo_password(host))
    return conn


class HookError(GpuprovError):
    """A batch hook or the gate raised: the run stopped. `outcomes` has one Outcome per host, in host order (the
    hosts not started are skipped Outcomes naming the hook)."""

    def __init__(self, message: str, outcomes: list[Outcome] | None = None, **fields):
        super().__init__(message, **fields)
        self.outcomes = outcomes or []


def _print_notice(text: str) -> None:
    print(f"gpuprov: {text}", file=sys.stderr)


def run_on_hosts(hosts: list, work: Callable[[HostConnection], Any], settings: Settings, *,
                 jump_of: Callable[[Any], Any] = lambda host: None,
                 on_event: Callable[[Any, str], None] = lambda host, event: None,
                 hooks: BatchHooks | None = None,
                 on_notice: Callable[[str], None] = _print_notice) -> list[Outcome]:
    """Run `work(connection)` on every host, at most `settings.parallel` at once; outcomes in host order.

    The known_hosts file and --max-fail are checked before any host is contacted (InputError), and `parallel`
    is fitted to the open-files limit (fit_open_files; on_notice(text) says what changed). on_event(host, event)
    is called with "start", "ok", "failed" or "skipped" for progress displays. `settings.batches` groups the hosts
    (BatchPlan) and `hooks` run around the groups (BatchHooks); a hook that raises is HookError. Ctrl-C starts no
    new host and waits for the hosts in progress; a second Ctrl-C closes their connections and stops waiting.
    Either way RunInterrupted carries every host's outcome.
    """
    return _Run(hosts, work, settings, jump_of, on_event, hooks or BatchHooks(), on_notice).run()


class _Run:
    """One run_on_hosts call: the pool, the batch in progress, the outcomes so far and why the run stopped."""

    def __init__(self, hosts: list, work: Callable, settings: Settings, jump_of: Callable, on_event: Callable,
                 hooks: BatchHooks, on_notice: Callable[[str], None]):
        self.hosts, self.work, self.settings, self.jump_of = hosts, work, settings, jump_of
        self.on_event, self.hooks = on_event, hooks
        self.budget = failure_budget(settings.max_fail, len(hosts))
        self.known_hosts = read_known_hosts(settings.known_hosts)
        self.plan = settings.batches or BatchPlan()
        self.groups = self.plan.batches(hosts)
        self.window = self.plan.window_size(len(hosts))
        self.slots = settings.parallel
        if hosts:
            fitted = fit_open_files(min(self.slots, self.window or max(len(group) for group in self.groups)))
            self.slots = min(self.slots, fitted.parallel)
            if fitted.notice:
                on_notice(fitted.notice)
        self.outcomes: dict[str, Outcome] = {}
        self.live: dict[str, HostConnection] = {}
        self.failed = 0
        self.queue: list = []                  # hosts of the current batch not started yet
        self.later = deque(self.groups)        # the batches after it
        self.batch: tuple[int, list] | None = None   # the batch in progress: its index (from 1) and hosts
        self.started: dict[str, int] = {}      # with a window, each started host's batch index
        self.ended: deque = deque(maxlen=self.window)   # the last `window` outcomes: the sliding window's batch
        self.running: dict = {}
        self.interrupted = False
        self.stop: tuple[str, str] | None = None   # why no new host starts, and what to do next
        self.hook_error: HookError | None = None
        self.pool: ThreadPoolExecutor | None = None

    # -- one host ---------------------------------------------------------------------------------------------
    def one(self, host) -> Outcome:
        began = time.monotonic()
        conn = None
        try:
            conn = self.live[host.name] = connect(host, self.settings, self.known_hosts, jump=self.jump_of(host))
            conn.open()
            return Outcome(host, value=self.work(conn), duration=time.monotonic() - began)
        except GpuprovError as exc:
            return Outcome(host, error=exc, duration=time.monotonic() - began)
        except Exception as exc:  # noqa: BLE001 - one host's bug must not stop the others
            return Outcome(host, error=_internal_error(host, exc), duration=time.monotonic() - began)
        finally:
            self.live.pop(host.name, None)
            if conn is not None:
                conn.close()

    def start(self, host) -> None:
        if self.window is not None:
            self.started[host.name] = len(self.started) + 1
            self.call("before_batch", self.hooks.before_batch, self.started[host.name], [host])
            if self.stop is not None:
                self.queue.insert(0, host)
                return
        self.on_event(host, "start")
        self.running[self.pool.submit(self.one, host)] = host

    def finish(self, future, host) -> Outcome:
        try:
            outcome = future.result()
        except BaseException as exc:  # noqa: BLE001 - even SystemExit in a worker is that host's failure
            outcome = Outcome(host, error=_internal_error(host, exc))
        self.outcomes[host.name] = outcome
        if outcome.error is not None:
            self.failed += 1
        self.on_event(host, "ok" if outcome.ok else "failed")
        return outcome

    # -- stopping, hooks and judging -----------------------------------------------------------------------
    def halt(self, reason: str, hint: str = "fix the failed hosts, then rerun") -> None:
        if self.stop is None:
            self.stop = (reason, hint)

    def call(self, name: str, hook: Callable | None, *args) -> Any:
        """A hook's answer; one that raises stops the run (hook_error). Ctrl-C in a hook is Ctrl-C."""
        if hook is None or self.hook_error is not None:
            return None
        try:
            return hook(*args)
        except GpuprovError as exc:
            self.hook_error = HookError(f"{name} failed: {exc.message}", host=exc.host, step=name,
                                        command=exc.command, output=exc.output,
                                        hint=exc.hint or "fix what the hook reports, then rerun")
        except Exception as exc:  # noqa: BLE001 - reported with its traceback, not lost in the run
            self.hook_error = HookError(f"{name} failed: internal error: {type(exc).__name__}: {exc}", step=name,
                                        output="".join(traceback.format_exception(exc)),
                                        hint="a bug in the code that drives the run: report it with this output")
        self.halt(f"{name} failed", "fix what stopped the run, then rerun on the hosts not started")
        return None

    def judge(self, group: list[Outcome], size: int, what: str) -> None:
        """max_fail_percentage and the gate, once a batch (a window: a host) ended."""
        bad = sum(outcome.error is not None and not outcome.skipped for outcome in group)
        limit = self.plan.max_fail_percentage
        if self.plan.serial and self.window is None and bad == len(group):
            self.halt(f"every host of {what} failed ({bad})")   # as Ansible stops on a batch that all failed
        elif limit is not None and bad * 100 > limit * size:
            self.halt(f"{bad} of {size} hosts failed in {what}, more than {MAX_FAIL_PERCENTAGE_FLAG} {limit:g}% "
                      "allows")
        if self.stop is None and self.hooks.gate is not None:
            so_far = [self.outcomes[host.name] for host in self.hosts if host.name in self.outcomes]
            reason = self.call("gate", self.hooks.gate, so_far)
            if reason:
                self.halt(f"stopped by the gate after {what}: {reason}",
                          "see why the gate stopped the run, then rerun on the hosts not started")

    def skip(self, pending: list) -> None:
        if self.interrupted:
            reason, hint = "interrupted (Ctrl-C)", "rerun on the hosts that were not started"
        elif self.stop is None or self.stop[0] == _MAX_FAIL:
            reason, hint = (f"{self.failed} hosts failed, more than --max-fail {self.settings.max_fail} allows",
                            "fix the failed hosts, then rerun")
        else:
            reason, hint = self.stop
        for host in pending:
            self.outcomes[host.name] = Outcome(host, skipped=True, error=GpuprovError(
                f"not started: {reason}", host=host.name, hint=hint))
            self.on_event(host, "skipped")

    # -- batches ----------------------------------------------------------------------------------------------
    def next_batch(self) -> None:
        if self.batch is None and not self.interrupted and self.stop is None and self.later:
            self.batch = (len(self.groups) - len(self.later) + 1, self.later.popleft())
            self.queue[:] = self.batch[1]
            if self.window is None:
                self.call("before_batch", self.hooks.before_batch, self.batch[0], list(self.queue))

    def fill(self) -> None:
        while self.queue and not self.interrupted and self.stop is None and len(self.running) < self.slots:
            if self.failed > self.budget:
                self.halt(_MAX_FAIL)
                break
            self.start(self.queue.pop(0))

    def collect(self) -> None:
        # a timeout, so that Ctrl-C is seen even when a worker thread took the signal
        done, _ = wait(self.running, timeout=0.5, return_when=FIRST_COMPLETED)
        for future in done:
            outcome = self.finish(future, self.running.pop(future))
            if self.window is not None:
                self.ended.append(outcome)
                self.call("after_batch", self.hooks.after_batch, self.started[outcome.host.name], [outcome])
                self.judge(list(self.ended), self.window, f"the window (the last {self.window} hosts to end)")

    def end_batch(self) -> None:
        """Every started host of the batch ended: its unstarted hosts are skipped, then after_batch, then judged."""
        index, members = self.batch
        self.batch = None
        self.skip(self.queue)
        self.queue.clear()
        group = [self.outcomes[host.name] for host in members]
        self.call("after_batch", self.hooks.after_batch, index, group)
        self.judge(group, len(group), f"batch {index}")

    def step(self) -> bool:
        """One turn of the loop; False once the run is over."""
        self.next_batch()
        self.fill()
        if self.running:
            self.collect()
            return True
        if self.interrupted:
            return False
        if self.batch is not None and self.window is None:
            self.end_batch()
        return self.stop is None and bool(self.queue or self.later)

    def run(self) -> list[Outcome]:
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(self.slots, len(self.hosts) or 1)))
        try:
            while True:
                try:
                    if not self.step():
                        break
                except KeyboardInterrupt:
                    if not self.interrupt():
                        break
        finally:
            self.shutdown()
        self.skip([host for host in self.hosts if host.name not in self.outcomes])
        ordered = [self.outcomes.get(host.name) or _abandoned(host) for host in self.hosts]
        if self.interrupted:
            raise RunInterrupted(ordered)
        if self.hook_error is not None:
            self.hook_error.outcomes = ordered
            raise self.hook_error
        return ordered

    def interrupt(self) -> bool:
        """A Ctrl-C: the first starts no new host and keeps waiting for those in progress (True); the second, also
        one that lands while the first is handled, abandons them and closes their connections (False)."""
        if self.interrupted:
            _abandon(self.running, self.live, self.outcomes)
            return False
        self.interrupted = True
        try:
            for conn in list(self.live.values()):   # a host still connecting makes no further attempt
                if isinstance(conn, HostConnection):
                    conn.stop_retrying()
            if self.hooks.interrupted is not None:   # work in progress stops at its next safe point
                self.hooks.interrupted()
            print(f"interrupted: no new host starts; waiting for the hosts in progress ({len(self.running)}); "
                  "Ctrl-C again stops waiting and closes their connections", file=sys.stderr)
        except KeyboardInterrupt:
            _abandon(self.running, self.live, self.outcomes)
            return False
        return True

    def shutdown(self) -> None:
        """The pool ended: waiting for the hosts in progress unless interrupted; a Ctrl-C meanwhile stops waiting."""
        while True:
            try:
                self.pool.shutdown(wait=not self.interrupted, cancel_futures=True)
                return
            except KeyboardInterrupt:
                self.interrupted = True


_MAX_FAIL = "--max-fail"    # stop[0] when the run's failure budget stopped it (the count is taken at the end)


def _abandon(running: dict, live: dict, outcomes: dict) -> None:
    """Second Ctrl-C: the hosts still in progress are recorded as interrupted and their connections closed,
    so that their commands end."""
    for host in running.values():
        outcomes.setdefault(host.name, _abandoned(host))
        conn = live.get(host.name)
        if conn is not None:
            conn.close()
    running.clear()


def _abandoned(host) -> Outcome:
    return Outcome(host, error=GpuprovError(
        "interrupted (Ctrl-C) while in progress: the host may be part-way through a step", host=host.name,
        hint="look at the host, then rerun: provisioning picks up from what the host has"))


def _internal_error(host, exc: BaseException) -> GpuprovError:
    """A gpuprov bug on one host, as that host's failure with the traceback for the report."""
    return GpuprovError(f"internal error: {type(exc).__name__}: {exc}", host=host.name,
                        output="".join(traceback.format_exception(exc)),
                        hint="this is a gpuprov bug: report it with the JSON report of this run")
