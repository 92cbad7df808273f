"""The fleet's host x check matrix, shared by validate's console output (past a handful of hosts) and the HTML
fleet report (gpuprov.validation.html_report): hosts with a failure first, then by name; every check any host
ran, by name; each failure (a failed check, a host whose validation stopped) with its reason.

Entries are validate report host entries (`host`, `status`, `error`, `results` of `check`/`status`/`reason`).
"""

from __future__ import annotations

import string

CELLS = ("pass", "fail", "warn", "skip")
GLYPHS = {"pass": ".", "fail": "F", "warn": "w", "skip": "-"}   # the console's cell for each status
LABELS = string.ascii_lowercase + string.ascii_uppercase
STOPPED = "validation"   # the failure's check name when a host's validation stopped (JUnit's errored case too)


def failed(entry: dict) -> bool:
    """The host failed a check, or its validation stopped."""
    return bool(entry.get("error")) or any(item.get("status") == "fail" for item in entry.get("results") or [])


def ordered(entries: list[dict]) -> list[dict]:
    """Hosts with a failure first, then by name."""
    return sorted(entries, key=lambda entry: (not failed(entry), str(entry.get("host"))))


def checks(entries: list[dict]) -> list[str]:
    """Every check any host ran, by name."""
    return sorted({str(item.get("check")) for entry in entries for item in entry.get("results") or []})


def cells(entry: dict, names: list[str]) -> list[str | None]:
    """The host's status of each check in `names` (None: not run)."""
    found = {str(item.get("check")): item.get("status") for item in entry.get("results") or []}
    return [found.get(name) if found.get(name) in CELLS else None for name in names]


def failures(entries: list[dict]) -> list[tuple[str, str, str]]:
    """(host, check, reason) of every failure, hosts in matrix order: a stopped validation (check `validation`,
    the error and its step) before the host's failed checks."""
    out = []
    for entry in ordered(entries):
        host = str(entry.get("host"))
        error = entry.get("error")
        if error:
            message = str(error.get("error") or "") if isinstance(error, dict) else str(error)
            step = error.get("step") if isinstance(error, dict) else None
            out.append((host, STOPPED, f"{message} (step {step})" if step else message))
        out += [(host, str(item.get("check")), str(item.get("reason") or ""))
                for item in entry.get("results") or [] if item.get("status") == "fail"]
    return out


def labels(count: int) -> list[str]:
    """Column labels of `count` checks: a..z, A..Z, then two letters (aa, ab, ...), all of one width."""
    width = 1
    while len(LABELS) ** width < count:
        width += 1
    out = []
    for index in range(count):
        label = ""
        for _ in range(width):
            index, digit = divmod(index, len(LABELS))
            label = LABELS[digit] + label
        out.append(label)
    return out
