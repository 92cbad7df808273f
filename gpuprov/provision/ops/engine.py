"""The container engine a host's inventory asks for (`container_engine: docker`): installed and running.

Docker comes from the host's own package sources: Debian/Ubuntu's `docker.io`, or `docker-ce` on the RHEL
family (RHEL has no Docker package of its own; Docker's docker-ce repository must be configured there).
A host that already has Docker (dockerd answers, or docker.io / docker-ce is installed) keeps it: only a
stopped or disabled service is started and enabled. Without `container_engine` this component does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.core.errors import InputError
from gpuprov.core.operations import Change, OpContext, service_change

COMPONENT = "engine"
VARIABLE = "container_engine"
ENGINES = ("docker",)
SERVICE = "docker"
# Package names that provide Docker on each family (any of them installed means Docker is there).
DOCKER_PACKAGES = ("docker.io", "docker-ce", "moby-engine")
INSTALL = {"debian": "docker.io", "rhel": "docker-ce"}


def wanted(ctx: OpContext) -> str | None:
    """The engine the host's variables ask for (None: no `container_engine`)."""
    value = (ctx.host_vars or {}).get(VARIABLE)
    if value is None:
        return None
    if value not in ENGINES:
        raise InputError(f"unknown {VARIABLE} {value!r}", host=ctx.host, step=COMPONENT,
                         hint=f"set {VARIABLE} to one of: {', '.join(ENGINES)} (or leave it out)")
    return value


def docker_installed(ctx: OpContext) -> bool:
    """Facts show Docker: dockerd answers `--version`, or a Docker package is installed."""
    return ctx.facts.get("docker") is not None or any(ctx.installed(name) for name in DOCKER_PACKAGES)


def changes(ctx: OpContext) -> Iterator[Change]:
    if wanted(ctx) != "docker":
        return
    enable = f"systemctl enable --now {SERVICE}"
    if not docker_installed(ctx):
        pm = ctx.pm
        package = INSTALL[ctx.family]
        note = "" if ctx.family == "debian" else " from Docker's docker-ce repository"
        yield Change(COMPONENT, f"install {package}{note} and enable and start {SERVICE} "
                     f"({VARIABLE}: docker)", (pm.update(), pm.install_names([package]), enable))
        return
    # facts without a services entry: dockerd's own answer tells whether it runs
    state = {"enabled": True, "active": (ctx.facts.get("docker") or {}).get("active", False), **ctx.service(SERVICE)}
    change = service_change(COMPONENT, SERVICE, state, why=f"{VARIABLE}: docker")
    if change is not None:
        yield change
