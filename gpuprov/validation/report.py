"""Validate's reports beside the JSON one: JUnit XML (through junit-xml, for CI systems) and the Prometheus
textfile of each host (the suite's own writer, gpuprov.smoke.textfile)."""

from __future__ import annotations


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


def prometheus_textfile(host: dict, timestamp: float) -> str:
    """A host's Prometheus textfile for node_exporter's textfile collector: the suite's own writer
    (gpuprov.smoke.textfile, which the host's idle-GPU validation timer also uses), so both write the same."""
    from gpuprov.smoke.textfile import validation_textfile

    return validation_textfile(host["host"], host.get("results") or [], timestamp, failed_run=bool(host.get("error")))
