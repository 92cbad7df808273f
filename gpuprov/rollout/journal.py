"""A rollout's journal: one JSON file per rollout in the reports folder, each host's state written (atomically,
fsynced) before the state's action is taken, so that a rerun with the same arguments resumes where the last one
stopped and `rollout --status` can say where each host is and why it waits.

    reports/rollout-journal-<run id>.json
    {"run_id", "arguments", "status": running|blocked|stopped|interrupted|complete, "started", "updated",
     "message", "hosts": {name: {"state", "since", "detail", "from", "to", "drained_by_us", "jobs", "history"}}}

The run id is the arguments' digest and a sequence number: a rerun with the same arguments takes the newest
journal of that digest unless it is complete; a complete one starts the next number.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from gpuprov.core.errors import InputError, literal

# the per-host state machine (issue 20): every state a host can be in, in order
STATES = ("selected", "draining", "drained", "upgrading", "rebooting", "validating", "resumed", "failed",
          "skipped", "current")
# the states a host ends in: resumed (upgraded, validated, back in service), failed (left drained; a rerun tries
# it again), current (already on the target stack). A skipped host (busy past --wait-jobs, drained by someone else,
# down) is not done: a rerun takes it up again.
FINAL = ("resumed", "failed", "current")
PREFIX = "rollout-journal-"


def arguments_digest(arguments: dict) -> str:
    """The digest of what a rollout was asked: the same arguments give the same digest (and so resume)."""
    return hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:8]


class Journal:
    """One rollout's journal file; `transition` writes before the caller acts. Thread-safe (hosts of one batch
    move at once)."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data
        self._lock = threading.Lock()

    @property
    def run_id(self) -> str:
        return self.data["run_id"]

    @property
    def hosts(self) -> dict[str, dict]:
        return self.data["hosts"]

    def host(self, name: str) -> dict:
        return self.hosts.get(name) or {"state": "selected", "history": []}

    def transition(self, name: str, state: str, detail: str = "", **fields) -> None:
        """Record `state` for host `name` (with `detail` and other fields), then write the journal."""
        if state not in STATES:
            raise ValueError(f"unknown rollout state {state!r}")
        now = _now()
        with self._lock:
            entry = self.hosts.setdefault(name, {"state": "selected", "history": []})
            entry.update(fields)
            entry.update(state=state, since=now, detail=detail)
            entry["history"].append({"state": state, "at": now, "detail": detail})
            self._write()

    def note(self, name: str, **fields) -> None:
        """Update a host's fields without a state change (the jobs it waits for)."""
        with self._lock:
            self.hosts.setdefault(name, {"state": "selected", "history": []}).update(fields)
            self._write()

    def set_status(self, status: str, message: str = "") -> None:
        with self._lock:
            self.data.update(status=status, message=message)
            self._write()

    def _write(self) -> None:
        self.data["updated"] = _now()
        text = json.dumps(self.data, indent=2, sort_keys=False)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def open_journal(reports: Path, arguments: dict, hosts: list[str], *, dry_run: bool = False) -> Journal:
    """The journal a run with `arguments` continues, or a new one (not written in a dry run)."""
    digest = arguments_digest(arguments)
    latest = newest(reports, digest)
    if latest is not None and latest.data.get("status") != "complete":
        for name in hosts:
            latest.hosts.setdefault(name, {"state": "selected", "history": []})
        return latest
    number = 1 if latest is None else int(latest.run_id.rsplit("-", 1)[1]) + 1
    run_id = f"{digest}-{number}"
    data = {"run_id": run_id, "arguments": arguments, "status": "running", "message": "", "started": _now(),
            "updated": _now(), "hosts": {name: {"state": "selected", "since": _now(), "detail": "", "history": []}
                                         for name in hosts}}
    journal = Journal(reports / f"{PREFIX}{run_id}.json", data)
    if not dry_run:
        reports.mkdir(parents=True, exist_ok=True)
        with journal._lock:
            journal._write()
    return journal


def newest(reports: Path, digest: str | None = None) -> Journal | None:
    """The newest journal (of arguments `digest`, when given) in `reports`, by its sequence number and start."""
    found = []
    for path in reports.glob(f"{PREFIX}*-*.json"):
        stem = path.name[len(PREFIX):-len(".json")]
        head, _, number = stem.rpartition("-")
        if not number.isdigit() or len(head) != 8 or (digest is not None and head != digest):
            continue
        found.append((path, int(number)))
    for path, _number in sorted(found, key=lambda item: (_started(item[0]), item[1]), reverse=True):
        return load(path)
    return None


def load(path: Path) -> Journal:
    """A journal from its file; InputError naming the file when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{literal(str(path))}: not a readable rollout journal: {exc}", step="rollout.journal",
                         hint="move the file away; a rerun then starts a new rollout") from None
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict) or "run_id" not in data:
        raise InputError(f"{literal(str(path))}: not a rollout journal (no run_id or hosts)", step="rollout.journal",
                         hint="move the file away; a rerun then starts a new rollout")
    return Journal(path, data)


def _started(path: Path) -> str:
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("started", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
