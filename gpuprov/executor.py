"""A bounded pool of SSH connections: at most `parallel` hosts at once, each over one connection.

Fabric's ThreadingGroup starts one thread per host with no cap or timeout; fleets need a cap, connect and
command timeouts, and a failure budget (`max_fail`) after which no new host is started.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov.connection import HostConnection
from gpuprov.errors import GpuprovError, InputError


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
    extra: dict = field(default_factory=dict)

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


def connect(host, settings: Settings, jump=None) -> HostConnection:
    """A HostConnection (not yet open) for a host with the run's settings and its sudo password."""
    conn = HostConnection(host, known_hosts=settings.known_hosts, trust_new=settings.trust_new,
                          connect_timeout=settings.connect_timeout, retries=settings.connect_retries,
                          command_timeout=settings.command_timeout, jump=jump)
    conn.set_sudo_password(sudo_password(host))
    return conn


def run_on_hosts(hosts: list, work: Callable[[HostConnection], Any], settings: Settings, *,
                 jump_of: Callable[[Any], Any] = lambda host: None,
                 on_event: Callable[[Any, str], None] = lambda host, event: None) -> list[Outcome]:
    """Run `work(connection)` on every host, at most `settings.parallel` at once; outcomes in host order.

    on_event(host, event) is called with "start", "ok", "failed" or "skipped" for progress displays.
    """
    budget = failure_budget(settings.max_fail, len(hosts))
    outcomes: dict[str, Outcome] = {}
    failed = 0
    pending = list(hosts)
    running: dict = {}

    def one(host) -> Outcome:
        started = time.monotonic()
        try:
            conn = connect(host, settings, jump=jump_of(host))
        except GpuprovError as exc:
            return Outcome(host, error=exc, duration=time.monotonic() - started)
        try:
            conn.open()
            return Outcome(host, value=work(conn), duration=time.monotonic() - started)
        except GpuprovError as exc:
            return Outcome(host, error=exc, duration=time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - one host's bug must not stop the others
            error = GpuprovError(f"internal error: {type(exc).__name__}: {exc}", host=host.name,
                                 output=traceback.format_exc(),
                                 hint="this is a gpuprov bug: report it with the JSON report of this run")
            return Outcome(host, error=error, duration=time.monotonic() - started)
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=max(1, min(settings.parallel, len(hosts) or 1))) as pool:
        while pending or running:
            while pending and len(running) < settings.parallel and failed <= budget:
                host = pending.pop(0)
                on_event(host, "start")
                running[pool.submit(one, host)] = host
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                host = running.pop(future)
                outcome = future.result()
                outcomes[host.name] = outcome
                if outcome.error is not None:
                    failed += 1
                on_event(host, "ok" if outcome.ok else "failed")
        for host in pending:
            outcomes[host.name] = Outcome(host, skipped=True, error=GpuprovError(
                f"not started: {failed} hosts failed, more than --max-fail {settings.max_fail} allows",
                host=host.name, hint="fix the failed hosts, then rerun"))
            on_event(host, "skipped")
    return [outcomes[host.name] for host in hosts]
