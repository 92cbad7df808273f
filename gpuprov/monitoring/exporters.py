"""The exporters' `Change`s: node_exporter (the distribution's package, listening on the monitoring address, with
the textfile collector) and dcgm-exporter (NVIDIA's container through the NVIDIA runtime where Docker runs, else
NVIDIA's package and its service), both listening on the monitoring address only."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from functools import cache
from importlib import resources

from gpuprov.errors import GpuprovError
from gpuprov.monitoring import dcgm_data
from gpuprov.monitoring.policy import MonitoringPolicy
from gpuprov.ops.base import Change, OpContext, file_change, package_change

NODE_PACKAGE = "prometheus-node-exporter"
NODE_DEFAULTS = "/etc/default/prometheus-node-exporter"
COUNTERS = "/etc/dcgm-exporter/gpuprov-counters.csv"
CONTAINER = "gpuprov-dcgm-exporter"
CONTAINER_ARGS = "/etc/gpuprov/dcgm-exporter.docker-args"
q = shlex.quote


@cache
def counters() -> str:
    """gpuprov's counters file: the DCGM fields the rules and the dashboard read."""
    return resources.files("gpuprov.data").joinpath("dcgm-counters.csv").read_text()


def node_defaults(policy: MonitoringPolicy) -> str:
    return ("# written by gpuprov monitoring.deploy: listen on the monitoring address only, read gpuprov's textfiles\n"
            f'ARGS="--web.listen-address={policy.node_exporter_listen} '
            f'--collector.textfile.directory={policy.textfile_dir}"\n')


def node_exporter(ctx: OpContext, policy: MonitoringPolicy) -> Iterator[Change]:
    component = "node-exporter"
    if ctx.installed(NODE_PACKAGE) is None:
        yield Change(component, f"install {NODE_PACKAGE} (the distribution's package)",
                     (ctx.pm.update(), ctx.pm.install_names([NODE_PACKAGE])))
    change = file_change(ctx, component, NODE_DEFAULTS, node_defaults(policy),
                         f"listen on {policy.node_exporter_listen}",
                         then=(f"mkdir -p {q(policy.textfile_dir)}", f"systemctl restart {NODE_PACKAGE}"))
    if change is not None:
        yield change
    yield from _enabled(ctx, component, NODE_PACKAGE)


def _enabled(ctx: OpContext, component: str, unit: str) -> Iterator[Change]:
    state = ctx.service(unit)
    if not (state.get("enabled") and state.get("active")):
        yield Change(component, f"enable and start {unit}", (f"systemctl enable --now {unit}",))


def dcgm_mode(ctx: OpContext, policy: MonitoringPolicy) -> str:
    """container, service or none: `auto` is a container where Docker runs and none where DCGM is not installed."""
    if policy.dcgm_exporter != "auto":
        return policy.dcgm_exporter
    if installed_dcgm(ctx) is None:
        return "none"
    return "container" if ctx.service("docker").get("active") else "service"


def installed_dcgm(ctx: OpContext) -> str | None:
    """The installed DCGM release (4.4.1 from the package version 1:4.4.1-1)."""
    version = ctx.installed(dcgm_data.DCGM_PACKAGE)
    return version.split(":")[-1].rsplit("-", 1)[0] if version else None


def dcgm_exporter(ctx: OpContext, policy: MonitoringPolicy) -> Iterator[Change]:
    mode = dcgm_mode(ctx, policy)
    yield from _retire(ctx, mode)
    if mode == "none":
        return
    dcgm = installed_dcgm(ctx)
    if dcgm is None:
        raise GpuprovError(f"dcgm-exporter ({mode}) needs DCGM, which is not installed", host=ctx.host,
                           step="dcgm-exporter", hint="provision the host first (invoke provision), or set "
                                                      "monitoring.dcgm_exporter: none for a host without GPUs")
    release = dcgm_data.release_for(dcgm, ctx.host)
    component = "dcgm-exporter"
    change = file_change(ctx, component, COUNTERS, counters(), "the DCGM fields gpuprov's rules and dashboard read")
    if change is not None:
        yield change
    if mode == "service":
        yield from _service(ctx, policy, release, restart=change is not None)
    else:
        yield from _container(ctx, policy, release, recreate=change is not None)


def _retire(ctx: OpContext, mode: str) -> Iterator[Change]:
    """Stop the exporter of the other mode (both would want the same address and port)."""
    unit = dcgm_data.releases()[0].unit
    state = ctx.service(unit)
    if mode != "service" and (state.get("enabled") or state.get("active")):
        yield Change("dcgm-exporter", f"stop and disable {unit} (dcgm-exporter: {mode})",
                     (f"systemctl disable --now {unit}",))
    if mode != "container" and any(c.get("name") == CONTAINER for c in ctx.facts.get("containers") or []):
        yield Change("dcgm-exporter", f"remove the {CONTAINER} container (dcgm-exporter: {mode})",
                     (f"docker rm --force {CONTAINER}", f"rm -f {q(CONTAINER_ARGS)}"))


def _service(ctx: OpContext, policy: MonitoringPolicy, release: dcgm_data.ExporterRelease,
             restart: bool) -> Iterator[Change]:
    component = "dcgm-exporter"
    install = package_change(ctx, component, [release.package_for(ctx.family)])
    if install is not None:
        yield install
    command = f"{release.binary} -a {policy.dcgm_exporter_listen} -f {COUNTERS}"
    dropin = ("# written by gpuprov monitoring.deploy: listen on the monitoring address only, gpuprov's counters\n"
              f"[Service]\nExecStart=\nExecStart={command}\n")
    change = file_change(ctx, component, release.dropin, dropin, f"listen on {policy.dcgm_exporter_listen}",
                         then=("systemctl daemon-reload", f"systemctl restart {release.unit}"))
    if change is not None:
        yield change
    elif restart and ctx.service(release.unit).get("active"):
        yield Change(component, f"restart {release.unit} (new counters)", (f"systemctl restart {release.unit}",))
    yield from _enabled(ctx, component, release.unit)


def docker_run_args(policy: MonitoringPolicy, image: str) -> list[str]:
    """`docker run` arguments of the exporter: NVIDIA's runtime (--gpus all), the host's network so it listens on the
    monitoring address itself (a published port would bypass the host firewall's input chain), SYS_ADMIN for the
    profiling fields, gpuprov's counters read-only."""
    return ["--detach", "--name", CONTAINER, "--restart", "unless-stopped", "--gpus", "all", "--cap-add", "SYS_ADMIN",
            "--network", "host", "--volume", f"{COUNTERS}:{COUNTERS}:ro", "--label", "io.gpuprov.role=monitoring",
            image, "-a", policy.dcgm_exporter_listen, "-f", COUNTERS]


def _container(ctx: OpContext, policy: MonitoringPolicy, release: dcgm_data.ExporterRelease,
               recreate: bool) -> Iterator[Change]:
    component = "dcgm-exporter"
    image = f"{policy.dcgm_exporter_image}:{release.image_tag}"
    args = docker_run_args(policy, image)
    line = " ".join(q(word) for word in args) + "\n"
    running = any(c.get("name") == CONTAINER for c in ctx.facts.get("containers") or [])
    changed = ctx.file(CONTAINER_ARGS) != line
    if not (changed or recreate or not running):
        return
    commands = (f"docker pull {q(image)}", f"docker rm --force {CONTAINER} >/dev/null 2>&1 || true",
                f"docker run {line.strip()}", f"mkdir -p /etc/gpuprov && printf %s {q(line)} > {q(CONTAINER_ARGS)}")
    yield Change(component, f"run {image} as {CONTAINER}, listening on {policy.dcgm_exporter_listen}", commands)
