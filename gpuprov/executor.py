"""A bounded pool of SSH connections: at most `parallel` hosts at once, each over one connection.

Fabric's ThreadingGroup starts one thread per host with no cap or timeout; fleets need a cap, connect and
command timeouts, and a failure budget (`max_fail`) after which no new host is started. Every host gets an
Outcome, whatever happens: a host's error or gpuprov bug is that host's failure, and Ctrl-C stops the run
with the outcomes so far (`RunInterrupted`), so that the caller can still write its report.
"""

from __future__ import annotations

import getpass
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov.connection import HostConnection
from gpuprov.errors import GpuprovError, InputError
from gpuprov.known_hosts import KnownHosts, read_known_hosts


@dataclass(frozen=True)
class Settings:
    """How to reach hosts: host keys, timeouts, retries, parallelism, failure budget."""

    known_hosts: Path
    trust_new: bool = False
    parallel: int = 32
    connect_timeout: int = 10
    connect_retries: int = 2
    command_timeout: int = 1800
    max_fail: str | None = None


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


def run_on_hosts(hosts: list, work: Callable[[HostConnection], Any], settings: Settings, *,
                 jump_of: Callable[[Any], Any] = lambda host: None,
                 on_event: Callable[[Any, str], None] = lambda host, event: None) -> list[Outcome]:
    """Run `work(connection)` on every host, at most `settings.parallel` at once; outcomes in host order.

    The known_hosts file and --max-fail are checked before any host is contacted (InputError). on_event(host,
    event) is called with "start", "ok", "failed" or "skipped" for progress displays. Ctrl-C starts no new
    host and waits for the hosts in progress; a second Ctrl-C closes their connections and stops waiting.
    Either way RunInterrupted carries every host's outcome.
    """
    budget = failure_budget(settings.max_fail, len(hosts))
    known_hosts = read_known_hosts(settings.known_hosts)
    outcomes: dict[str, Outcome] = {}
    live: dict[str, HostConnection] = {}
    failed = 0
    pending = list(hosts)
    running: dict = {}
    interrupted = False

    def one(host) -> Outcome:
        started = time.monotonic()
        conn = None
        try:
            conn = live[host.name] = connect(host, settings, known_hosts, jump=jump_of(host))
            conn.open()
            return Outcome(host, value=work(conn), duration=time.monotonic() - started)
        except GpuprovError as exc:
            return Outcome(host, error=exc, duration=time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - one host's bug must not stop the others
            return Outcome(host, error=_internal_error(host, exc), duration=time.monotonic() - started)
        finally:
            live.pop(host.name, None)
            if conn is not None:
                conn.close()

    def finish(future, host) -> None:
        nonlocal failed
        try:
            outcome = future.result()
        except BaseException as exc:  # noqa: BLE001 - even SystemExit in a worker is that host's failure
            outcome = Outcome(host, error=_internal_error(host, exc))
        outcomes[host.name] = outcome
        if outcome.error is not None:
            failed += 1
        on_event(host, "ok" if outcome.ok else "failed")

    pool = ThreadPoolExecutor(max_workers=max(1, min(settings.parallel, len(hosts) or 1)))
    try:
        while pending or running:
            try:
                while pending and not interrupted and len(running) < settings.parallel and failed <= budget:
                    host = pending.pop(0)
                    on_event(host, "start")
                    running[pool.submit(one, host)] = host
                if not running:
                    break
                # a timeout, so that Ctrl-C is seen even when a worker thread took the signal
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    finish(future, running.pop(future))
            except KeyboardInterrupt:
                if interrupted:
                    _abandon(running, live, outcomes)
                    break
                interrupted = True
                print(f"interrupted: no new host starts; waiting for the hosts in progress ({len(running)}); "
                      "Ctrl-C again stops waiting and closes their connections", file=sys.stderr)
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
    reason = "interrupted (Ctrl-C)" if interrupted else (
        f"{failed} hosts failed, more than --max-fail {settings.max_fail} allows")
    for host in pending:
        outcomes[host.name] = Outcome(host, skipped=True, error=GpuprovError(
            f"not started: {reason}", host=host.name,
            hint="rerun on the hosts that were not started" if interrupted else "fix the failed hosts, then rerun"))
        on_event(host, "skipped")
    ordered = [outcomes.get(host.name) or _abandoned(host) for host in hosts]
    if interrupted:
        raise RunInterrupted(ordered)
    return ordered


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
