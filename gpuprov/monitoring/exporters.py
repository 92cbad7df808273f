"""The exporters' `Change`s: node_exporter (the distribution's package, listening on the monitoring address, with
the textfile collector reading a folder only root writes) and dcgm-exporter (NVIDIA's container, by digest and
without capabilities, through the NVIDIA runtime where Docker runs, else NVIDIA's package and its service), both
listening on the monitoring address only."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from functools import cache
from importlib import resources

from gpuprov.core.errors import GpuprovError
from gpuprov.core.operations import (
    Change,
    OpContext,
    file_change,
    install_change,
    package_change,
    service_change,
)
from gpuprov.monitoring import dcgm_data
from gpuprov.monitoring.policy import MonitoringPolicy

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
    yield from package_dir(ctx, policy)
    install = install_change(component, ctx.pm, [NODE_PACKAGE], ctx.facts.get("packages") or {},
                             "the distribution's package")
    if install is not None:
        yield install
    yield from textfile_dir(ctx, policy)
    change = file_change(ctx, component, NODE_DEFAULTS, node_defaults(policy),
                         f"listen on {policy.node_exporter_listen}", then=(f"systemctl restart {NODE_PACKAGE}",))
    if change is not None:
        yield change
    yield from _enabled(ctx, component, NODE_PACKAGE)


TEXTFILE_DIR_STATE = "directory root:root 755"   # `stat -c '%F %U:%G %a'` of the folder as it must be
# Debian's prometheus-node-exporter ships /var/lib/prometheus root's, and its postinst gives it to the prometheus
# user unless a dpkg-statoverride names it: that user could then swap the textfile folder below it for its own.
PACKAGE_DIR = "/var/lib/prometheus"
PACKAGE_DIR_OVERRIDE = f"root root 755 {PACKAGE_DIR}"   # the line `dpkg-statoverride --list` prints for it


def state_command(policy: MonitoringPolicy) -> str:
    """A host command (as root) that prints `folder=`, `package_dir=` (stat's `%F %U:%G %a` of the textfile folder
    and of PACKAGE_DIR, links not followed; empty when missing) and `override=` (PACKAGE_DIR's dpkg-statoverride)."""
    probes = {"folder": f"stat -c '%F %U:%G %a' {q(policy.textfile_dir)}",
              "package_dir": f"stat -c '%F %U:%G %a' {PACKAGE_DIR}",
              "override": f"dpkg-statoverride --list {PACKAGE_DIR}"}
    return "; ".join(f'printf \'%s=%s\\n\' {key} "$({probe} 2>/dev/null)"' for key, probe in probes.items())


def parse_state(output: str) -> dict[str, str | None]:
    """state_command's output as {key: value, None when empty}."""
    pairs = (line.partition("=") for line in output.splitlines() if "=" in line)
    return {key: value.strip() or None for key, _, value in pairs}


def package_dir(ctx: OpContext, policy: MonitoringPolicy) -> Iterator[Change]:
    """PACKAGE_DIR root:root 0755 and kept so through package upgrades (a dpkg-statoverride, set before the package
    is installed so its postinst leaves the folder alone), where the textfile folder lies below it."""
    if not policy.textfile_dir.startswith(PACKAGE_DIR + "/"):
        return
    state = ctx.facts.get("textfile_dir") or {}
    if state.get("override") == PACKAGE_DIR_OVERRIDE and state.get("package_dir") in (TEXTFILE_DIR_STATE, None):
        return
    p = PACKAGE_DIR
    yield Change("node-exporter", f"keep {p} root:root 0755 (a dpkg-statoverride: Debian's {NODE_PACKAGE} would "
                                  "give it to the prometheus user)",
                 (f"if dpkg-statoverride --list {p} >/dev/null; then dpkg-statoverride --remove {p}; fi; "
                  f"dpkg-statoverride --add root root 0755 {p} && "
                  f"if [ -d {p} ] && [ ! -L {p} ]; then chown root:root {p} && chmod 0755 {p}; fi",))


def textfile_dir_command(path: str) -> str:
    """Make the textfile folder root:root 0755: everything in it is a metric of this host, so only root writes
    there. A symbolic link, a file or a shared folder (sticky bit, like /tmp) is refused, not changed."""
    return (f"d={q(path)}; if [ -L \"$d\" ] || {{ [ -e \"$d\" ] && [ ! -d \"$d\" ]; }} || [ -k \"$d\" ]; then "
            "echo \"gpuprov: $d is a symbolic link, not a folder, or a shared folder (sticky bit): refused\" >&2; "
            "exit 1; fi; mkdir -p \"$d\" && chown root:root \"$d\" && chmod 0755 \"$d\"")


def textfile_dir(ctx: OpContext, policy: MonitoringPolicy) -> Iterator[Change]:
    """The textfile folder as root:root 0755, from its state in the facts (`textfile_dir`: parse_state's)."""
    state = (ctx.facts.get("textfile_dir") or {}).get("folder")
    if state == TEXTFILE_DIR_STATE:
        return
    kind, _, mode = (state or "").rpartition(" ")
    if state is not None and (not kind.startswith("directory ") or len(mode) == 4 and int(mode[0]) & 1):
        raise GpuprovError(f"the textfile folder {policy.textfile_dir} is not a plain folder gpuprov may own "
                           f"({state})", host=ctx.host, step="node-exporter",
                           command=f"stat -c '%F %U:%G %a' {q(policy.textfile_dir)}",
                           hint="point validate.textfile_dir at a folder only root writes (default "
                                "/var/lib/prometheus/node-exporter), or remove what is at that path")
    what = "create" if state is None else f"make ({state} now)"
    yield Change("node-exporter", f"{what} {policy.textfile_dir} root:root 0755 (only root writes this host's "
                                  "metrics)", (textfile_dir_command(policy.textfile_dir),))


def _enabled(ctx: OpContext, component: str, unit: str, restart: bool = False, why: str = "") -> Iterator[Change]:
    """The unit enabled and running; restarted when `restart` (a change it reads only at start) and it runs."""
    state = ctx.service(unit)
    change = service_change(component, unit, state, restart=restart and bool(state.get("active")), why=why)
    if change is not None:
        yield change


def dcgm_mode(ctx: OpContext, policy: MonitoringPolicy) -> str:
    """container, service or none: `auto` is a container where Docker runs and the image's digest is known (see
    image_digest), NVIDIA's package's service elsewhere, and none where DCGM is not installed."""
    if policy.dcgm_exporter != "auto":
        return policy.dcgm_exporter
    dcgm = installed_dcgm(ctx)
    if dcgm is None:
        return "none"
    if ctx.service("docker").get("active") and image_digest(policy, dcgm_data.release_for(dcgm, ctx.host)):
        return "container"
    return "service"


def image_digest(policy: MonitoringPolicy, release: dcgm_data.ExporterRelease) -> str | None:
    """The digest the container runs by: the inventory's pin for the release's tag, else a digest the data records
    as confirmed; None when neither (an unpinned tag is never run)."""
    return policy.dcgm_exporter_digests.get(release.image_tag) or release.image_digest


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
    stop = service_change("dcgm-exporter", unit, ctx.service(unit), enabled=False, why=f"dcgm-exporter: {mode}")
    if mode != "service" and stop is not None:
        yield stop
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
    again = restart and change is None     # a new drop-in restarts the unit itself
    yield from _enabled(ctx, component, release.unit, restart=again, why="new counters" if again else "")


def docker_run_args(policy: MonitoringPolicy, image: str) -> list[str]:
    """`docker run` arguments of the exporter: NVIDIA's runtime (--gpus all), the host's network so it listens on the
    monitoring address itself (a published port would bypass the host firewall's input chain), gpuprov's counters
    read-only, and no capability: NVIDIA's image wants SYS_ADMIN only for the profiling fields, which gpuprov's
    counters do not collect, and NO_SETCAP=1 keeps its entrypoint from trying (data/dcgm_exporter.yaml, CAP)."""
    return ["--detach", "--name", CONTAINER, "--restart", "unless-stopped", "--gpus", "all", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--env", "NO_SETCAP=1", "--network", "host",
            "--volume", f"{COUNTERS}:{COUNTERS}:ro", "--label", "io.gpuprov.role=monitoring",
            image, "-a", policy.dcgm_exporter_listen, "-f", COUNTERS]


def _container(ctx: OpContext, policy: MonitoringPolicy, release: dcgm_data.ExporterRelease,
               recreate: bool) -> Iterator[Change]:
    component = "dcgm-exporter"
    digest = image_digest(policy, release)
    if digest is None:
        tag = f"{policy.dcgm_exporter_image}:{release.image_tag}"
        raise GpuprovError(f"dcgm-exporter (container) runs by digest only, and {tag} has no digest gpuprov can "
                           "trust (none confirmed in gpuprov/data/dcgm_exporter.yaml, none pinned)", host=ctx.host,
                           step=component,
                           hint=f"pin it: monitoring.dcgm_exporter_digests: {{{release.image_tag}: sha256:...}} in "
                                f"the inventory (`docker buildx imagetools inspect {tag}` shows it), or set "
                                "monitoring.dcgm_exporter: service (NVIDIA's package)")
    image = f"{policy.dcgm_exporter_image}@{digest}"
    args = docker_run_args(policy, image)
    line = " ".join(q(word) for word in args) + "\n"
    running = any(c.get("name") == CONTAINER for c in ctx.facts.get("containers") or [])
    changed = ctx.file(CONTAINER_ARGS) != line
    if not (changed or recreate or not running):
        return
    commands = (f"docker pull {q(image)}", f"docker rm --force {CONTAINER} >/dev/null 2>&1 || true",
                f"docker run {line.strip()}", f"mkdir -p /etc/gpuprov && printf %s {q(line)} > {q(CONTAINER_ARGS)}")
    yield Change(component, f"run {image} ({release.image_tag}) as {CONTAINER}, listening on "
                            f"{policy.dcgm_exporter_listen}", commands)
