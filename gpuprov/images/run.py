"""`images.run`: start an image on a provisioned host with the flags a PyTorch job needs.

Before anything is pulled, the host's driver (from its facts: the loaded module, else nvidia-smi's) is compared
with the image's io.gpuprov.min-driver; an older driver (or none) refuses the run naming both versions, unless
the host's stack uses CUDA forward compatibility (its lock's `forward_compat`, else the inventory's
`stack.forward_compat`). Then, over the host's one SSH connection, as root, every value shell-quoted:

    docker pull IMAGE
    docker run --rm|--detach --name NAME [--gpus all] [--device=/dev/infiniband --cap-add=IPC_LOCK]
        --ipc=host|--shm-size=SIZE [--ulimit memlock=-1] --ulimit stack=67108864 [-v DATA:DATA] [-v OUTPUT:OUTPUT]
        IMAGE [CMD...]

`--gpus all` is given where the host's facts show GPUs; the RDMA devices (/dev/infiniband: uverbs, rdma_cm) and
IPC_LOCK (to register, pin, the memory RDMA reads and writes) where the host has them, so that NCCL in the container
can use InfiniBand or RoCE (the image brings the RDMA libraries: rdma-core's libibverbs and its providers).
Inventory variables read here (declared by gpuprov.images.variables and checked when the inventory is loaded, so
`run_vars` only reads them):

    data_dir: /data               mounted at the same path (validate's data folder too)
    images:
      registry: 10.0.0.5:5000     where the host pulls images from (images.run --registry wins)
      output_dir: /srv/out        mounted at the same path
      shm_size: 64g               a sized /dev/shm instead of the host's IPC namespace (--ipc=host)
      memlock: 8388608            the locked-memory limit in bytes, where the engine may not lift it (rootless
                                  Docker, an engine without CAP_SYS_RESOURCE); null: no --ulimit memlock, the
                                  engine's own limit (as validate.image_ulimits' null); default unlimited (-1)
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.images.labels import MIN_DRIVER

STACK_BYTES = 67108864
RDMA_DEVICES = "/dev/infiniband"
RDMA_FLAGS = [f"--device={RDMA_DEVICES}", "--cap-add=IPC_LOCK"]
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class RunVars:
    """A host's images.run settings: its inventory variables (checked at load) with their defaults."""

    registry: str | None = None
    data_dir: str | None = None
    output_dir: str | None = None
    shm_size: str | None = None
    memlock: int | None = -1        # None: the engine's own limit (no --ulimit memlock)


def run_vars(host) -> RunVars:
    """The host's `data_dir` and `images` variables (checked when the inventory was loaded:
    gpuprov.images.variables) with their defaults."""
    values = host.vars.get("images") or {}
    return RunVars(registry=values.get("registry"), data_dir=host.vars.get("data_dir"),
                   output_dir=values.get("output_dir"), shm_size=values.get("shm_size"),
                   memlock=values.get("memlock", -1))


FACTS = ("loaded_driver_version", "nvidia_smi")   # what the driver check and `--gpus all` read


def has_gpus(facts: dict) -> bool:
    return bool((facts.get("nvidia_smi") or {}).get("gpus"))


def check_driver(host: str, image: str, facts: dict, min_driver: str | None, forward_compat: bool) -> str | None:
    """None when the host's driver runs `image`, or a note when it runs it through forward compatibility only;
    GpuprovError naming both versions when the driver is older than the image's minimum (or missing)."""
    from gpuprov.stack.check import host_driver
    from gpuprov.stack.data import at_least

    if not min_driver:
        return None
    driver = host_driver(facts)
    if driver is not None and at_least(driver, min_driver):
        return None
    if driver is not None and forward_compat:
        return (f"driver {driver} is older than {min_driver} ({MIN_DRIVER} of {image}); the host's stack "
                "uses CUDA forward compatibility")
    found = (f"the host's driver {driver} is older than {min_driver}, the image's {MIN_DRIVER}" if driver else
             f"the host has no NVIDIA driver loaded; the image needs {min_driver} or newer ({MIN_DRIVER})")
    raise GpuprovError(f"refused before pulling {image}: {found}", host=host, step="images.run",
                       hint="provision a newer driver (stack.driver in the inventory, then invoke provision), run an "
                            "image built for an older CUDA, or, on data center GPUs, use CUDA forward compatibility "
                            "(stack.forward_compat: true)")


def check_container(name: str | None) -> None:
    """--container: a name Docker accepts ([a-zA-Z0-9][a-zA-Z0-9_.-]*); InputError otherwise."""
    if name is not None and not _CONTAINER.fullmatch(str(name)):
        raise InputError(f"--container must be a container name (letters, digits, _ . -), not {name!r}",
                         step="images.run")


def container_name(name: str) -> str:
    """A fresh container name for a run of spec `name`: gpuprov-NAME-YYYYmmddTHHMMSS."""
    return f"gpuprov-{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"


def docker_run_argv(image: str, *, container: str, gpus: bool, settings: RunVars, detach: bool,
                    command: list[str], rdma: bool = False) -> list[str]:
    """The `docker run` words: the job's flags (the RDMA devices and IPC_LOCK where `rdma`), the mounts, the image
    and its command."""
    argv = ["docker", "run", "--detach" if detach else "--rm", "--name", container]
    argv += ["--gpus", "all"] if gpus else []
    argv += RDMA_FLAGS if rdma else []
    argv += [f"--shm-size={settings.shm_size}"] if settings.shm_size else ["--ipc=host"]
    argv += ["--ulimit", f"memlock={settings.memlock}"] if settings.memlock is not None else []
    argv += ["--ulimit", f"stack={STACK_BYTES}"]
    for folder in (settings.data_dir, settings.output_dir):
        if folder:
            argv += ["-v", f"{folder}:{folder}"]
    return [*argv, image, *command]


def has_rdma(conn) -> bool:
    """Whether the host has RDMA devices (InfiniBand or RoCE: /dev/infiniband/uverbs*) to give a container."""
    found = conn.run(f"ls -A {RDMA_DEVICES} 2>/dev/null", sudo=False, timeout=60)
    return found.rc == 0 and any(name.startswith("uverbs") for name in found.stdout.split())


def shell_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in argv)


@dataclass
class Started:
    """What images.run did on one host."""

    host: str
    image: str
    container: str
    command: str
    rc: int
    stdout: str
    stderr: str
    note: str | None = None

    def to_dict(self) -> dict:
        return {"host": self.host, "image": self.image, "container": self.container, "command": self.command,
                "rc": self.rc, "stdout": self.stdout, "stderr": self.stderr, "note": self.note}


def run_image(conn, image: str, *, min_driver: str | None, forward_compat: bool, settings: RunVars,
              container: str, detach: bool, command: list[str], say=lambda what: None) -> Started:
    """On one connected host: facts, the driver check, then pull and run (GpuprovError when either fails)."""
    from gpuprov.facts.gather import gather

    name = conn.host.name
    say("facts")
    facts = gather(conn, facts=FACTS)
    note = check_driver(name, image, facts, min_driver, forward_compat)
    say(f"pull {image}")
    pull = conn.run(shell_line(["docker", "pull", image]), sudo=True, timeout=1800)
    if pull.rc != 0:
        raise GpuprovError(f"docker pull failed (exit {pull.rc})", host=name, step="images.run",
                           command=pull.shown_command(), output=pull.stderr or pull.stdout,
                           hint="check that the host reaches the registry (images.registry, an insecure registry "
                                "needs Docker's insecure-registries) and that the image was pushed")
    line = shell_line(docker_run_argv(image, container=container, gpus=has_gpus(facts), settings=settings,
                                      detach=detach, command=command, rdma=has_rdma(conn)))
    say("run")
    ran = conn.run(line, sudo=True, timeout=None)
    if ran.rc != 0:
        output = (ran.stderr + "\n" + ran.stdout).strip()
        hint = ("the engine may not lift the locked-memory limit (rootless Docker, no CAP_SYS_RESOURCE): set the "
                "host's images.memlock to its limit in bytes" if "error setting rlimit type 8" in output else
                "exit code 125 is Docker's own (the flags or the engine); others are the command's")
        raise GpuprovError(f"the container exited with code {ran.rc}", host=name, step="images.run",
                           command=ran.shown_command(), output=output, hint=hint)
    return Started(name, image, container, ran.shown_command(), ran.rc, ran.stdout, ran.stderr, note)
