"""The Grafana dashboard "gpuprov GPU fleet", built with grafanalib from the metrics of the monitoring contract:
dcgm-exporter's DCGM_FI_DEV_* (job gpuprov-dcgm) and gpuprov's textfiles (job gpuprov-node). The model is shipped
in the package as gpuprov/monitoring/grafana/gpu-fleet.json (`python -m gpuprov.monitoring.dashboard PATH`
or `invoke monitoring.dashboard --out PATH` writes it). Every query filters
with `host=~"$host"`; `concrete` turns a query into one Prometheus answers outside Grafana.
grafanalib is imported inside the functions: importing this module stays cheap for the tasks."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from gpuprov.core.errors import GpuprovError

UID = "gpuprov-gpu-fleet"
TITLE = "gpuprov GPU fleet"
SCHEMA_VERSION = 39           # Grafana 10.4's; the panels are the Grafana 8+ kinds (timeseries, stat, table)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
HOST_QUERY = 'label_values(up{job="gpuprov-node"}, host)'
WIDTH = 24                    # Grafana's grid columns

HOST = 'host=~"$host"'
DCGM = f'job="gpuprov-dcgm", {HOST}'
GPU = "{{host}} GPU {{gpu}}"
IDLE_PCT = 5                  # GpuprovGpuIdle's line: the highest utilisation of an idle GPU over IDLE_WINDOW
IDLE_WINDOW = "6h"
VALIDATION_STALE_S = 8 * 86400
DRIFT_STALE_S = 20 * 60
# NVML's clocks event reasons (nvmlClocksEventReason*), the bits of DCGM_FI_DEV_CLOCKS_EVENT_REASONS
CLOCK_EVENT_BITS = {"SW power cap": 0x4, "HW slowdown": 0x8, "SW thermal slowdown": 0x20,
                    "HW thermal slowdown": 0x40, "HW power brake": 0x80}

GPU_UTIL = f"DCGM_FI_DEV_GPU_UTIL{{{DCGM}}}"
FB_USED = f"DCGM_FI_DEV_FB_USED{{{DCGM}}}"
FB_FREE = f"DCGM_FI_DEV_FB_FREE{{{DCGM}}}"
IDLE_GPUS = f"max_over_time({GPU_UTIL}[{IDLE_WINDOW}]) < {IDLE_PCT}"
IDLE_SHARE = f"(count by (host) ({IDLE_GPUS}) or count by (host) ({GPU_UTIL}) * 0) / count by (host) ({GPU_UTIL})"
ROLLOUT_OUT = f'gpuprov_rollout_state{{{HOST}, state=~"draining|drained|upgrading|rebooting|validating|failed"}}'
IDLE_COST = f"max by (host, currency) (gpuprov_cost_per_hour{{{HOST}}}) * on (host) group_left () ({IDLE_SHARE})"

# what `concrete` puts in place of each template variable
CONCRETE = {"host": ".*", "group": ".*", "__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)")
Sized = tuple[Any, int]       # a grafanalib panel and its width in grid columns


def build_dashboard() -> dict:
    """The dashboard's JSON model, as grafanalib's DashboardEncoder writes it."""
    from grafanalib._gen import DashboardEncoder
    from grafanalib.core import Dashboard, Template, Templating, Time

    variables = [
        Template(name="datasource", label="Data source", type="datasource", query="prometheus"),
        Template(name="host", label="Host", query=HOST_QUERY, dataSource=DATASOURCE, multi=True, includeAll=True,
                 allValue=".*", default="$__all"),
    ]
    dashboard = Dashboard(
        title=TITLE, uid=UID, tags=["gpuprov"], timezone="browser", refresh="1m", graphTooltip=1,
        description="GPU health, validation, drift and idle cost of the hosts gpuprov monitors",
        time=Time("now-24h", "now"), schemaVersion=SCHEMA_VERSION, templating=Templating(list=variables),
        panels=_layout(_rows()),
    ).auto_panel_ids()
    return json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))


def dashboard_json() -> str:
    """The model as shipped: indented, keys sorted, one final newline."""
    return json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n"


def write_dashboard(path: Path | str) -> None:
    Path(path).write_text(dashboard_json())


def panel_queries(model: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every query of the model, panels of collapsed rows included."""
    queries = []
    for panel in model.get("panels", []):
        if panel.get("type") == "row":
            queries += panel_queries(panel)
        queries += [(panel["title"], target["expr"]) for target in panel.get("targets", []) if target.get("expr")]
    return queries


def concrete(expr: str) -> str:
    """A panel's query with its template variables replaced (every host, 1m rate interval, a 1h range), for
    sending to Prometheus itself."""

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in CONCRETE:
            raise GpuprovError(f"unknown dashboard variable ${name} in the query {expr}", step="dashboard")
        return CONCRETE[name]

    return _VARIABLE.sub(value, expr)


def _rows() -> list[tuple[str, list[Sized]]]:
    return [
        ("Fleet overview", _overview()),
        ("Utilisation and memory", [
            _timeseries("GPU utilisation", [(GPU_UTIL, GPU)], unit="percent", valueMin=0, valueMax=100),
            _timeseries("Framebuffer memory used", [(f"100 * {FB_USED} / ({FB_USED} + {FB_FREE})", GPU)],
                        unit="percent", valueMin=0, valueMax=100),
        ]),
        ("Temperature, power and clocks", [
            _timeseries("GPU temperature", [(f"DCGM_FI_DEV_GPU_TEMP{{{DCGM}}}", GPU)], unit="celsius", width=8),
            _timeseries("Power draw", [(f"DCGM_FI_DEV_POWER_USAGE{{{DCGM}}}", GPU)], unit="watt", width=8),
            _timeseries("SM clock", [(f"DCGM_FI_DEV_SM_CLOCK{{{DCGM}}} * 1000000", GPU)], unit="hertz", width=8),
            _timeseries("Throttled share of time", [
                (f"rate(DCGM_FI_DEV_POWER_VIOLATION{{{DCGM}}}[$__rate_interval]) / 1e9", f"{GPU} power"),
                (f"rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{DCGM}}}[$__rate_interval]) / 1e9", f"{GPU} thermal"),
            ], unit="percentunit", description="DCGM's power and thermal violation time (ns) per second"),
            _timeseries("GPUs per clock event reason", [
                (f"sum by (host) (floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{DCGM}}} / {bit}) % 2)",
                 f"{{{{host}}}} {reason}") for reason, bit in CLOCK_EVENT_BITS.items()
            ], description="How many of each host's GPUs have their clocks lowered, by NVML's clocks event reason"),
        ]),
        ("Errors", [
            _table("Last Xid per GPU", [f"sort_desc(DCGM_FI_DEV_XID_ERRORS{{{DCGM}}})"], ["host", "gpu", "Value"],
                   width=8, description="The last Xid of each GPU, highest first; 0 when it had none (NVIDIA's Xid "
                                        "table says what each means)"),
            _timeseries("ECC errors per hour", [
                (f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{DCGM}}}[1h])", f"{GPU} double-bit"),
                (f"increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{DCGM}}}[1h])", f"{GPU} single-bit"),
            ], width=8),
            _timeseries("Row remapping", [
                (f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{DCGM}}}", f"{GPU} remap pending"),
                (f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{DCGM}}}", f"{GPU} remap failed"),
                (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{DCGM}}}", f"{GPU} rows remapped (uncorrectable)"),
            ], width=8),
        ]),
        ("Validation", [
            _timeseries("Matmul throughput vs threshold", [
                (f"gpuprov_matmul_tflops{{{HOST}}}", f"{GPU} {{{{dtype}}}}"),
                (f"gpuprov_matmul_threshold_tflops{{{HOST}}}", f"{GPU} {{{{dtype}}}} threshold"),
            ], axis="TFLOP/s"),
            _timeseries("Copy bandwidth vs threshold", [
                (f"gpuprov_copy_gbps{{{HOST}}}", f"{GPU} {{{{direction}}}}"),
                (f"gpuprov_copy_threshold_gbps{{{HOST}}}", f"{GPU} {{{{direction}}}} threshold"),
            ], unit="GBs"),
            _table("Checks failing or warning", [f'sort_desc(sum by (host, status) (gpuprov_check_status{{{HOST}, '
                                                 f'status=~"fail|warn"}}))'],
                   ["host", "status", "Value"], width=8,
                   description="Per host, how many validation checks failed or warned in its last run"),
            _timeseries("All-reduce bus bandwidth", [(f"gpuprov_allreduce_busbw_gbps{{{HOST}}}", "{{host}}")],
                        unit="GBs", width=8),
            _timeseries("Validation age", [(f"time() - gpuprov_validate_timestamp_seconds{{{HOST}}}", "{{host}}")],
                        unit="s", width=8, line=VALIDATION_STALE_S),
        ]),
        ("Drift", [
            _table("Stack per host", [f"gpuprov_stack_info{{{HOST}}}"], ["host", "driver", "cuda", "nccl", "toolkit"]),
            _timeseries("Driver/library mismatch", [(f"gpuprov_driver_library_mismatch{{{HOST}}}", "{{host}}")],
                        width=6, line=1),
            _timeseries("Reboot required", [(f"gpuprov_reboot_required{{{HOST}}}", "{{host}}")], width=6, line=1),
            _timeseries("Drift report age", [(f"time() - gpuprov_drift_timestamp_seconds{{{HOST}}}", "{{host}}")],
                        unit="s", line=DRIFT_STALE_S),
            _timeseries("Textfile errors", [(f'node_textfile_scrape_error{{job="gpuprov-node", {HOST}}}', "{{host}}")],
                        line=1, description="1 when node_exporter could not read a textfile of the host"),
        ]),
        ("Rollout", [
            _table("Rollout state per host", [f"gpuprov_rollout_state{{{HOST}}} == 1"], ["host", "run", "state"],
                   description="Each host's state in its last gpuprov rollout (invoke rollout --status says why "
                               "a host waits)"),
            _timeseries("Hosts out of service in a rollout", [
                (f"count by (run) ({ROLLOUT_OUT} == 1)", "{{run}}")],
                        description="Hosts a rollout has drained: waiting for jobs, upgrading, rebooting, "
                                    "validating, or failed and left drained"),
        ]),
        ("Health", [
            _table("Health faults per host", [f"gpuprov_health_fault{{{HOST}}} == 1"],
                   ["host", "code", "gpu", "action", "severity"],
                   description="The faults of each host's last passive health check (gpuprov-health): fault code, "
                               "GPU and repair action"),
            _timeseries("Nodes drained by the health check", [
                (f"count(gpuprov_health_drained{{{HOST}}} == 1) or vector(0)", "drained by gpuprov"),
                (f"count(gpuprov_health_held_back{{{HOST}}} == 1) or vector(0)", "drains held back"),
            ], description="Nodes gpuprov-health has drained in Slurm, and failing nodes the circuit breaker did "
                           "not drain (past the partition's share: a human decides)"),
            _timeseries("Faults by code", [(f"count by (code) (gpuprov_health_fault{{{HOST}}} == 1)", "{{code}}")],
                        width=8, description="How many GPUs (or hosts) show each fault code"),
            _timeseries("Failing the health check", [(f"gpuprov_health_ok{{{HOST}}} == 0", "{{host}}")], width=8,
                        description="Hosts whose last check found a fatal fault"),
            _timeseries("Health check age", [
                (f"time() - gpuprov_health_last_run_timestamp_seconds{{{HOST}}}", "{{host}}")], unit="s", width=8,
                        description="Seconds since each host's last check (Slurm's HealthCheckInterval apart)"),
        ]),
        ("Idle cost", [
            _timeseries("Idle GPU share per host", [(IDLE_SHARE, "{{host}}")], unit="percentunit",
                        description=f"Share of the host's GPUs under {IDLE_PCT} % for {IDLE_WINDOW}"),
            _timeseries("Idle cost per hour by host", [(IDLE_COST, "{{host}} ({{currency}})")],
                        description="gpuprov_cost_per_hour times the idle share of the host's GPUs"),
        ]),
    ]


def _overview() -> list[Sized]:
    up = f'up{{job=~"gpuprov-node|gpuprov-dcgm", {HOST}}}'
    return [
        _stat("GPUs up", [f"count({GPU_UTIL})"]),
        _stat("Exporters up", [f"sum({up})", f"count({up})"], legends=["up", "targets"]),
        _stat("Hosts with driver/library mismatch", [f"count(gpuprov_driver_library_mismatch{{{HOST}}} == 1) "
                                                     "or vector(0)"], alarm=1),
        _stat("Failed validation checks", [f'count(gpuprov_check_status{{{HOST}, status="fail"}} == 1) or vector(0)'],
              alarm=1),
        _stat("Idle GPUs", [f"count({IDLE_GPUS}) or vector(0)"], alarm=1,
              description=f"GPUs under {IDLE_PCT} % utilisation for {IDLE_WINDOW}"),
        _stat("Idle cost per hour", [f"sum by (currency) ({IDLE_COST})"], legends=["{{currency}}"], decimals=2),
        _stat("Uncorrectable ECC errors", [f"sum(increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{DCGM}}}[$__range])) "
                                           "or vector(0)"], alarm=1, description="In the dashboard's time range"),
        _stat("GPUs with an Xid", [f"count(DCGM_FI_DEV_XID_ERRORS{{{DCGM}}} > 0) or vector(0)"], alarm=1),
    ]


def _targets(queries: list[tuple[str, str]], instant: bool = False) -> list:
    from grafanalib.core import Target

    return [Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + index), instant=instant, intervalFactor=1,
                   format="table" if instant else "time_series", datasource=DATASOURCE)
            for index, (expr, legend) in enumerate(queries)]


def _steps(line: float | None) -> list[dict]:
    """Threshold steps: green, then red from `line`."""
    return [{"color": "green", "value": None}] + ([] if line is None else [{"color": "red", "value": line}])


def _stat(title: str, exprs: list[str], legends: list[str] | None = None, alarm: float | None = None,
          decimals: int | None = None, description: str | None = None) -> Sized:
    from grafanalib.core import Stat

    queries = list(zip(exprs, legends or [""] * len(exprs), strict=True))
    return Stat(title=title, dataSource=DATASOURCE, targets=_targets(queries), description=description,
                graphMode="none", reduceCalc="lastNotNull", textMode="value_and_name" if legends else "value",
                decimals=decimals, noValue="0", thresholds=_steps(alarm), colorMode="value" if alarm else "none"), 3


def _timeseries(title: str, queries: list[tuple[str, str]], unit: str = "none", width: int = 12,
                line: float | None = None, axis: str = "", description: str | None = None, **options) -> Sized:
    from grafanalib.core import TimeSeries

    threshold_lines = [{"matcher": {"id": "byRegexp", "options": ".* threshold$"},
                        "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}]
    return TimeSeries(title=title, dataSource=DATASOURCE, targets=_targets(queries), unit=unit, axisLabel=axis,
                      description=description, thresholds=_steps(line),
                      thresholdsStyleMode="off" if line is None else "line",
                      overrides=threshold_lines if any(legend.endswith("threshold") for _, legend in queries) else [],
                      legendDisplayMode="table", legendPlacement="right" if width == 24 else "bottom",
                      legendCalcs=["lastNotNull", "max"], tooltipMode="multi", **options), width


def _table(title: str, exprs: list[str], columns: list[str], width: int = 12,
           description: str | None = None) -> Sized:
    from grafanalib.core import Table

    keep = {"id": "filterFieldsByName", "options": {"include": {"names": columns}}}
    return Table(title=title, dataSource=DATASOURCE, targets=_targets([(expr, "") for expr in exprs], instant=True),
                 description=description, transformations=[keep]), width


def _layout(rows: list[tuple[str, list[Sized]]]) -> list:
    """Rows and their panels placed on Grafana's grid: each row on its own line, its panels left to right in their
    widths, wrapping at 24 columns; stats (width 3) are 4 units high, the others 8."""
    import attr
    from grafanalib.core import GridPos, RowPanel

    placed, y = [], 0
    for title, panels in rows:
        placed.append(RowPanel(title=title, gridPos=GridPos(h=1, w=WIDTH, x=0, y=y)))
        y += 1
        x, line_height = 0, 0
        for panel, width in panels:
            height = 4 if width <= 4 else 8
            if x + width > WIDTH:
                x, y, line_height = 0, y + line_height, 0
            placed.append(attr.evolve(panel, gridPos=GridPos(h=height, w=width, x=x, y=y)))
            x, line_height = x + width, max(line_height, height)
        y += line_height
    return placed


if __name__ == "__main__":
    write_dashboard(sys.argv[1])
