"""Batch planning for runs over many hosts: how a run groups its hosts (`BatchPlan`, built from the
command-line flags by `batch_plan()`) and what code driving a rolling change runs between the groups
(`BatchHooks`); the executor (gpuprov.core.executor.run_on_hosts) carries them out.

Ansible's `serial` (batches of N hosts, P% of the run's hosts or a list of sizes; a batch ends before the next
starts; `max_fail_percentage` judged per batch) or Salt's sliding window (`-b`: at most N or P% hosts in flight, a
new one starts as soon as one ends).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuprov.core.errors import InputError

if TYPE_CHECKING:
    from gpuprov.core.executor import Outcome


@dataclass(frozen=True)
class Size:
    """A batch or window size: `count` hosts, or `percent` of the run's hosts."""

    count: int | None = None
    percent: int | None = None

    def of(self, total: int) -> int:
        """Hosts in this size for a run of `total` hosts. A share is rounded down, and is at least 1 (Ansible's
        pct_to_int: `int(pct / 100 * hosts) or 1`; here in whole numbers, so 29% of 100 hosts is 29, not the
        28 that Ansible's floating point gives)."""
        if self.percent is not None:
            return self.percent * total // 100 or 1
        return self.count

    def __str__(self) -> str:
        return f"{self.percent}%" if self.percent is not None else str(self.count)


@dataclass(frozen=True)
class BatchPlan:
    """How a run groups its hosts (build it with `batch_plan()`, from the command-line flags).

    - `serial`: Ansible's batches. Sizes in order, the last one repeating for the hosts left; a share is of every
      host of the run. A batch ends (every host done) before the next starts. Empty: one batch of every host.
    - `window`: Salt's sliding window (`salt -b`): at most this many hosts in flight, a new host as soon as one ends.
    - `max_fail_percentage`: Ansible's: the run stops when MORE than this share of a batch failed (with a window:
      of the last `window` hosts to end, a window being the sliding batch). 0 stops at the first failure.
    """

    serial: tuple[Size, ...] = ()
    window: Size | None = None
    max_fail_percentage: float | None = None

    def batches(self, hosts: list) -> list[list]:
        """The hosts in their batches, in host order: one batch of all hosts with a window or without `serial`."""
        if self.window is not None or not self.serial:
            return [list(hosts)] if hosts else []
        groups: list[list] = []
        start = 0
        while start < len(hosts):
            size = self.serial[min(len(groups), len(self.serial) - 1)].of(len(hosts))
            groups.append(list(hosts[start:start + size]))
            start += size
        return groups

    def window_size(self, total: int) -> int | None:
        """Hosts in flight at most with a window (None without one)."""
        return None if self.window is None else self.window.of(total)


@dataclass(frozen=True)
class BatchHooks:
    """What code driving a rolling change runs between batches. All run on the calling thread, one at a time.

    - `before_batch(index, hosts)`: before the batch's first host starts (index from 1). With a window, every
      host is its own batch of one: called just before that host starts.
    - `after_batch(index, outcomes)`: once every host of the batch ended, with one Outcome per host of the batch
      (hosts the run stopped before starting are skipped Outcomes). With a window: after each host ends. Not
      called after Ctrl-C: the batch stays as the interruption left it.
    - `gate(outcomes)`: after each batch (with a window: after each host ends), with every Outcome so far in host
      order; a returned text stops the run: no new host starts and the rest are skipped Outcomes naming it.

    - `interrupted()`: once, on the first Ctrl-C (no new host starts): work in progress may stop at its next
      safe point instead of running to its end (a rollout stops waiting for jobs).

    A hook or gate that raises stops the run the same way (no hook is called after it: after a failed
    before_batch, that batch's hosts are skipped and its after_batch is not called); run_on_hosts then raises
    HookError, which carries every host's Outcome.
    """

    before_batch: Callable[[int, list], None] | None = None
    after_batch: Callable[[int, list[Outcome]], None] | None = None
    gate: Callable[[list[Outcome]], str | None] | None = None
    interrupted: Callable[[], None] | None = None


SERIAL_FLAG = "--serial"
WINDOW_FLAG = "--batch-window"
MAX_FAIL_PERCENTAGE_FLAG = "--max-fail-percentage"
_SIZE = re.compile(r"([0-9]+)(%?)")                        # ASCII digits only: "٣" or "²" are not sizes
_PERCENTAGE = re.compile(r"([0-9]+(?:\.[0-9]+)?)%?")


def parse_size(flag: str, text: str, whole: str | None = None) -> Size:
    """One size, `N` hosts (N >= 1) or `P%` (1 to 100) of the run's hosts; InputError naming the flag (and the
    item of the `whole` list) otherwise."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or int(match[1]) == 0 or (match[2] and int(match[1]) > 100):
        item = f"item {text!r}: " if whole is not None else ""
        raise InputError(f"{flag} {text if whole is None else whole!r}: {item}a size is a count of hosts like 5 "
                         "(at least 1) or a share like 20% (1% to 100%)", hint=f"give {flag} like 1, 10 or 25%"
                         + (" (or a comma list of them: 1,5,20%)" if flag == SERIAL_FLAG else ""))
    return Size(percent=int(match[1])) if match[2] else Size(count=int(match[1]))


def batch_plan(serial: str | None = None, window: str | None = None,
               max_fail_percentage: str | None = None) -> BatchPlan | None:
    """The batch plan the flags ask for, None when they ask for none: checked before any host is contacted.

    serial: `N`, `P%` or a comma list of them (`1,5,20%`: Ansible's `serial: [1, 5, "20%"]`); window: one size
    (Salt's `-b`); max_fail_percentage: 0 to 100, `%` optional (without serial or window: one batch of all hosts,
    as Ansible judges a play without serial). InputError (exit 2) naming the flag for anything else, and for
    serial and window together.
    """
    if serial is not None and window is not None:
        raise InputError(f"{SERIAL_FLAG} and {WINDOW_FLAG} were both given: batches or a sliding window, not both",
                         hint=f"keep one of {SERIAL_FLAG} (a batch ends before the next starts) and {WINDOW_FLAG} "
                              "(a new host starts as soon as one ends)")
    sizes = () if serial is None else tuple(parse_size(SERIAL_FLAG, item, str(serial) if "," in str(serial) else None)
                                            for item in str(serial).split(","))
    plan = BatchPlan(serial=sizes, window=None if window is None else parse_size(WINDOW_FLAG, str(window)),
                     max_fail_percentage=None if max_fail_percentage is None else _percentage(max_fail_percentage))
    return None if plan == BatchPlan() else plan


def _percentage(text: str) -> float:
    match = _PERCENTAGE.fullmatch(str(text).strip())
    if match is None or float(match[1]) > 100:
        raise InputError(f"{MAX_FAIL_PERCENTAGE_FLAG} {text!r}: give a share from 0 to 100 (like 25 "
                         "or 25%)", hint=f"{MAX_FAIL_PERCENTAGE_FLAG} 0 stops at the first failed host of a batch")
    return float(match[1])
