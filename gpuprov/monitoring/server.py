"""The Prometheus host: the distribution's `prometheus` package (port 9090, on the host's monitoring address only)
with gpuprov's configuration, alert rules and file_sd targets. A configuration or rules file is checked with the
host's own promtool before it replaces the old one, and Prometheus reloads it (SIGHUP) without a restart; target
files need no reload; a new listen address needs a restart."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import yaml

from gpuprov.monitoring.policy import MonitoringPolicy
from gpuprov.monitoring.targets import SERVER_DIR, TARGET_FILES, file_sd_text, prometheus_config
from gpuprov.ops.base import Change, OpContext, file_change, unified_diff, write_file

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
    """Write `content` beside `path`, let `check` (promtool ... {file}) judge it, then rename it into place."""
    current = ctx.file(path)
    if current == content:
        return None
    staged = f"{path}.gpuprov-new"
    commands = (write_file(staged, content), check.format(file=q(staged)) + f" || {{ rm -f {q(staged)}; exit 1; }}",
                f"mv -f {q(staged)} {q(path)}")
    return Change(COMPONENT, f"{'update' if current is not None else 'create'} {path} ({what})", commands,
                  diff=unified_diff(path, current, content))


def target_changes(ctx: OpContext, jobs: dict[str, list[dict]]) -> Iterator[Change]:
    """The file_sd files (Prometheus picks a changed one up by itself)."""
    for job, path in target_paths().items():
        content = file_sd_text(jobs[job])
        if ctx.file(path) != content:
            yield Change(COMPONENT, f"write {path} ({len(jobs[job])} {job} targets)",
                         (write_file(path, content),), diff=unified_diff(path, ctx.file(path), content))


def server_changes(ctx: OpContext, jobs: dict[str, list[dict]], policy: MonitoringPolicy) -> Iterator[Change]:
    """Prometheus on the monitoring host `policy` describes (its address and scrape interval)."""
    if ctx.installed(PACKAGE) is None:
        yield Change(COMPONENT, f"install {PACKAGE} (the distribution's package, port 9090)",
                     (ctx.pm.update(), ctx.pm.install_names([PACKAGE])))
    yield from target_changes(ctx, jobs)
    reload = [change for change in (
        checked_file(ctx, RULES, rules_text(), "promtool check rules {file}", "gpuprov's alert rules"),
        checked_file(ctx, CONFIG, config_text(policy), "promtool check config {file}",
                     "scrape the inventory's exporters, evaluate gpuprov's rules"),
    ) if change is not None]
    yield from reload
    listen = file_change(ctx, COMPONENT, DEFAULTS, defaults_text(policy), f"listen on {policy.prometheus_listen} only")
    if listen is not None:
        yield listen
    state = ctx.service(PACKAGE)
    if not (state.get("enabled") and state.get("active")) or listen is not None:
        yield Change(COMPONENT, f"enable and (re)start {PACKAGE}", (f"systemctl enable {PACKAGE}",
                                                                    f"systemctl restart {PACKAGE}"))
    elif reload:
        yield Change(COMPONENT, f"reload {PACKAGE} (new configuration or rules)", (f"systemctl reload {PACKAGE}",))
