"""NVIDIA Container Toolkit: exact packages, Docker's nvidia runtime (merged, backed up), CDI, /dev/char."""

from __future__ import annotations

import json
from collections.abc import Iterator

from gpuprov.core.operations import (
    Change,
    OpContext,
    file_change,
    package_change,
    q,
    service_change,
    unified_diff,
)
from gpuprov.provision.ops import driver
from gpuprov.provision.ops.base import DRIVER_ANSWERS, driver_pending, stack_packages

COMPONENT = "container_toolkit"
DAEMON_JSON = "/etc/docker/daemon.json"
DAEMON_JSON_BACKUP = "/etc/docker/daemon.json.gpuprov-bak"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
DEV_CHAR_RULE = "/etc/udev/rules.d/71-gpuprov-nvidia-dev-char.rules"
FILES = (DAEMON_JSON, CDI_SPEC, DEV_CHAR_RULE)
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


def configure_command() -> str:
    """nvidia-ctk writes the runtime into a temporary copy of daemon.json (every other key kept); the step
    prints the real diff and installs the copy only when it differs, keeping the first backup."""
    daemon, backup, tmp = q(DAEMON_JSON), q(DAEMON_JSON_BACKUP), q(DAEMON_JSON + ".gpuprov.tmp")
    return "\n".join([
        "t=$(mktemp -d) && trap 'rm -rf \"$t\"' EXIT",
        f"if [ -f {daemon} ]; then cp -a {daemon} \"$t/daemon.json\"; fi",
        "nvidia-ctk runtime configure --runtime=docker --config=\"$t/daemon.json\"",
        f"if [ -f {daemon} ] && cmp -s \"$t/daemon.json\" {daemon}; then echo 'daemon.json unchanged'; exit 0; fi",
        f"diff -u \"$( [ -f {daemon} ] && echo {daemon} || echo /dev/null)\" \"$t/daemon.json\" || true",
        f"if [ -e {daemon} ] && [ ! -e {backup} ]; then cp -a {daemon} {backup}; fi",
        f"mkdir -p /etc/docker && cp \"$t/daemon.json\" {tmp} && chmod 0644 {tmp} && mv -f {tmp} {daemon}",
    ])


# The running daemon lacks the nvidia runtime: only then does a restart do anything.
RUNTIME_MISSING = "! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '\"nvidia\"'"


def docker_changes(ctx: OpContext) -> Iterator[Change]:
    """The nvidia runtime in daemon.json, and a Docker restart only while the running daemon lacks it.

    With containers running, the restart is disruptive unless live-restore keeps them running across it."""
    docker = ctx.facts.get("docker")
    if docker is None:
        return
    text, config = docker_config(ctx)
    configured = "nvidia" in config.get("runtimes", {})
    if not configured:
        written = docker.get("ctk_daemon_json")  # what nvidia-ctk wrote into a temporary copy at facts time
        yield Change(COMPONENT, f"add the nvidia runtime to {DAEMON_JSON} with nvidia-ctk (other keys kept, "
                     f"backup {DAEMON_JSON_BACKUP})" + ("" if written else "; the step prints the diff"),
                     (configure_command(),),
                     diff=unified_diff(DAEMON_JSON, text, written) if written is not None else None)
    live = docker.get("live_runtimes")
    if docker.get("active") and (not configured or (live is not None and "nvidia" not in live)):
        keeps = config.get("live-restore") is True
        yield service_change(COMPONENT, "docker", ctx.service("docker"), enabled=None, restart=True,
                             when=RUNTIME_MISSING, disruptive=None if keeps else "Docker restart",
                             summary="restart Docker to load the nvidia runtime"
                                     + (" (live-restore keeps containers running)" if keeps else ""))


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
                     "(else on the run after the reboot)", (f"if {DRIVER_ANSWERS}; then {generate}; fi",),
                     requires=driver.COMPONENT)
