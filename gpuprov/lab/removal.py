"""Removing the lab's containers and networks when the engine may still be removing them.

A `lab.down` cut short (Ctrl-C, a timeout) leaves the engine going on with the removals it was asked for: the
container stays listed, as `removing`, and another removal is refused with `409 Conflict: removal of container …
is already in progress` until the first one ends (then the container is gone: 404). Likewise a network keeps the
endpoints of containers still being removed. Each removal here waits that out, bounded, and returns once the
thing is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuprov.core.errors import GpuprovError

REMOVE_TIMEOUT_S = 180
# endpoints go with their containers, which are waited for first: a network still in use after this is in use
NETWORK_TIMEOUT_S = 30
POLL_S = 0.25
# A container in one of these states is never reused: the engine is removing it, or failed to (`dead`).
GONE_STATES = ("removing", "dead")
# What the engine answers while an earlier removal still runs: the container's own removal (409), or a
# network's endpoints of containers that are still going (403).
BUSY = ("already in progress", "active endpoints")


def _busy(exc) -> bool:
    return any(text in str(exc.explanation or exc) for text in BUSY)


def _remove(remove: Callable[[], None], what: str, command: str, hint: str, timeout_s: float,
            host: str | None = None) -> None:
    """Call `remove` until it succeeds or the engine says the thing is gone; an answer in BUSY is retried
    until `timeout_s` has passed, any other refusal is a located error."""
    import docker.errors

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            remove()
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if not _busy(exc):
                raise GpuprovError(f"Docker refused to remove {what}: {exc.explanation or exc}", host=host,
                                   step="lab remove", command=command, hint=hint) from None
            if time.monotonic() >= deadline:
                raise GpuprovError(f"Docker is still removing {what} after {timeout_s:g} s: {exc.explanation}",
                                   host=host, step="lab remove", command=command, hint=hint) from None
        time.sleep(POLL_S)


def remove_container(container, *, timeout_s: float = REMOVE_TIMEOUT_S) -> None:
    """Remove `container` (forced, with its anonymous volumes) and return once the engine no longer has it,
    waiting out a removal already in progress."""
    name = container.name
    _remove(lambda: container.remove(force=True, v=True), f"container {name}", f"docker rm -f -v {name}",
            "read dockerd's log (a storage driver error leaves the container `dead`); once `docker ps -a` no "
            "longer lists it, run the lab command again", timeout_s, host=name)


def remove_network(network, *, timeout_s: float = NETWORK_TIMEOUT_S) -> None:
    """Remove `network` and return once the engine no longer has it, waiting out the endpoints of containers
    that are still being removed."""
    name = network.name
    _remove(network.remove, f"network {name}", f"docker network inspect {name}",
            f"disconnect or remove the containers still attached to it (docker network disconnect -f {name} "
            "CONTAINER), then run the lab command again", timeout_s)
