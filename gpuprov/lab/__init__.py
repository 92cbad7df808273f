"""The lab: local systemd containers that act as GPU servers, reached over real SSH.

Python API (tests, benchmarks and `invoke lab.*` use it):
    up(hosts=3, profiles=None) -> LabState     bring up (or reuse) N hosts, write inventory + known_hosts
    up(..., slurm=True)                        also a Slurm cluster: a controller host + slurmd on the N hosts
    current() -> LabState | None               the lab as it is now, without changing anything
    status() -> list[LabHost]                  every lab container, running or not
    stop_host(name) / start_host(name)         simulate a host going down / coming back
    down(images=False)                         remove exactly what the lab created
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuprov.lab.state import LabHost, LabPaths, LabState

__all__ = ["LabHost", "LabPaths", "LabState", "current", "down", "start_host", "status", "stop_host", "up"]

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    """A progress sink that shows nothing."""


def up(hosts: int = 3, profiles: list[str] | None = None, *, paths: LabPaths | None = None,
       progress: Progress = _quiet, fresh: bool = False, slurm: bool = False) -> LabState:
    """Bring up `hosts` lab hosts with `profiles` cycled over them (default: the mixed set); a profile given as
    `NAME@RELEASE` runs that Debian release (gpuprov.lab.debian.RELEASES, each its own base and host image).

    Matching running hosts are reused; `fresh` recreates every host from the image (bare servers). `slurm` adds a
    host without GPUs that runs slurmctld and makes every GPU host a Slurm node (gpuprov.lab.slurm); without it a
    controller host left by an earlier `slurm` run is removed.
    """
    from gpuprov.lab.debian import DEFAULT_RELEASE
    from gpuprov.lab.engine import ensure_engine, verify_runs
    from gpuprov.lab.hosts import ensure_network, lab_containers, reconcile
    from gpuprov.lab.images import ensure_base_image, ensure_host_image
    from gpuprov.lab.inotify import ensure_inotify
    from gpuprov.lab.keys import ensure_keypair
    from gpuprov.lab.labels import NETWORK
    from gpuprov.lab.mirror import ensure_mirror, mirror_vars
    from gpuprov.lab.profiles import assign_profiles
    from gpuprov.lab.removal import remove_container

    paths = paths or LabPaths.default()
    chosen = assign_profiles(hosts, profiles)
    if slurm:
        from gpuprov.lab.slurm import controller_profile

        chosen.append(controller_profile())
    timings: dict[str, float] = {}
    started = time.monotonic()
    client = ensure_engine(progress)
    timings["engine_s"] = time.monotonic() - started
    public_key = ensure_keypair(paths.key, "gpuprov-lab")
    mark = time.monotonic()
    base = ensure_base_image(client, progress)
    verify_runs(client, base)
    image = ensure_host_image(client, base, public_key, progress)
    images = {DEFAULT_RELEASE: image}
    for release in sorted({profile.release for profile in chosen} - {DEFAULT_RELEASE}):
        images[release] = ensure_host_image(client, ensure_base_image(client, progress, release), public_key, progress)
    timings["images_s"] = time.monotonic() - mark
    ensure_inotify(hosts, progress)
    mark = time.monotonic()
    ensure_network(client, progress)
    if fresh:
        for container in lab_containers(client):
            remove_container(container)
    mirror = ensure_mirror(NETWORK, paths=paths, client=client, image=image, progress=progress)
    timings["mirror_s"] = time.monotonic() - mark
    mark = time.monotonic()
    lab_hosts = reconcile(client, chosen, images, paths, progress, {"mirror": mirror_vars(mirror)})
    timings["hosts_s"] = time.monotonic() - mark
    state = LabState(lab_hosts, paths, image=image, network=NETWORK, timings=timings)
    if slurm:
        from gpuprov.lab.slurm import ensure_slurm

        mark = time.monotonic()
        ensure_slurm(state, client, progress)
        timings["slurm_s"] = time.monotonic() - mark
    timings["total_s"] = time.monotonic() - started
    progress(f"lab: {len(lab_hosts)} hosts ready in {timings['total_s']:.0f} s; inventory {paths.inventory}")
    return state


def _client():
    import docker

    from gpuprov.core.errors import GpuprovError

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no engine
        raise GpuprovError("no Docker engine answers, so there is no lab", step="lab",
                           hint="run `invoke lab.up` first") from exc
    return client


def status() -> list[LabHost]:
    """Every lab host container (running or not), in name order."""
    from gpuprov.lab.hosts import host_from_container, lab_containers

    return [host_from_container(c) for c in lab_containers(_client())]


def current(paths: LabPaths | None = None) -> LabState | None:
    """The lab that is up now (None when it has no hosts), without changing anything."""
    hosts = status()
    return LabState(hosts, paths or LabPaths.default()) if hosts else None


def stop_host(name: str, *, timeout: int = 10) -> None:
    """Stop one lab host (its systemd shuts down), as if the server went down."""
    from gpuprov.lab.hosts import find_host

    find_host(_client(), name).stop(timeout=timeout)


def start_host(name: str, *, paths: LabPaths | None = None) -> LabHost:
    """Start a stopped lab host, wait until it is ready, and rewrite the inventory (its internal IP
    may have changed)."""
    from gpuprov.lab.hosts import (
        READY_TIMEOUT_S,
        find_host,
        host_from_container,
        lab_containers,
        wait_ready,
        write_files,
    )

    client = _client()
    container = find_host(client, name)
    container.start()
    host = host_from_container(container)
    wait_ready(container, host.port, time.monotonic() + READY_TIMEOUT_S)
    from gpuprov.lab.mirror import mirror_vars, running_mirror

    paths = paths or LabPaths.default()
    hosts = [host_from_container(c) for c in lab_containers(client)]
    mirror = running_mirror(client, paths)
    write_files(hosts, paths, {"mirror": mirror_vars(mirror)} if mirror else None)
    return next(h for h in hosts if h.name == name)


def down(*, images: bool = False, paths: LabPaths | None = None, progress: Progress = _quiet) -> None:
    """Remove the lab's containers, network, inventory and known_hosts (and its images if asked)."""
    import docker

    from gpuprov.lab.hosts import remove_lab
    from gpuprov.lab.images import remove_images

    paths = paths or LabPaths.default()
    try:
        client = docker.from_env()
        client.ping()
    except Exception:  # noqa: BLE001 - no engine: only the files can be left
        client = None
    if client is not None:
        remove_lab(client, paths, progress)
        if images:
            remove_images(client, progress)
    else:
        progress("engine: no Docker engine answers; removing the lab's files only")
        for path in (paths.inventory, paths.known_hosts):
            path.unlink(missing_ok=True)
