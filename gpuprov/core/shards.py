"""A fleet run split past one controller: `--shard K/N` picks the K-th of N shards of the selected hosts, each run
anywhere (a Slurm job array, a CI matrix, a Kubernetes Indexed Job); `invoke reports.merge` joins their reports.
And the controller's budget before a large run: open files and memory per host.

The split is round-robin over the selected hosts sorted by name: host i of the sorted list goes to shard i mod N + 1.
It depends only on the selected names, never on their order in the inventory; the shards' sizes differ by at most one
(the slowest shard sets the run's time), and with at least N hosts no shard is empty. Every shard must select the
same hosts (the same inventory and --host/--group/--all): the report records the selection's size and digest, so
that `reports.merge` refuses shards of different selections.
"""

from __future__ import annotations

import hashlib
import re
import resource
from dataclasses import dataclass

from gpuprov.core.errors import InputError, literal
from gpuprov.core.open_files import FDS_MARGIN, FDS_PER_HOST

_SHARD = re.compile(r"([0-9]+)/([0-9]+)")
MAX_SHARDS = 100_000

# Memory one host takes on the controller. tests/unit/test_shards.py measures real paramiko connections to a local SSH
# server, each having run a command and still open (as in the pool): about 50 KiB traced (tracemalloc) and 150 KiB
# resident (RSS) each. 1 MiB per host in flight leaves room for a host's work holding two connections (harden's
# fresh()), its command's output held in memory, and the C side (OpenSSL, the transport thread's stack) that
# tracemalloc does not see. A host's record (its report entry: a validate entry keeps up to 64 KiB of a stopped
# host's output) stays for the whole run: 256 KiB.
MEMORY_PER_CONNECTION = 1024 * 1024
MEMORY_PER_RECORD = 256 * 1024
MEMORY_SHARE = 0.5     # a run may take this share of the memory available when it starts


@dataclass(frozen=True)
class Shard:
    """The `index`-th (1-based) of `count` shards."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(value: str | None) -> Shard | None:
    """`--shard K/N` (1 <= K <= N); None without it. InputError (exit 2) naming --shard otherwise."""
    if value is None:
        return None
    text = str(value).strip()
    match = _SHARD.fullmatch(text) if text.isascii() else None
    hint = "give --shard K/N with whole numbers 1 <= K <= N: the K-th of N shards (1/4, 2/4, 3/4, 4/4)"
    if match is None:
        raise InputError(f"--shard {literal(repr(value))} is not K/N", step="select hosts", hint=hint)
    index, count = int(match[1]), int(match[2])
    if not 1 <= index <= count or count > MAX_SHARDS:
        raise InputError(f"--shard {text}: K must be from 1 to N (N at most {MAX_SHARDS})", step="select hosts",
                         hint=hint)
    return Shard(index, count)


def shard_names(names, shard: Shard) -> set[str]:
    """The names of `shard`: round-robin over the names sorted."""
    return {name for position, name in enumerate(sorted(names)) if position % shard.count == shard.index - 1}


def shard_hosts(hosts: list, shard: Shard) -> list:
    """The hosts of `shard`, in their given order (shard_names). InputError when the shard has no host (fewer hosts
    than shards)."""
    order = [h.name for h in hosts]
    mine = shard_names(order, shard)
    if not mine:
        raise InputError(f"--shard {shard}: the selection has {len(order)} hosts, so shard {shard.index} of "
                         f"{shard.count} has none", step="select hosts",
                         hint=f"split into at most {len(order)} shards")
    return [h for h in hosts if h.name in mine]


def selection_digest(names) -> str:
    """A digest of the selected names whatever their order: shards of one run have the same one."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def shard_record(shard: Shard, selected: list) -> dict:
    """The report's `shard` field: which shard, of how many hosts selected, and the selection's digest."""
    names = [h.name for h in selected]
    return {"index": shard.index, "count": shard.count, "selected": len(names),
            "selection": selection_digest(names)}


# --------------------------------------------------------------------------------------------- the budget

def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes (the kernel's estimate of what can be used without swapping); None where there is
    no such file (not Linux)."""
    try:
        with open(meminfo, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_budget(hosts: int, parallel: int, available: int | None, *,
                  per_connection: int = MEMORY_PER_CONNECTION, per_record: int = MEMORY_PER_RECORD,
                  share: float = MEMORY_SHARE) -> str | None:
    """A warning when `hosts` (records kept for the whole run), `parallel` of them connected at once, would take
    more than `share` of the `available` memory; None when they fit or nothing is known."""
    if available is None:
        return None
    at_once = min(hosts, parallel)
    need = at_once * per_connection + hosts * per_record
    if need <= share * available:
        return None
    fits = max(0, int((share * available - hosts * per_record) // per_connection))
    return (f"memory: {hosts} hosts, {at_once} at once, need about {need / 2**20:.0f} MiB on this controller "
            f"({per_connection / 2**20:.1f} MiB per host in flight, {per_record / 2**10:.0f} KiB per host's record), "
            f"more than {share:.0%} of the {available / 2**20:.0f} MiB available: lower --parallel (to {fits} or "
            "less) or split the run with --shard K/N")


def open_files_budget(parallel: int, hard: int, in_use: int, *, per_host: int = FDS_PER_HOST,
                      margin: int = FDS_MARGIN) -> str | None:
    """A warning when `parallel` hosts need more descriptors than even the hard limit allows (the pool will then
    run fewer at once, gpuprov.core.open_files); None when the soft limit fits them or can be raised to."""
    need = in_use + margin + parallel * per_host
    if hard == resource.RLIM_INFINITY or need <= hard:
        return None
    fits = max(0, (hard - in_use - margin) // per_host)
    return (f"open files: {parallel} hosts at once need about {need} descriptors, over the hard limit {hard}: "
            f"the run will work on {fits} at once; raise the hard limit (ulimit -Hn, LimitNOFILE=) or split the run "
            "with --shard K/N")


def budget_notices(hosts: int, parallel: int) -> list[str]:
    """The controller's budget for a run of `hosts` hosts, `parallel` at once: the warnings of memory_budget and
    open_files_budget with this machine's numbers (MemAvailable, RLIMIT_NOFILE, descriptors open now)."""
    from gpuprov.core.open_files import _open_descriptors

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    notes = [memory_budget(hosts, parallel, available_memory()),
             open_files_budget(min(hosts, parallel), hard, _open_descriptors())]
    return [note for note in notes if note]
