"""How a rollout is seen from outside: `rollout --status` (where each host is and why it waits, from the journal)
and each host's Prometheus textfile (`gpuprov_rollout_state`, one series per state, 1 for the state it is in), which
node_exporter's textfile collector exposes to the monitoring dashboard.
"""

from __future__ import annotations

import calendar
import time

from gpuprov.core.errors import GpuprovError, literal
from gpuprov.rollout.journal import FINAL, STATES, Journal
from gpuprov.rollout.scheduler import left_text

METRIC_FILE = "gpuprov_rollout.prom"


def metric_text(run_id: str, state: str, timestamp: float) -> str:
    """The host's textfile, written through prometheus_client: the rollout state as an enum-style gauge (one
    series per state, 1 for the state it is in) and when it was entered."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry(auto_describe=True)
    states = Gauge("gpuprov_rollout_state", "The host's state in the gpuprov rollout (1: the state it is in).",
                   ("run", "state"), registry=registry)
    for name in STATES:
        states.labels(run_id, name).set(1 if name == state else 0)
    Gauge("gpuprov_rollout_state_since_seconds", "When the host entered its rollout state (Unix time).", ("run",),
          registry=registry).labels(run_id).set(round(timestamp))
    return generate_latest(registry).decode("utf-8")


def place_metric(conn, text: str) -> str | None:
    """Write the textfile into the host's node_exporter folder (validate.textfile_dir); the problem, or None."""
    from gpuprov.validation.host import publish_textfile
    from gpuprov.validation.suite_config import validate_vars

    folder = validate_vars(conn.host).textfile_dir
    try:
        publish_textfile(conn, text, folder, METRIC_FILE)
    except GpuprovError as exc:
        return f"rollout textfile not placed in {folder}: {exc.message.splitlines()[0]}"
    return None


def status_lines(journal: Journal, now: float | None = None) -> list[str]:
    """Where each host is and why it waits: one line per host, then the run's own state."""
    now = time.time() if now is None else now
    data = journal.data
    lines = [f"rollout {journal.run_id} ({data.get('status', '?')}), started {data.get('started', '?')}, "
             f"journal {journal.path}"]
    for name, entry in sorted(journal.hosts.items()):
        lines.append(f"{name}: {_host_line(entry, now)}")
    if data.get("message"):
        lines.append(data["message"])
    counts: dict[str, int] = {}
    for entry in journal.hosts.values():
        counts[entry.get("state", "selected")] = counts.get(entry.get("state", "selected"), 0) + 1
    done = sum(counts.get(state, 0) for state in FINAL)
    lines.append(f"{done} of {len(journal.hosts)} hosts done: "
                 + ", ".join(f"{count} {state}" for state, count in sorted(counts.items())))
    return [literal(line) for line in lines]


def _host_line(entry: dict, now: float) -> str:
    state = entry.get("state", "selected")
    since = entry.get("since", "")
    jobs = entry.get("jobs") or []
    if state in ("draining", "skipped") and jobs:
        seen = _epoch(entry.get("seen") or since)
        waits = ", ".join(_job_text(job, now - seen if seen else 0) for job in jobs)
        verb = "waits for" if state == "draining" else "skipped, still running"
        return f"{verb} {waits}" + (f" (seen {entry.get('seen')})" if entry.get("seen") else "")
    detail = entry.get("detail") or ""
    return f"{state} since {since}" + (f": {detail}" if detail else "")


def _job_text(job: dict, elapsed: float) -> str:
    left = job.get("time_left_s")
    left = None if left is None else int(left - elapsed)
    return f"job {job.get('id')} ({job.get('user')}, {left_text(left)})"


def _epoch(stamp: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return 0.0
