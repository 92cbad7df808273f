"""Validate's reports beside the JSON one: JUnit XML (through junit-xml, for CI systems) and the Prometheus
textfile of each host (through prometheus_client; the same metrics as the suite's own writer on hosts,
gpuprov.smoke.textfile)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


def _iso(epoch) -> str | None:
    from datetime import UTC, datetime

    if not isinstance(epoch, int | float):
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def junit_report(hosts: list[dict]) -> str:
    """JUnit XML of a validate run (junit-xml): a test suite per host, a test case per check. fail is a
    failure, skip a skipped case, warn a skipped case whose message starts with "warn:" (JUnit has no warning;
    either way it is not a pass), and a host whose validation stopped has one errored case, `validation`.
    Each case's system-out holds its figures and thresholds as JSON."""
    from junit_xml import TestCase, TestSuite, to_xml_report_string

    from gpuprov.core.json_text import dump_json

    suites = []
    for host in hosts:
        classname = f"gpuprov.validate.{host['host']}"
        cases = []
        for item in host.get("results") or []:
            case = TestCase(item["check"], classname=classname, elapsed_sec=float(item.get("seconds") or 0.0),
                            stdout=dump_json({"figures": item.get("figures") or {},
                                              "thresholds": item.get("thresholds") or {}}, indent=None,
                                             sort_keys=True))
            if item["status"] == "fail":
                case.add_failure_info(message=item["reason"], failure_type="fail")
            elif item["status"] == "skip":
                case.add_skipped_info(message=item["reason"])
            elif item["status"] == "warn":
                case.add_skipped_info(message=f"warn: {item['reason']}")
            cases.append(case)
        error = host.get("error")
        if error:
            case = TestCase("validation", classname=classname, elapsed_sec=float(host.get("seconds") or 0.0))
            details = "\n".join(f"{key}: {error[key]}" for key in ("step", "command", "hint", "output")
                                 if error.get(key))
            case.add_error_info(message=error.get("error"), output=details or None,
                                error_type=error.get("step") or "error")
            cases.append(case)
        properties = {key: str(host[key]) for key in ("gpu", "level", "status", "image") if host.get(key)}
        suites.append(TestSuite(host["host"], cases, hostname=host.get("address") or None,
                                timestamp=_iso(host.get("started")), properties=properties or None))
    return to_xml_report_string(suites, prettyprint=True)


def validation_registry(host: dict, timestamp: float) -> CollectorRegistry:
    """A host's validation metrics as a prometheus_client registry: the same names, labels and values as the
    host-side writer (gpuprov.smoke.textfile, standard library, which the host's idle-GPU timer uses). Label
    values are masked (gpuprov.core.secrets)."""
    from prometheus_client import CollectorRegistry, Gauge

    from gpuprov.core.secrets import mask
    from gpuprov.smoke.core import STATUSES
    from gpuprov.smoke.textfile import COPY, HELP, MATMUL, per_gpu

    registry = CollectorRegistry(auto_describe=True)
    labels = {"gpuprov_check_ok": ("host", "check"), "gpuprov_check_status": ("host", "check", "status"),
              "gpuprov_matmul_tflops": ("host", "gpu", "dtype"),
              "gpuprov_matmul_threshold_tflops": ("host", "gpu", "dtype"),
              "gpuprov_copy_gbps": ("host", "gpu", "direction"),
              "gpuprov_copy_threshold_gbps": ("host", "gpu", "direction"),
              "gpuprov_allreduce_busbw_gbps": ("host",), "gpuprov_validate_timestamp_seconds": ("host",)}
    gauges = {metric: Gauge(metric, HELP[metric], names, registry=registry) for metric, names in labels.items()}

    def put(name: str, value: float, *values: str) -> None:
        gauges[name].labels(*(mask(str(text)) for text in values)).set(value)

    name, results = host["host"], host.get("results") or []
    checks = [(item["check"], item["status"]) for item in results] + ([("validation", "fail")]
                                                                       if host.get("error") else [])
    for check, status in checks:
        put("gpuprov_check_ok", 1 if status == "pass" else 0, name, check)
        for state in STATUSES:
            put("gpuprov_check_status", int(state == status), name, check, state)
    for item in results:
        figures = item.get("figures") or {}
        if item["check"] in ("perf.matmul", "perf.copy"):
            kind, unit, suffix, wanted = (("matmul", "tflops", "_tflops", MATMUL) if item["check"] == "perf.matmul"
                                          else ("copy", "gbps", "_gbs", COPY))
            for gpu, figure, value in per_gpu(figures, wanted):
                put(f"gpuprov_{kind}_{unit}", value, name, gpu, figure.removesuffix(suffix))
                line = _threshold(item, figure)
                if line is not None:
                    put(f"gpuprov_{kind}_threshold_{unit}", line, name, gpu, figure.removesuffix(suffix))
        elif item["check"] == "perf.allreduce" and _is_number(figures.get("busbw_gbs")):
            put("gpuprov_allreduce_busbw_gbps", float(figures["busbw_gbs"]), name)
    put("gpuprov_validate_timestamp_seconds", float(timestamp), name)
    return registry


def prometheus_textfile(host: dict, timestamp: float) -> str:
    """A host's Prometheus textfile (validation_registry's, in the text exposition format), as placed on the
    host for node_exporter's textfile collector."""
    from prometheus_client import generate_latest

    return generate_latest(validation_registry(host, timestamp)).decode("utf-8")


def write_prometheus_textfile(path: str | Path, host: dict, timestamp: float) -> Path:
    """Write a host's textfile at `path` (its folder made) through prometheus_client's write_to_textfile, which
    writes a temporary file beside it and renames it over `path`. Returns the path."""
    from prometheus_client import write_to_textfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), validation_registry(host, timestamp))
    return path


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _threshold(result: dict, figure: str) -> float | None:
    """The pass line of one figure: its expected value times threshold_pct, where the result recorded both."""
    thresholds = result.get("thresholds") or {}
    expected, pct = (thresholds.get("expected") or {}).get(figure), thresholds.get("threshold_pct")
    return float(expected) * float(pct) / 100 if _is_number(expected) and _is_number(pct) else None
