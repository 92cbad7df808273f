"""Fleet outliers: every throughput figure of a host against the median of the same GPU model across the hosts
validated in this run and in recent validate reports. A host more than `outlier_pct` (10 % by default, the
inventory's validate.outlier_pct) below that median fails with both numbers, even when it is above its
datasheet threshold: the host that is 20 % slower than its identical neighbours.

Each host counts once: its figure from this run, else its newest figure in the recent reports; a host is never
its own peer, not even through its earlier reports. A verdict needs at least MIN_PEERS other hosts, so that no
single host (a liar, a broken one) moves the median far; with fewer the check is a skip (strict: a fail).
Figures are grouped by GPU model, by what measured them (GPU or CPU: the lab measures on CPU) and by suite level.
Only finite, positive numbers of the known figures count, from this run's checked documents
(gpuprov.validation.document) and from the reports.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

# check -> figures compared with the fleet (all of them higher is better)
FIGURES = {
    "perf.matmul": ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops"),   # fp32: measured on CPUs
    "perf.copy": ("d2d_gbs", "h2d_gbs", "d2h_gbs"),
    "perf.allreduce": ("busbw_gbs",),
    "infer.latency": ("b1_per_s", "b32_per_s"),
}
RECENT_DAYS = 7
RECENT_REPORTS = 50
MIN_PEERS = 3


@dataclass(frozen=True)
class Sample:
    """One host's figures: {"perf.matmul.bf16_tflops": 712.4, ...} in its group."""

    host: str
    group: str
    figures: dict
    when: float = 0.0


def group_of(gpu: str | None, versions: dict, gpus_visible: bool, level: str) -> str:
    """"H100-SXM (GPU, quick)": the model, what measured (a torch without CUDA measures on the CPU) and level."""
    device = "GPU" if versions.get("cuda") and gpus_visible else "CPU"
    return f"{gpu or 'unknown GPU'} ({device}, {level})"


def _figure(value) -> float | None:
    """A comparable figure: a finite, positive number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:   # an int too large for a float
        return None
    return number if math.isfinite(number) and number > 0 else None


def figures_of(results: list[dict]) -> dict[str, float]:
    """The comparable figures of a host's results: finite positive numbers only, keyed check.figure."""
    out: dict[str, float] = {}
    for result in results:
        figures = result.get("figures")
        if not isinstance(figures, dict):
            continue
        for name in FIGURES.get(result.get("check"), ()):
            value = _figure(figures.get(name))
            if value is not None:
                out[f"{result['check']}.{name}"] = value
    return out


def _report_figures(figures: dict) -> dict[str, float]:
    """The known figures of a report's fleet entry that are finite positive numbers."""
    known = {f"{check}.{name}" for check, names in FIGURES.items() for name in names}
    return {key: number for key, value in figures.items()
            if key in known and (number := _figure(value)) is not None}


def recent_samples(folder: str | Path, now: float | None = None, days: float = RECENT_DAYS,
                   limit: int = RECENT_REPORTS) -> list[Sample]:
    """Samples of the newest validate reports of the last `days` days (unreadable reports are passed over)."""
    now = time.time() if now is None else now
    paths = [p for p in Path(folder).glob("validate-*.json") if not p.name.endswith("-latest.json")]
    out: list[Sample] = []
    for path in sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)[:limit]:
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            when = report.get("finished_epoch") or path.stat().st_mtime
            hosts = report.get("hosts")
        except (OSError, ValueError, RecursionError, AttributeError):
            continue
        if _figure(when) is None or now - when > days * 86400 or not isinstance(hosts, list):
            continue
        for host in hosts:
            fleet = host.get("fleet") if isinstance(host, dict) else None
            if not isinstance(fleet, dict) or not isinstance(fleet.get("figures"), dict):
                continue
            figures = _report_figures(fleet["figures"])
            if figures and isinstance(fleet.get("group"), str) and isinstance(host.get("host"), str):
                out.append(Sample(host["host"], fleet["group"], figures, float(when)))
    return out


def peers(current: list[Sample], recent: list[Sample]) -> dict[str, dict[str, Sample]]:
    """{group: {host: sample}}: this run's sample of a host wins over its reports', a newer report over an
    older one."""
    out: dict[str, dict[str, Sample]] = {}
    for sample in sorted(recent, key=lambda s: s.when):
        out.setdefault(sample.group, {})[sample.host] = sample
    for sample in current:
        for group in out.values():
            group.pop(sample.host, None)
        out.setdefault(sample.group, {})[sample.host] = sample
    return out


def _fmt(value: float) -> str:
    """One decimal for GPU-sized figures (712.4), four significant digits for small ones (CPU: 0.02418)."""
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.4g}"


def _peers(count: int) -> str:
    return f"{count} other host" + ("s" if count != 1 else "")


def judge(sample: Sample, group: dict[str, Sample], outlier_pct: float, strict: bool = False) -> list[dict]:
    """One result per compared check (`fleet.perf.matmul`, ...) for a host of this run, each figure against
    the median of its peers (the group's other hosts: a host is never its own peer), when it has at least
    MIN_PEERS of them."""
    results = []
    checks: dict[str, list[str]] = {}
    for key in sample.figures:
        check, name = key.rsplit(".", 1)
        checks.setdefault(check, []).append(name)
    for check, names in checks.items():
        failures, within, figures = [], [], {}
        compared = most = 0
        for name in names:
            key = f"{check}.{name}"
            values = [s.figures[key] for s in group.values()
                      if s.host != sample.host and isinstance(s.figures.get(key), int | float)]
            value = sample.figures[key]
            figures[name] = value
            most = max(most, len(values))
            if len(values) < MIN_PEERS:
                continue
            compared = max(compared, len(values))
            median = statistics.median(values)
            figures[f"{name}_fleet_median"] = median
            below = (median - value) / median * 100
            text = (f"{name} {_fmt(value)} is {below:.1f}% below the fleet median {_fmt(median)} of "
                    f"{_peers(len(values))}")
            if below > outlier_pct:
                failures.append(text)
            else:
                within.append(f"{name} {_fmt(value)} (median {_fmt(median)})")
        thresholds = {"max_below_fleet_median_pct": outlier_pct, "hosts": compared, "min_hosts": MIN_PEERS}
        if failures:
            status, reason = "fail", "; ".join(failures) + f" (more than {outlier_pct:g}% below: an outlier among "\
                                                           f"{sample.group} hosts)"
        elif within:
            status, reason = "pass", f"within {outlier_pct:g}% of the fleet median of {_peers(compared)} " \
                                     f"({sample.group}): " + ", ".join(within)
        else:
            thresholds["hosts"] = most
            others = f"only {most}" if most else "no"
            status, reason = "skip", f"{others} other {sample.group} host{'s' if most > 1 else ''} to compare " \
                                     f"with, at least {MIN_PEERS} needed (this run and validate reports of the last " \
                                     f"{RECENT_DAYS} days)"
        if strict and status == "skip":
            status, reason = "fail", f"strict: {reason}"
        results.append({"check": f"fleet.{check}", "status": status, "reason": reason, "figures": figures,
                        "thresholds": thresholds, "seconds": 0.0})
    return results


def outliers(current: list[Sample], recent: list[Sample], outlier_pct: dict[str, float],
             strict: bool = False) -> dict[str, list[dict]]:
    """{host: fleet results} for this run's hosts; `outlier_pct` per host."""
    groups = peers(current, recent)
    return {s.host: judge(s, groups[s.group], outlier_pct[s.host], strict) for s in current}
