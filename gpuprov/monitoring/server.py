"""The Prometheus host: the distribution's `prometheus` package (port 9090, on the host's monitoring address only)
with gpuprov's configuration, alert rules and file_sd targets. A configuration or rules file is checked with the
host's own promtool before it replaces the old one, and Prometheus reloads it (SIGHUP) without a restart; target
files need no reload; a new listen address needs a restart."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import yaml

from gpuprov.core.operations import Change, OpContext, file_change, install_change, service_change
from gpuprov.monitoring.policy import MonitoringPolicy
from gpuprov.monitoring.targets import SERVER_DIR, TARGET_FILES, file_sd_text, prometheus_config

PACKAGE = "prometheus"
CONFIG = "/etc/prometheus/prometheus.yml"
DEFAULTS = "/etc/default/prometheus"       # the package's unit: EnvironmentFile=, ExecStart=/usr/bin/prometheus $ARGS
RULES = f"{SERVER_DIR}/gpuprov.rules.yml"
COMPONENT = "prometheus"
SHIPPED_RULES = Path(__file__).with_name("prometheus") / "gpuprov.rules.yml"
q = shlex.quote


def rules_text() -> str:
    """gpuprov's alert rules, shipped in the package (gpuprov/monitoring/prometheus/gpuprov.rules.yml)."""
    return SHIPPED_RULES.read_text(encoding="utf-8")


def config_text(policy: MonitoringPolicy) -> str:
    return ("# written by gpuprov monitoring.server; gpuprov's rules and targets are in " + SERVER_DIR + "\n"
            + yaml.safe_dump(prometheus_config(policy.scrape_interval_s, policy.prometheus_listen), sort_keys=False))


def defaults_text(policy: MonitoringPolicy) -> str:
    return ("# written by gpuprov monitoring.server: listen on the monitoring address only, not on every interface\n"
            f'ARGS="--web.listen-address={policy.prometheus_listen}"\n')


def target_paths() -> dict[str, str]:
    return {job: f"{SERVER_DIR}/targets/{name}" for job, name in TARGET_FILES.items()}


def managed_files() -> tuple[str, ...]:
    return (CONFIG, RULES, DEFAULTS, *target_paths().values())


def checked_file(ctx: OpContext, path: str, content: str, check: str, what: str) -> Change | None:
    """`content` staged beside `path`, judged by `check` (promtool ... %s) before it replaces the old file."""
    return file_change(ctx, COMPONENT, path, content, what, validate=check,
                       rejected=f"{' '.join(check.split()[:3])} rejected {path}")


def target_changes(ctx: OpContext, jobs: dict[str, list[dict]]) -> Iterator[Change]:
    """The file_sd files (Prometheus picks a changed one up by itself)."""
    for job, path in target_paths().items():
        change = file_change(ctx, COMPONENT, path, file_sd_text(jobs[job]), f"{len(jobs[job])} {job} targets",
                             summary=f"write {path} ({len(jobs[job])} {job} targets)")
        if change is not None:
            yield change


def server_changes(ctx: OpContext, jobs: dict[str, list[dict]], policy: MonitoringPolicy) -> Iterator[Change]:
    """Prometheus on the monitoring host `policy` describes (its address and scrape interval)."""
    install = install_change(COMPONENT, ctx.pm, [PACKAGE], ctx.facts.get("packages") or {},
                             "the distribution's package, port 9090")
    if install is not None:
        yield install
    yield from target_changes(ctx, jobs)
    reload = [change for change in (
        checked_file(ctx, RULES, rules_text(), "promtool check rules %s", "gpuprov's alert rules"),
        checked_file(ctx, CONFIG, config_text(policy), "promtool check config %s",
                     "scrape the inventory's exporters, evaluate gpuprov's rules"),
    ) if change is not None]
    yield from reload
    listen = file_change(ctx, COMPONENT, DEFAULTS, defaults_text(policy), f"listen on {policy.prometheus_listen} only")
    if listen is not None:
        yield listen
    # a new listen address needs a restart (a reload keeps the old one); a stopped Prometheus is (re)started too
    state = ctx.service(PACKAGE)
    restart = listen is not None or not (state.get("enabled") and state.get("active"))
    service = service_change(COMPONENT, PACKAGE, state, restart=restart, reload=bool(reload),
                             why="" if restart else "new configuration or rules",
                             summary=f"enable and (re)start {PACKAGE}" if restart else None)
    if service is not None:
        yield service
