"""Idle GPUs and what they cost: GPUs whose utilisation (DCGM_FI_DEV_GPU_UTIL) stayed under a threshold for the
whole window, measured from its start (a GPU first seen during the window is not called idle), with how long each
has been idle and the share of its host's cost per hour (the inventory's `cost.per_hour`) that pays for it."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.monitoring.query import Prometheus

METRIC = 'DCGM_FI_DEV_GPU_UTIL{job="gpuprov-dcgm"}'
LOOKBACK = "30d"     # how far back "idle since" is looked for
STEP = "1m"


@dataclass(frozen=True)
class IdleHost:
    """One host's idle GPUs."""

    host: str
    gpus: tuple[str, ...]
    gpu_count: int
    idle_hours: float                  # the shortest idle time of its idle GPUs
    cost_per_hour: float | None        # the host's whole cost per hour (inventory)
    currency: str

    @property
    def idle_cost_per_hour(self) -> float | None:
        """What the idle GPUs cost per hour: the host's cost times their share of its GPUs."""
        if self.cost_per_hour is None or not self.gpu_count:
            return None
        return self.cost_per_hour * len(self.gpus) / self.gpu_count

    @property
    def idle_cost(self) -> float | None:
        """What they have cost while idle."""
        rate = self.idle_cost_per_hour
        return None if rate is None else rate * self.idle_hours

    def to_dict(self) -> dict:
        return {"host": self.host, "gpus": list(self.gpus), "gpu_count": self.gpu_count,
                "idle_hours": round(self.idle_hours, 3), "cost_per_hour": self.cost_per_hour,
                "idle_cost_per_hour": _round(self.idle_cost_per_hour), "idle_cost": _round(self.idle_cost),
                "currency": self.currency}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def window(hours: float) -> str:
    """A PromQL duration of `hours` (whole seconds, at least one)."""
    return f"{max(1, round(hours * 3600))}s"


def idle_queries(hours: float, threshold_pct: float) -> dict[str, str]:
    """The queries, each per (host, gpu): a GPU whose series changed labels in the window (a driver upgrade, new
    target labels) counts once."""
    span = window(hours)
    measured = f"max by (host, gpu) (present_over_time({METRIC}[5m] offset {span}))"
    return {
        "idle": f"(max by (host, gpu) (max_over_time({METRIC}[{span}])) < {threshold_pct:g}) and on (host, gpu) "
                f"{measured}",
        "last_busy": f"time() - max by (host, gpu) "
                     f"(max_over_time(timestamp({METRIC} >= {threshold_pct:g})[{LOOKBACK}:{STEP}]))",
        "first_seen": f"time() - min by (host, gpu) (min_over_time(timestamp({METRIC})[{LOOKBACK}:{STEP}]))",
        "gpus": f"count by (host) (count by (host, gpu) ({METRIC}))",
    }


def find_idle(prom: Prometheus, hours: float, threshold_pct: float,
              costs: dict[str, tuple[float | None, str]]) -> list[IdleHost]:
    """The hosts with idle GPUs, most expensive idleness first; `costs`: {host: (cost per hour, currency)}."""
    queries = idle_queries(hours, threshold_pct)
    idle: dict[str, list[str]] = {}
    for row in prom.query(queries["idle"]):
        idle.setdefault(row["metric"].get("host", "?"), []).append(row["metric"].get("gpu", "?"))
    if not idle:
        return []
    since = {}
    for name in ("first_seen", "last_busy"):   # the last busy sample wins over the first sample
        since.update({(r["metric"].get("host"), r["metric"].get("gpu")): r["value"] for r in prom.query(queries[name])})
    counts = {row["metric"].get("host"): int(row["value"]) for row in prom.query(queries["gpus"])}
    found = []
    for host, gpus in idle.items():
        seconds = [since.get((host, gpu), hours * 3600) for gpu in gpus]
        cost, currency = costs.get(host, (None, "USD"))
        found.append(IdleHost(host, tuple(sorted(gpus, key=_gpu_order)), counts.get(host, len(gpus)),
                              max(hours, min(seconds) / 3600), cost, currency))
    return sorted(found, key=lambda h: (-(h.idle_cost or 0), -h.idle_hours, h.host))


def _gpu_order(gpu: str) -> tuple:
    return (0, int(gpu), "") if gpu.isdigit() else (1, 0, gpu)
