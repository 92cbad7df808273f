"""NVIDIA Container Toolkit: exact packages, Docker's nvidia runtime (merged, backed up), CDI, /dev/char."""

from __future__ import annotations

import json
from collections.abc import Iterator

from gpuprov.ops import driver
from gpuprov.ops.base import (
    DRIVER_ANSWERS,
    Change,
    OpContext,
    driver_pending,
    file_change,
    package_change,
    q,
    stack_packages,
    unified_diff,
)

COMPONENT = "container_toolkit"
DAEMON_JSON = "/etc/docker/daemon.json"
DAEMON_JSON_BACKUP = "/etc/docker/daemon.json.gpuprov-bak"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
DEV_CHAR_RULE = "/etc/udev/rules.d/71-gpuprov-nvidia-dev-char.rules"
FILES = (DAEMON_JSON, CDI_SPEC, DEV_CHAR_RULE)
NVIDIA_RUNTIME = {"args": [], "path": "nvidia-container-runtime"}
# NVIDIA's documented fix for "Failed to initialize NVML: Unknown Error" after `systemctl daemon-reload`
# (NVIDIA/nvidia-container-toolkit#48): recreate the /dev/char symlinks whenever the driver loads.
DEV_CHAR_CONTENT = (
    "# Managed by gpuprov: /dev/char symlinks for NVIDIA devices, so containers keep their GPUs across\n"
    "# `systemctl daemon-reload` (NVIDIA/nvidia-container-toolkit#48).\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n')
DEV_CHAR_NOW = "nvidia-ctk system create-dev-char-symlinks --create-all"


def docker_config(ctx: OpContext) -> tuple[str | None, dict]:
    """Docker's daemon.json: its text (None when absent) and its parsed content."""
    text = ctx.file(DAEMON_JSON)
    if text is None or not text.strip():
        return text, {}
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ctx.error(COMPONENT, f"{DAEMON_JSON} is not valid JSON ({exc}); refusing to touch it",
                        f"fix {DAEMON_JSON} by hand (dockerd cannot read it either), then run again") from None
    if not isinstance(config, dict):
        raise ctx.error(COMPONENT, f"{DAEMON_JSON} is not a JSON object", f"fix {DAEMON_JSON} by hand")
    return text, config


def merged_daemon_json(config: dict) -> str:
    """What `nvidia-ctk runtime configure --runtime=docker` writes: every key kept, runtimes.nvidia added."""
    merged = dict(config)
    merged["runtimes"] = {**config.get("runtimes", {}), "nvidia": NVIDIA_RUNTIME}
    return json.dumps(merged, indent=4, sort_keys=True) + "\n"


def docker_changes(ctx: OpContext) -> Iterator[Change]:
    if ctx.facts.get("docker") is None:
        return
    text, config = docker_config(ctx)
    if "nvidia" in config.get("runtimes", {}):
        return
    backup = (f"if [ -e {q(DAEMON_JSON)} ] && [ ! -e {q(DAEMON_JSON_BACKUP)} ]; then "
              f"cp -a {q(DAEMON_JSON)} {q(DAEMON_JSON_BACKUP)}; fi")
    merged = merged_daemon_json(config)
    yield Change(COMPONENT, f"add the nvidia runtime to Docker ({DAEMON_JSON} merged, backup "
                 f"{DAEMON_JSON_BACKUP}) and restart Docker if it runs",
                 (backup, "nvidia-ctk runtime configure --runtime=docker", "systemctl try-restart docker"),
                 diff=unified_diff(DAEMON_JSON, text, merged))


def changes(ctx: OpContext) -> Iterator[Change]:
    change = package_change(ctx, COMPONENT, stack_packages(ctx, "container_toolkit"))
    if change is not None:
        yield change
    yield from docker_changes(ctx)

    loaded = ctx.facts.get("loaded_driver_version") is not None
    rule = file_change(ctx, COMPONENT, DEV_CHAR_RULE, DEV_CHAR_CONTENT, "udev rule for /dev/char symlinks",
                       then=(DEV_CHAR_NOW,) if loaded else ())
    if rule is not None:
        yield rule

    # The CDI spec lists the driver's libraries by version: it is generated with the stack's driver
    # loaded (after the reboot a driver change needs), and again whenever the driver changes.
    # When this plan installs the driver, the spec is made in the same run if the new driver already answers.
    version = ctx.stack["driver"]["version"]
    spec = ctx.file(CDI_SPEC)
    generate = f"{DEV_CHAR_NOW} && mkdir -p /etc/cdi && nvidia-ctk cdi generate --output={q(CDI_SPEC)}"
    if not driver_pending(ctx) and (spec is None or version not in spec or driver.driver_change(ctx)):
        yield Change(COMPONENT, f"generate the CDI spec {CDI_SPEC} for driver {version}", (generate,))
    elif driver_pending(ctx) and driver.driver_change(ctx) is not None:
        yield Change(COMPONENT, f"generate the CDI spec {CDI_SPEC} for driver {version} if it already answers "
                     "(else on the run after the reboot)", (f"if {DRIVER_ANSWERS}; then {generate}; fi",))
