"""The Grafana dashboard (gpuprov/monitoring/dashboard.py, shipped as gpuprov/monitoring/grafana/gpu-fleet.json): the
shipped JSON is what the code builds; the model has what Grafana needs; every query filters by `host=~"$host"` and uses
only metrics of the monitoring contract; promtool parses every query and evaluates the ones that compute something
(idle share and cost, clock event bits, memory and throttle shares) on series written here, against values worked out
by hand."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuprov.core.errors import GpuprovError
from gpuprov.monitoring.dashboard import build_dashboard, concrete, dashboard_json, panel_queries
from gpuprov.monitoring.promtool import promtool_path

PROJECT = Path(__file__).resolve().parents[2]
SHIPPED = PROJECT / "gpuprov" / "monitoring" / "grafana" / "gpu-fleet.json"
# every metric the monitoring contract lists
CONTRACT_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "gpuprov_driver_library_mismatch", "gpuprov_stack_info", "gpuprov_reboot_required",
    "gpuprov_drift_timestamp_seconds", "gpuprov_cost_per_hour",
    "gpuprov_check_ok", "gpuprov_matmul_tflops", "gpuprov_copy_gbps", "gpuprov_allreduce_busbw_gbps",
    "gpuprov_validate_timestamp_seconds", "gpuprov_check_status", "gpuprov_matmul_threshold_tflops",
    "gpuprov_copy_threshold_gbps", "gpuprov_rollout_state",
    "gpuprov_health_ok", "gpuprov_health_fault", "gpuprov_health_drained", "gpuprov_health_held_back",
    "gpuprov_health_last_run_timestamp_seconds",
    "node_textfile_mtime_seconds", "node_textfile_scrape_error", "up",
}
# what the dashboard must show (issue 12): health, throttling, errors, validation against thresholds, drift, cost
REQUIRED_METRICS = CONTRACT_METRICS - {"gpuprov_check_ok", "node_textfile_mtime_seconds"}
# words of PromQL that are not metric names, for the reader of queries below
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: what is left once strings, label matchers, ranges, label lists
    (by, on, group_left...), numbers, function calls and operator words are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\b(?:group_left|group_right)\b", " ", text)
    text = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:e[+-]?\d+)?", " ", text)
    text = re.sub(r"\b[a-z_]+\s*\(", "(", text)
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)) - PROMQL_WORDS


@pytest.fixture(scope="module")
def model() -> dict:
    return build_dashboard()


@pytest.fixture(scope="module")
def queries(model) -> list[tuple[str, str]]:
    return panel_queries(model)


@pytest.fixture(scope="module")
def promtool() -> str:
    if not shutil.which("promtool") and os.geteuid() != 0:
        pytest.skip("promtool is not on PATH and installing Debian's prometheus package needs root")
    return promtool_path(install=True)


def panels(model: dict) -> list[dict]:
    """Every panel that is not a row, in collapsed rows too."""
    found = []
    for panel in model["panels"]:
        found += panels(panel) if panel["type"] == "row" else [panel]
    return found


def test_the_shipped_json_is_what_the_code_builds(model):
    assert json.loads(SHIPPED.read_text()) == model
    assert SHIPPED.read_text() == dashboard_json(), "regenerate: python -m gpuprov.monitoring.dashboard " + str(SHIPPED)
    assert build_dashboard() == model


def test_title_uid_and_template_variables(model):
    assert (model["title"], model["uid"]) == ("gpuprov GPU fleet", "gpuprov-gpu-fleet")
    variables = {variable["name"]: variable for variable in model["templating"]["list"]}
    assert set(variables) <= {"datasource", "host", "group"}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    host = variables["host"]
    assert host["query"] == 'label_values(up{job="gpuprov-node"}, host)'
    assert (host["type"], host["multi"], host["includeAll"], host["allValue"]) == ("query", True, True, ".*")
    assert host["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_the_model_has_what_grafana_needs(model):
    assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
    ids = [panel["id"] for panel in model["panels"]] + [panel["id"] for panel in panels(model)
                                                         if panel not in model["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    taken = set()
    for panel in model["panels"]:
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in "hwxy"), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    for panel in panels(model):
        assert panel["type"] in {"timeseries", "stat", "table"}, panel["title"]
        assert panel["title"] and panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(refs), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_every_query_filters_by_the_host_variable(queries):
    for title, expr in queries:
        assert 'host=~"$host"' in expr, title
        assert expr.count("$host") == expr.count('host=~"$host"'), title


def test_every_metric_is_one_of_the_contract_and_the_dashboard_shows_what_it_must(queries):
    used = set()
    for title, expr in queries:
        names = metric_names(expr)
        assert names, title
        assert names <= CONTRACT_METRICS, (title, names - CONTRACT_METRICS)
        used |= names
    assert used >= REQUIRED_METRICS, REQUIRED_METRICS - used


def test_the_reader_of_metric_names_in_this_test():
    assert metric_names('sum by (currency) (max by (host, currency) (gpuprov_cost_per_hour{host=~"$host"}) * on '
                        '(host) group_left () rate(DCGM_FI_DEV_POWER_VIOLATION[5m]) / 1e9 or vector(0))') == \
        {"gpuprov_cost_per_hour", "DCGM_FI_DEV_POWER_VIOLATION"}
    assert metric_names('time() - up{job="a{b}"} > bool 2.5') == {"up"}


def test_panel_queries_reads_panels_inside_collapsed_rows():
    model = {"panels": [
        {"type": "row", "title": "hidden", "collapsed": True, "panels": [
            {"type": "timeseries", "title": "inside", "targets": [{"refId": "A", "expr": "up"}]}]},
        {"type": "stat", "title": "outside", "targets": [{"refId": "A", "expr": "sum(up)"}, {"refId": "B"}]},
    ]}
    assert panel_queries(model) == [("inside", "up"), ("outside", "sum(up)")]


def test_concrete_replaces_the_template_variables():
    assert concrete('rate(x{host=~"$host"}[$__rate_interval])') == 'rate(x{host=~".*"}[1m])'
    assert concrete('increase(x{host=~"${host}", groups=~".*,$group,.*"}[$__range])') == \
        'increase(x{host=~".*", groups=~".*,.*,.*"}[1h])'
    assert concrete('label_replace(up, "a", "$1", "b", "(.*)")') == 'label_replace(up, "a", "$1", "b", "(.*)")'
    with pytest.raises(GpuprovError, match=r"unknown dashboard variable \$cluster"):
        concrete('up{cluster="$cluster"}')


def test_every_query_has_no_variable_left_once_concrete(queries):
    for title, expr in queries:
        assert "$" not in concrete(expr), title


@pytest.mark.tool
@pytest.mark.lab
def test_promtool_parses_every_panel_query(promtool, queries, tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"gpuprov_dashboard:query_{index}", "expr": concrete(expr)} for index, (_, expr) in
        enumerate(queries)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(queries)} rules found" in done.stdout


DCGM = 'job="gpuprov-dcgm", instance="{host}:9400", host="{host}", gpu="{gpu}"'
# gpu01: 2 GPUs, both idle, 20 USD an hour; gpu02: 4 GPUs, 2 idle, 30 USD; gpu03: 1 busy GPU, 10 EUR.
# Clock event reasons (NVML bits: 0x1 idle, 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal,
# 0x80 HW power brake, 0x100 display clock).
GPUS = [  # host, gpu, utilisation %, clocks event reasons
    ("gpu01", "0", 2, 0x24), ("gpu01", "1", 1, 0x04),
    ("gpu02", "0", 50, 0x88), ("gpu02", "1", 3, 0x40), ("gpu02", "2", 80, 0x01), ("gpu02", "3", 0, 0x00),
    ("gpu03", "0", 90, 0x120),
]
COSTS = [("gpu01", "USD", 20), ("gpu02", "USD", 30), ("gpu03", "EUR", 10)]


def input_series() -> list[dict]:
    series = []
    for host, gpu, util, reasons in GPUS:
        labels = DCGM.format(host=host, gpu=gpu)
        series += [{"series": f"DCGM_FI_DEV_GPU_UTIL{{{labels}}}", "values": f"{util}x10"},
                   {"series": f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels}}}", "values": f"{reasons}x10"}]
    for host, currency, cost in COSTS:
        series.append({"series": f'gpuprov_cost_per_hour{{job="gpuprov-node", instance="{host}:9100", host="{host}", '
                                 f'currency="{currency}", cost_per_hour="{cost}"}}', "values": f"{cost}x10"})
    labels = DCGM.format(host="gpu01", gpu="0")
    series += [
        {"series": f"DCGM_FI_DEV_FB_USED{{{labels}}}", "values": "20000x10"},
        {"series": f"DCGM_FI_DEV_FB_FREE{{{labels}}}", "values": "60000x10"},
        # 30 s of power violation time (in ns) a minute; the thermal counter stays still
        {"series": f"DCGM_FI_DEV_POWER_VIOLATION{{{labels}}}", "values": "0+30000000000x10"},
        {"series": f"DCGM_FI_DEV_THERMAL_VIOLATION{{{labels}}}", "values": "7000x10"},
        {"series": 'gpuprov_validate_timestamp_seconds{job="gpuprov-node", instance="gpu01:9100", host="gpu01"}',
         "values": "0x10"},
    ]
    return series


GPU01_0 = '{job="gpuprov-dcgm", instance="gpu01:9400", host="gpu01", gpu="0"}'
# (panel title, its query's position in the panel, the samples at 10m)
EXPECTED = [
    ("GPUs up", 0, [("{}", 7)]),
    ("Idle GPUs", 0, [("{}", 4)]),
    ("Idle cost per hour", 0, [('{currency="USD"}', 35), ('{currency="EUR"}', 0)]),
    ("Idle GPU share per host", 0, [('{host="gpu01"}', 1), ('{host="gpu02"}', 0.5), ('{host="gpu03"}', 0)]),
    ("Idle cost per hour by host", 0, [('{host="gpu01", currency="USD"}', 20), ('{host="gpu02", currency="USD"}', 15),
                                       ('{host="gpu03", currency="EUR"}', 0)]),
    # how many of each host's GPUs have the bit (0 included, so the panel always has data)
    ("GPUs per clock event reason", 0, [('{host="gpu01"}', 2), ('{host="gpu02"}', 0), ('{host="gpu03"}', 0)]),
    ("GPUs per clock event reason", 1, [('{host="gpu01"}', 0), ('{host="gpu02"}', 1), ('{host="gpu03"}', 0)]),
    ("GPUs per clock event reason", 2, [('{host="gpu01"}', 1), ('{host="gpu02"}', 0), ('{host="gpu03"}', 1)]),
    ("GPUs per clock event reason", 3, [('{host="gpu01"}', 0), ('{host="gpu02"}', 1), ('{host="gpu03"}', 0)]),
    ("GPUs per clock event reason", 4, [('{host="gpu01"}', 0), ('{host="gpu02"}', 1), ('{host="gpu03"}', 0)]),
    ("Framebuffer memory used", 0, [(GPU01_0, 25)]),
    ("Throttled share of time", 0, [(GPU01_0, 0.5)]),
    ("Throttled share of time", 1, [(GPU01_0, 0)]),
    ("Validation age", 0, [('{job="gpuprov-node", instance="gpu01:9100", host="gpu01"}', 600)]),
]


@pytest.mark.tool
@pytest.mark.lab
def test_the_computed_panels_give_the_values_worked_out_by_hand(promtool, queries, tmp_path):
    by_title: dict[str, list[str]] = {}
    for title, expr in queries:
        by_title.setdefault(title, []).append(expr)
    cases = [{"expr": concrete(by_title[title][position]), "eval_time": "10m",
              "exp_samples": [{"labels": labels, "value": value} for labels, value in samples]}
             for title, position, samples in EXPECTED]
    path = tmp_path / "dashboard.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": input_series(), "promql_expr_test": cases}]}, sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
