"""host.container: the configured container runtime sees every GPU of the host.

Runs `RUNTIME run --rm --gpus all IMAGE nvidia-smi -L` (the config's `container`: `{"runtime": "docker",
"image": "..."}`) and compares the GPUs listed inside with the host's own `nvidia-smi -L` (by UUID). It fails when
the runtime cannot start a GPU container (no NVIDIA container toolkit hook, "could not select device driver"), or
when the container sees fewer GPUs than the host. No container config: skip.

When the suite itself runs in the container (`invoke validate --image`: the config's `container.inside`), the
controller started that container with `--gpus all`; the check compares the GPUs this container lists with the
host's (`container.host_uuids`, from the host's facts), since no container engine is reachable from inside.
"""

from __future__ import annotations

import time

from . import nvsmi
from .core import FAIL, PASS, SKIP, Result, check

NAME = "host.container"
RUN_TIMEOUT = 240


def container_argv(runtime: str, image: str) -> list[str]:
    """The command that lists the GPUs from inside a container."""
    return [runtime, "run", "--rm", "--gpus", "all", image, "nvidia-smi", "-L"]


@check(NAME, timeout=300)
@nvsmi.smi_check(NAME)
def run(ctx, start: float) -> Result:
    config = ctx.config.get("container") or {}
    runtime, image = config.get("runtime") or "docker", config.get("image")
    if not config or not image:
        return Result(NAME, SKIP, "no container runtime and image configured for this host", {},
                      {"container": config or None})
    if config.get("inside"):
        return _inside(ctx, runtime, image, config.get("host_uuids") or [], start)
    rc, out, err = ctx.run(nvsmi.LIST_ARGV, timeout=30)
    if rc != 0:
        raise nvsmi.classify_failure(rc, out, err)
    host = nvsmi.parse_list(out)
    argv = container_argv(runtime, image)
    rc, out, err = ctx.run(argv, timeout=RUN_TIMEOUT)
    inside = nvsmi.parse_list(out) if rc == 0 else []
    figures = {"runtime": runtime, "image": image, "host_gpus": len(host), "container_gpus": len(inside),
               "exit_code": rc}
    thresholds = {"container_gpus": len(host)}
    seconds = time.monotonic() - start
    command = " ".join(argv)
    if rc == 127:
        return Result(NAME, FAIL, f"{runtime} is not installed ({command})", figures, thresholds, seconds)
    if rc != 0:
        detail = (err.strip() or out.strip()).splitlines()
        return Result(NAME, FAIL, f"`{command}` failed (exit {rc}): {detail[-1][:300] if detail else 'no output'}",
                      figures, thresholds, seconds)
    missing = sorted({g["uuid"] for g in host} - {g["uuid"] for g in inside})
    if missing or len(inside) < len(host):
        return Result(NAME, FAIL, f"the container sees {len(inside)} of the host's {len(host)} GPUs"
                      + (f" (missing {', '.join(missing)})" if missing else ""), figures, thresholds, seconds)
    if not host:
        return Result(NAME, FAIL, "the host's nvidia-smi -L lists no GPU", figures, thresholds, seconds)
    return Result(NAME, PASS, f"{runtime} with {image} sees all {len(host)} GPUs", figures, thresholds, seconds)


def _inside(ctx, runtime: str, image: str, host_uuids: list[str], start: float) -> Result:
    """The suite runs in the container the controller started with --gpus all: it must list every host GPU."""
    rc, out, err = ctx.run(nvsmi.LIST_ARGV, timeout=30)
    inside = nvsmi.parse_list(out) if rc == 0 else []
    figures = {"runtime": runtime, "image": image, "host_gpus": len(host_uuids), "container_gpus": len(inside),
               "exit_code": rc, "inside": True}
    thresholds = {"container_gpus": len(host_uuids)}
    seconds = time.monotonic() - start
    where = f"in the {runtime} container of {image} (--gpus all)"
    if rc != 0:
        detail = (err.strip() or out.strip()).splitlines()
        return Result(NAME, FAIL, f"nvidia-smi -L failed {where} (exit {rc}): "
                                  f"{detail[-1][:300] if detail else 'no output'}", figures, thresholds, seconds)
    if not host_uuids:
        return Result(NAME, SKIP, f"{len(inside)} GPUs {where}; the host's GPUs are not known to compare with",
                      figures, thresholds, seconds)
    missing = sorted(set(host_uuids) - {g["uuid"] for g in inside})
    if missing:
        return Result(NAME, FAIL, f"the container sees {len(inside)} of the host's {len(host_uuids)} GPUs "
                                  f"(missing {', '.join(missing)})", figures, thresholds, seconds)
    return Result(NAME, PASS, f"{runtime} with {image} sees all {len(host_uuids)} GPUs (the suite ran inside it)",
                  figures, thresholds, seconds)
