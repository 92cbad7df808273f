"""`invoke report`: the fleet report, one self-contained HTML file (inline CSS and SVG, no script, nothing fetched
from the network when opened) from the reports folder:

- the host x check matrix of each host's newest validate report, coloured pass/fail/warn/skip, hosts with a
  failure first (gpuprov.validation.matrix), and every failure with its reason;
- per GPU model (the fleet group: model, GPU or CPU, level), every host's matmul, copy and all-reduce figures
  against the catalog's expected figure (gpuprov.catalog.expected_figures) and the fleet median band (the median
  and the outlier margin around it, gpuprov.validation.fleet);
- each host's trend over the validate reports kept (status and figures, report by report);
- the last provision, harden (or harden --check) and rollout state of each host, from their reports and the
  rollout journals.

Everything read from the reports folder is data: the template autoescapes it, and only numbers computed here go
into SVG attributes. A file that is not JSON, not a report this page reads, or not of the shape its name says is
skipped with a warning naming it (shown on the page and returned to the caller), never an error.
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpuprov.core.errors import literal
from gpuprov.validation.matrix import CELLS, cells, checks, failed, failures, ordered

TEMPLATE = "fleet_report.html.j2"
MAX_BYTES = 64 << 20                 # a bigger file is no report gpuprov wrote
TEXT_CHARS = 2000                    # a reason, an error or a detail as the page shows it
TREND_RUNS = 30                      # validate reports per host in its trend
PERF = {                             # check -> figures drawn against the expected figure and the fleet
    "perf.matmul": ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops"),
    "perf.copy": ("d2d_gbs", "h2d_gbs", "d2h_gbs"),
    "perf.allreduce": ("busbw_gbs",),
}
EXPECTED_KEY = {"busbw_gbs": "allreduce_busbw_gbs"}   # a figure's key in catalog.expected_figures, where it differs
MAX_FIGURE = 1e9                     # TFLOP/s or GB/s beyond this is no measurement: left out, never drawn
OUTLIER_PCT = 10.0                   # the fleet band's margin when no report says (validate.outlier_pct's default)
HOST_STATUSES = ("pass", "fail", "warn", "partial", "error")
STAMPED = re.compile(r"(?P<kind>[a-z][a-z0-9-]*?)-(?P<stamp>\d{8}T\d{6}Z)(?:-\d+)?\.json")
JOURNAL = re.compile(r"rollout-journal-[0-9a-f]{8}-\d+\.json")
READ = ("validate", "provision", "harden", "harden-check", "rollout")
# reports of gpuprov's other jobs: known, and not what this page shows
OTHER = ("preflight", "images-run", "monitoring-deploy", "monitoring-server", "monitoring-targets", "health-deploy")
GOOD = ("changed", "unchanged", "checked", "resumed", "current", "done")   # provision, harden, rollout states
BAD = ("failed", "refused", "rolled back", "unknown")
BAR_W, BAR_H = 90, 14                # a figure's bullet chart in the performance tables
SPARK_W, SPARK_H = 120, 24           # a trend sparkline


class Skipped(ValueError):
    """A file is not a report this page reads; the message says why."""


@dataclass
class Report:
    """One report file read: its kind, when it was written (UTC epoch) and its host entries."""

    path: Path
    kind: str
    when: float
    hosts: list[dict]


@dataclass
class Loaded:
    """What the reports folder holds, read and checked."""

    folder: Path
    reports: list[Report] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def of(self, *kinds: str) -> list[Report]:
        """The reports of these kinds, oldest first."""
        return sorted((r for r in self.reports if r.kind in kinds), key=lambda r: (r.when, r.path.name))


# ------------------------------------------------------------------------------------------------ reading

def _text(value, chars: int = TEXT_CHARS) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= chars else text[:chars - 3] + "..."


def _number(value) -> float | None:
    """A finite number (never a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _positive(value) -> float | None:
    number = _number(value)
    return number if number is not None and number > 0 else None


def _stamp_epoch(stamp: str) -> float | None:
    """The UTC time a report's name carries (validate-20261203T095703Z.json), None for no such time."""
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _read_json(path: Path):
    try:
        if path.stat().st_size > MAX_BYTES:
            raise Skipped(f"larger than {MAX_BYTES >> 20} MiB")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise Skipped(f"cannot be read ({exc.__class__.__name__}: {exc})") from None
    except (ValueError, RecursionError) as exc:
        raise Skipped(f"not JSON ({exc})") from None


def _error(value) -> dict | None:
    """A host entry's error as the page shows it: its message and step."""
    if not value:
        return None
    if isinstance(value, dict):
        return {"error": _text(value.get("error") or "error"), "step": _text(value.get("step"), 200) or None}
    return {"error": _text(value), "step": None}


def _result(item) -> dict | None:
    if not isinstance(item, dict) or not isinstance(item.get("check"), str) or item.get("status") not in CELLS:
        return None
    figures = item.get("figures") if isinstance(item.get("figures"), dict) else {}
    thresholds = item.get("thresholds") if isinstance(item.get("thresholds"), dict) else {}
    return {"check": _text(item["check"], 200), "status": item["status"], "reason": _text(item.get("reason")),
            "figures": figures, "thresholds": thresholds}


def _validate_entry(item) -> dict | None:
    """A validate host entry, checked field by field; None when it has no host name."""
    if not isinstance(item, dict) or not isinstance(item.get("host"), str) or not item["host"]:
        return None
    results = [r for r in map(_result, item.get("results") if isinstance(item.get("results"), list) else [])
               if r is not None]
    error = _error(item.get("error"))
    status = item.get("status")
    if status not in HOST_STATUSES:
        from gpuprov.validation.host import host_status

        status = host_status(results, error)
    config = item.get("config") if isinstance(item.get("config"), dict) else {}
    expect = config.get("expect") if isinstance(config.get("expect"), dict) else {}
    versions = item.get("versions") if isinstance(item.get("versions"), dict) else {}
    fleet = item.get("fleet") if isinstance(item.get("fleet"), dict) else {}
    gpu = _text(item.get("gpu"), 100) if isinstance(item.get("gpu"), str) else None
    level = item.get("level") if isinstance(item.get("level"), str) else "quick"
    device = "GPU" if versions.get("cuda") and config.get("gpus_visible") else "CPU"
    group = fleet.get("group") if isinstance(fleet.get("group"), str) else f"{gpu or 'unknown GPU'} ({device}, {level})"
    margins = [_positive((r["thresholds"] or {}).get("max_below_fleet_median_pct")) for r in results
               if r["check"].startswith("fleet.")]
    count = expect.get("count")
    return {"host": _text(item["host"], 300), "status": status, "error": error, "results": results, "gpu": gpu,
            "group": _text(group, 200), "on_gpu": device == "GPU",
            "count": count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None,
            "nvswitch": expect.get("nvswitch") is True,
            "outlier_pct": next((m for m in margins if m is not None and m < 100), OUTLIER_PCT)}


def _entries(data, what: str) -> list:
    hosts = data.get("hosts") if isinstance(data, dict) else None
    if not isinstance(hosts, list):
        raise Skipped(f"not a {what} report (no list of hosts)")
    return hosts


def _validate_report(path: Path, data, when: float | None) -> Report:
    raw = _entries(data, "validate")
    if not all(isinstance(h, dict) and isinstance(h.get("results"), list) for h in raw):
        raise Skipped("not a validate report (a host without results)")
    hosts = [entry for entry in map(_validate_entry, raw) if entry is not None]
    if len(hosts) != len(raw):
        raise Skipped("not a validate report (a host entry without a host name)")
    when = _number(data.get("finished_epoch")) or _number(data.get("started")) or when
    return Report(path, "validate", when or path.stat().st_mtime, hosts)


def _state_entry(item, kind: str) -> dict | None:
    """A provision, harden or rollout host entry: its status, what it says and its error."""
    if not isinstance(item, dict) or not isinstance(item.get("host"), str) or not item["host"]:
        return None
    out = {"host": _text(item["host"], 300), "status": _text(item.get("status"), 40) or "unknown",
           "error": _error(item.get("error"))}
    if kind == "provision":
        stack = item.get("stack") if isinstance(item.get("stack"), dict) else {}
        driver = stack.get("driver") if isinstance(stack.get("driver"), dict) else {}
        out["detail"] = ", ".join(part for part in (
            f"driver {_text(driver.get('version'), 40)}" if driver.get("version") else "",
            f"lock {_text(item.get('lock'), 300)}" if item.get("lock") else "",
            f"reboot {_text(item.get('reboot'), 40)}" if item.get("reboot") else "") if part)
    elif kind.startswith("harden"):
        controls = item.get("controls") if isinstance(item.get("controls"), list) else []
        failing = [_text(c.get("id") or c.get("name"), 100) for c in controls
                   if isinstance(c, dict) and c.get("status") == "fail"]
        out["detail"] = ("failing controls: " + ", ".join(failing)) if failing else (
            f"{len(controls)} controls audited" if controls else "")
        if kind == "harden-check":
            out["detail"] = f"harden --check: {out['detail'] or 'audited'}"
        out["failing"] = bool(failing)
    else:
        out["status"] = _text(item.get("state") or item.get("status"), 40) or "unknown"
        out["detail"] = _text(" ".join(part for part in (
            f"{_text(item.get('from'), 100)} -> {_text(item.get('to'), 100)}" if item.get("to") else "",
            _text(item.get("reason"), 300)) if part))
    failing = out.pop("failing", False)
    out["tone"] = _tone(out["status"], out["error"] or failing)
    return out


def _tone(status: str, failed: object) -> str:
    """How a provision, harden or rollout state reads: good, bad (`failed`: an error or a failing control) or
    neutral (its badge's colour)."""
    if failed or status in BAD:
        return "bad"
    return "good" if status in GOOD else "neutral"


def _state_report(path: Path, data, kind: str, when: float | None) -> Report:
    raw = _entries(data, kind)
    hosts = [entry for entry in (_state_entry(item, kind) for item in raw) if entry is not None]
    if len(hosts) != len(raw):
        raise Skipped(f"not a {kind} report (a host entry without a host name)")
    return Report(path, "harden" if kind == "harden-check" else kind, when or path.stat().st_mtime, hosts)


def _journal(path: Path, data) -> Report:
    """A rollout journal: each host's state since when, as the newest word on its rollout."""
    hosts = data.get("hosts") if isinstance(data, dict) else None
    if not isinstance(hosts, dict) or not isinstance(data.get("run_id"), str):
        raise Skipped("not a rollout journal (no run_id and hosts)")
    entries, newest = [], 0.0
    for name, item in hosts.items():
        if not isinstance(name, str) or not name or not isinstance(item, dict):
            raise Skipped("not a rollout journal (a host without its state)")
        since = _number(item.get("since")) or 0.0
        newest = max(newest, since)
        entry = _state_entry({**item, "host": name, "reason": item.get("detail")}, "rollout")
        run = f"rollout {_text(data['run_id'], 40)}"
        entries.append({**entry, "detail": f"{run}: {entry['detail']}" if entry["detail"] else run})
    return Report(path, "rollout", newest or _number(data.get("updated")) or path.stat().st_mtime, entries)


def read_folder(folder: str | Path) -> Loaded:
    """Every report in `folder` this page reads; a file it cannot read or that is not what its name says is
    skipped with a warning naming it. `<kind>-latest.json` copies and the other jobs' reports are passed over."""
    loaded = Loaded(Path(folder))
    for path in sorted(Path(folder).glob("*.json")):
        name = path.name
        matched = STAMPED.fullmatch(name)
        if name.endswith("-latest.json") or (matched and matched["kind"] in OTHER):
            continue
        try:
            if not path.is_file():
                raise Skipped("not a regular file")
            data = _read_json(path)
            if JOURNAL.fullmatch(name):
                loaded.reports.append(_journal(path, data))
            elif matched and matched["kind"] in READ:
                when = _stamp_epoch(matched["stamp"])
                kind = matched["kind"]
                loaded.reports.append(_validate_report(path, data, when) if kind == "validate" else
                                      _state_report(path, data, kind, when))
            else:   # another name: a merged validate report (reports.merge --out), or foreign
                try:
                    loaded.reports.append(_validate_report(path, data, None))
                except Skipped:
                    raise Skipped("not a report gpuprov writes (validate, provision, harden, rollout)") from None
        except Skipped as why:
            loaded.warnings.append(f"{literal(str(path))}: skipped: {why}")
    return loaded


# ------------------------------------------------------------------------------------------- the page's data

def _when(epoch: float | None, shown: str = "%Y-%m-%d %H:%M UTC") -> str:
    """A report's time as the page shows it ("" for none, or one no calendar has)."""
    try:
        return datetime.fromtimestamp(epoch, UTC).strftime(shown) if epoch else ""
    except (OverflowError, ValueError, OSError):
        return ""


def _day(epoch: float) -> str:
    return _when(epoch, "%Y-%m-%d")


def latest_entries(loaded: Loaded) -> dict[str, dict]:
    """Each host's entry in its newest validate report (with `when`)."""
    out: dict[str, dict] = {}
    for report in loaded.of("validate"):
        for entry in report.hosts:
            out[entry["host"]] = {**entry, "when": report.when}
    return out


def _figures(entry: dict) -> dict[str, float]:
    """The host's perf figures drawn: {"perf.matmul.bf16_tflops": 712.4, ...}, finite positive numbers."""
    out = {}
    for result in entry["results"]:
        for name in PERF.get(result["check"], ()):
            value = _positive(result["figures"].get(name))
            if value is not None and value <= MAX_FIGURE:
                out[f"{result['check']}.{name}"] = value
    return out


def _expected(entry: dict) -> dict[str, float]:
    """The catalog's expected figure of each perf figure for the host's model, GPU count and NVSwitch
    (gpuprov.catalog.expected_figures); none for a host measured on the CPU or of a model the catalog lacks."""
    from gpuprov.catalog import expected_figures, find

    model = find(entry["gpu"]) if entry["gpu"] and entry["on_gpu"] else None
    if model is None:
        return {}
    figures = expected_figures(model, entry["count"], entry["nvswitch"])
    out = {}
    for check, names in PERF.items():
        for name in names:
            found = figures.get(EXPECTED_KEY.get(name, name))
            if found is not None:
                out[f"{check}.{name}"] = float(found.value)
    return out


def _bullet(value: float | None, expected: float | None, low: float, median: float, high: float,
            scale: float) -> dict:
    """The geometry of one figure's bullet chart (numbers only): the host's bar, the fleet band, the median and
    the expected figure as ticks."""
    def x(number: float) -> float:
        return round(min(number, scale) / scale * BAR_W, 1) if scale > 0 else 0.0

    return {"bar": x(value) if value is not None else None, "band_x": x(low), "band_w": round(x(high) - x(low), 1),
            "median": x(median), "expected": x(expected) if expected is not None else None,
            "below": value is not None and value < low}


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.4g}"


def perf_groups(latest: dict[str, dict]) -> list[dict]:
    """Per fleet group (GPU model, GPU or CPU, level): a column per perf figure any host has, with the fleet's
    median and band and the expected figure(s); a row per host with a bullet chart per figure."""
    groups: dict[str, list[dict]] = {}
    for entry in latest.values():
        if _figures(entry):
            groups.setdefault(entry["group"], []).append(entry)
    out = []
    for group, entries in sorted(groups.items()):
        figures = {entry["host"]: _figures(entry) for entry in entries}
        expected = {entry["host"]: _expected(entry) for entry in entries}
        pct = statistics.median(entry["outlier_pct"] for entry in entries)
        keys = [f"{check}.{name}" for check, names in PERF.items() for name in names
                if any(f"{check}.{name}" in found for found in figures.values())]
        columns = []
        for key in keys:
            values = [found[key] for found in figures.values() if key in found]
            median = statistics.median(values)
            low, high = median * (1 - pct / 100), median * (1 + pct / 100)
            wanted = sorted({found[key] for found in expected.values() if key in found})
            scale = max([*values, *wanted, high]) * 1.05
            columns.append({"key": key, "name": key.split(".", 2)[-1], "check": key.rsplit(".", 1)[0],
                            "median": _fmt(median), "low": _fmt(low), "high": _fmt(high),
                            "expected": ", ".join(map(_fmt, wanted)) or "none", "scale": scale,
                            "numbers": (low, median, high)})
        rows = []
        for entry in sorted(entries, key=lambda e: (not any(
                figures[e["host"]].get(c["key"], math.inf) < c["numbers"][0] for c in columns), e["host"])):
            bullets = []
            for column in columns:
                value = figures[entry["host"]].get(column["key"])
                low, median, high = column["numbers"]
                bullets.append({**_bullet(value, expected[entry["host"]].get(column["key"]), low, median, high,
                                          column["scale"]), "text": _fmt(value) or "-"})
            rows.append({"host": entry["host"], "cells": bullets})
        out.append({"group": group, "hosts": len(entries), "outlier_pct": _fmt(pct), "columns": columns,
                    "rows": rows})
    return out


def _spark(values: list[float | None]) -> dict | None:
    """A sparkline's polyline points (numbers only) over the runs, None where no run has the figure."""
    numbers = [v for v in values if v is not None]
    if not numbers:
        return None
    low, high = min(numbers), max(numbers)
    span = high - low or abs(high) or 1.0
    step = SPARK_W / max(len(values) - 1, 1)
    points = [(round(i * step, 1), round(SPARK_H - 2 - (v - low) / span * (SPARK_H - 4), 1))
              for i, v in enumerate(values) if v is not None]
    if len(points) == 1:
        points = [(0.0, points[0][1]), (float(SPARK_W), points[0][1])]
    return {"points": " ".join(f"{x},{y}" for x, y in points), "last": points[-1], "first": _fmt(numbers[0]),
            "latest": _fmt(numbers[-1]), "low": _fmt(low), "high": _fmt(high)}


def trends(loaded: Loaded) -> list[dict]:
    """Each host over its validate reports (the last TREND_RUNS): its status in each, and a sparkline of the first
    figure of each perf check (PERF) it measured (None for a check it never measured)."""
    runs: dict[str, list[tuple[float, dict]]] = {}
    for report in loaded.of("validate"):
        for entry in report.hosts:
            runs.setdefault(entry["host"], []).append((report.when, entry))
    out = []
    for host, found in runs.items():
        found = found[-TREND_RUNS:]
        figures = [_figures(entry) for _, entry in found]
        keys = [next((key for key in (f"{check}.{name}" for name in names) if any(key in f for f in figures)), None)
                for check, names in PERF.items()]   # each check's first figure the host has, a column each
        sparks = [{"name": key.rsplit(".", 1)[1], "key": key, "line": _spark([f.get(key) for f in figures])}
                  if key else None for key in keys]
        out.append({"host": host, "runs": len(found), "first": _day(found[0][0]), "last": _day(found[-1][0]),
                    "statuses": [{"status": entry["status"], "when": _when(when)} for when, entry in found],
                    "failed": found[-1][1]["status"] in ("fail", "error"), "sparks": sparks})
    return sorted(out, key=lambda t: (not t["failed"], t["host"]))


def operations(loaded: Loaded, hosts: list[str]) -> list[dict]:
    """Each host's last provision, harden and rollout state (newest report or journal that names it)."""
    state: dict[str, dict[str, dict]] = {}
    for kind in ("provision", "harden", "rollout"):
        for report in loaded.of(kind):
            for entry in report.hosts:
                state.setdefault(entry["host"], {})[kind] = {**entry, "when": _when(report.when),
                                                             "file": report.path.name}
    names = sorted(set(hosts) | set(state))
    return [{"host": name, **{kind: state.get(name, {}).get(kind) for kind in ("provision", "harden", "rollout")}}
            for name in names]


def page(loaded: Loaded, now: float | None = None) -> dict:
    """Everything the template shows."""
    latest = latest_entries(loaded)
    entries = ordered(list(latest.values()))
    names = checks(entries)
    matrix = [{"host": e["host"], "status": e["status"], "gpu": e["gpu"] or "", "when": _when(e["when"]),
               "failed": failed(e), "stopped": (e["error"] or {}).get("error") if not e["results"] else None,
               "cells": [{"check": name, "status": status or "none",
                          "reason": next((r["reason"] for r in e["results"] if r["check"] == name), "not run")}
                         for name, status in zip(names, cells(e, names), strict=True)]} for e in entries]
    counts = {status: sum(1 for e in entries if e["status"] == status) for status in HOST_STATUSES}
    return {"generated": _when(now or time.time()), "folder": str(loaded.folder), "checks": names, "matrix": matrix,
            "failures": [{"host": h, "check": c, "reason": r} for h, c, r in failures(entries)],
            "counts": counts, "hosts": len(entries), "reports": len(loaded.reports), "warnings": loaded.warnings,
            "perf": perf_groups(latest), "trends": trends(loaded), "perf_checks": list(PERF),
            "ops": operations(loaded, list(latest)),
            "bar": {"w": BAR_W, "h": BAR_H}, "spark": {"w": SPARK_W, "h": SPARK_H}}


@functools.cache
def _template():
    import jinja2

    environment = jinja2.Environment(loader=jinja2.PackageLoader("gpuprov", "templates"),
                                     undefined=jinja2.StrictUndefined, autoescape=True, trim_blocks=True,
                                     lstrip_blocks=True)
    return environment.get_template(TEMPLATE)


def render(loaded: Loaded, now: float | None = None) -> str:
    """The fleet report's HTML (gpuprov/templates/fleet_report.html.j2, autoescaped)."""
    text = _template().render(**page(loaded, now))
    return text.encode("utf-8", "replace").decode("utf-8")   # a lone surrogate in a report becomes "?"


def write_report(folder: str | Path, out: str | Path, now: float | None = None) -> tuple[Path, Loaded]:
    """Read `folder`, write the page to `out` (atomically); returns its path and what was read."""
    from gpuprov.core.report import replace_file

    loaded = read_folder(folder)
    return replace_file(out, render(loaded, now)), loaded
