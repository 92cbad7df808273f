"""The host-side timers: drift (every few minutes) and the idle-GPU validation (weekly by default), as scripts
under /usr/local/lib/gpuprov run by systemd units, with their settings in /etc/gpuprov/monitoring.env."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from functools import cache
from importlib import resources

from gpuprov.core.operations import Change, OpContext, file_change, service_change
from gpuprov.monitoring.policy import MonitoringPolicy

COMPONENT = "timers"
SCRIPT_DIR = "/usr/local/lib/gpuprov"
ENV_FILE = "/etc/gpuprov/monitoring.env"
UNIT_DIR = "/etc/systemd/system"
DRIFT, IDLE = "gpuprov-drift", "gpuprov-validate-idle"
SCRIPTS = {DRIFT: "drift.sh", IDLE: "validate-idle.sh"}


@cache
def script(name: str) -> str:
    return resources.files("gpuprov.monitoring").joinpath(name).read_text()


def env_file(policy: MonitoringPolicy) -> str:
    """The scripts' settings, each value shell-quoted (the scripts source this file)."""
    values = {"GPUPROV_HOST": policy.host, "GPUPROV_TEXTFILE_DIR": policy.textfile_dir,
              "GPUPROV_GPU_COUNT": str(policy.gpu_count)}
    if policy.cost_per_hour is not None:
        values.update(GPUPROV_COST_PER_HOUR=repr(policy.cost_per_hour), GPUPROV_CURRENCY=policy.currency)
    return "# written by gpuprov monitoring.deploy\n" + "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def _service(name: str, what: str) -> str:
    return (f"[Unit]\nDescription=gpuprov {what}\nDocumentation=https://github.com/gpuprov/gpuprov\n\n"
            f"[Service]\nType=oneshot\nExecStart=/bin/sh {SCRIPT_DIR}/{SCRIPTS[name]}\nNice=10\n")


def _timer(what: str, schedule: str) -> str:
    return f"[Unit]\nDescription=gpuprov {what}\n\n[Timer]\n{schedule}\n\n[Install]\nWantedBy=timers.target\n"


def unit_files(policy: MonitoringPolicy) -> dict[str, str | None]:
    """{path: content (None: absent)} of the units; the idle validation's are absent when its schedule is never."""
    idle = policy.validate_schedule != "never"
    drift_what, idle_what = "drift metrics (driver/library mismatch, stack, reboot)", "validation while the GPUs idle"
    return {
        f"{UNIT_DIR}/{DRIFT}.service": _service(DRIFT, drift_what),
        f"{UNIT_DIR}/{DRIFT}.timer": _timer(drift_what, "OnBootSec=1min\n"
                                                        f"OnUnitActiveSec={policy.drift_interval_min}min\n"
                                                        "AccuracySec=30s"),
        f"{UNIT_DIR}/{IDLE}.service": _service(IDLE, idle_what) if idle else None,
        f"{UNIT_DIR}/{IDLE}.timer": _timer(idle_what, f"OnCalendar={policy.validate_schedule}\nPersistent=true\n"
                                                      "RandomizedDelaySec=1h") if idle else None,
    }


def managed_files(policy: MonitoringPolicy) -> dict[str, str | None]:
    """Every file the timers need, with its content."""
    return {ENV_FILE: env_file(policy), **{f"{SCRIPT_DIR}/{file}": script(file) for file in SCRIPTS.values()},
            **unit_files(policy)}


def changes(ctx: OpContext, policy: MonitoringPolicy) -> Iterator[Change]:
    """Write the scripts, settings and units; then enable the timers and write the drift metrics right away. A
    timer no longer wanted is disabled before its unit files go."""
    idle = policy.validate_schedule != "never"
    off = None if idle else service_change(COMPONENT, f"{IDLE}.timer", ctx.service(f"{IDLE}.timer"), enabled=False,
                                           why="validate_schedule: never")
    if off is not None:
        yield off
    wrote = []
    for path, content in managed_files(policy).items():
        change = file_change(ctx, COMPONENT, path, content, "gpuprov monitoring",
                             mode="0755" if path.endswith(".sh") else "0644")
        if change is not None:
            wrote.append(change)
            yield change
    timers = [f"{DRIFT}.timer"] + ([f"{IDLE}.timer"] if idle else [])
    stale = [t for t in timers if not (ctx.service(t).get("enabled") and ctx.service(t).get("active"))]
    if wrote or stale or off is not None:
        commands = ["systemctl daemon-reload"]
        commands += [f"systemctl enable {t}" for t in timers] + [f"systemctl restart {t}" for t in timers]
        commands.append(f"systemctl start {DRIFT}.service")
        summary = (f"enable {', '.join(timers)} (drift every {policy.drift_interval_min} min"
                   + (f"; validation {policy.validate_schedule} while the GPUs idle" if idle else "") + ")"
                   + "; write the drift metrics now")
        yield Change(COMPONENT, summary, tuple(commands))
