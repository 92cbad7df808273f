"""Run a command in a container of a built image on the controller's engine.

Every image built from a spec carries gpuprov's suite (the smoke block: /opt/gpuprov/smoke and the
/usr/local/bin/gpuprov-smoke entry point); what a run needs besides (the suite's config) is put into the created
container at /tmp/gpuprov before it starts (`put_archive`). Containers share the host's IPC namespace (DataLoader
workers need more /dev/shm than Docker's 64 MiB); GPU containers also get every GPU, unlimited locked memory and a
64 MiB stack, as a PyTorch job on GPUs needs (NCCL and pinned memory). CPU containers keep the engine's limits:
an engine that may not raise its own (rootless Docker, a sandbox without CAP_SYS_RESOURCE) cannot start a
container with unlimited locked memory.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from dataclasses import dataclass

from gpuprov.core.errors import GpuprovError

INPUTS = "/tmp/gpuprov"
ULIMITS = (("memlock", -1, -1), ("stack", 67108864, 67108864))


@dataclass(frozen=True)
class Ran:
    """A finished container's exit code and output."""

    rc: int
    stdout: str
    stderr: str


def machine_has_gpus() -> bool:
    """Whether this machine has NVIDIA GPUs a container can get (`nvidia-smi -L` lists at least one)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0 and any(line.startswith("GPU ") for line in proc.stdout.splitlines())


def inputs_archive(files: dict[str, bytes]) -> io.BytesIO:
    """A tar of `files` (name -> bytes) under gpuprov/, to unpack in /tmp."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo("gpuprov")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"gpuprov/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def run_in_image(client, image: str, argv: list[str], *, inputs: dict[str, bytes] | None = None,
                 gpus: bool = False, timeout: int = 900, step: str = "image container") -> Ran:
    """Run `argv` (no shell, the image's entry point replaced) in a fresh container of `image`, with `inputs`
    in /tmp/gpuprov; the container is removed afterwards. GpuprovError when it cannot run or outlives
    `timeout`."""
    import docker.errors
    import requests.exceptions
    from docker.types import DeviceRequest, Ulimit

    options: dict = {"environment": {"PYTHONDONTWRITEBYTECODE": "1"}, "ipc_mode": "host"}
    if gpus:
        options["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        options["ulimits"] = [Ulimit(name=n, soft=s, hard=h) for n, s, h in ULIMITS]
    try:
        container = client.containers.create(image, argv[1:], entrypoint=argv[:1], network_disabled=True,
                                             **options)
    except docker.errors.APIError as exc:
        raise GpuprovError(f"cannot create a container of {image}: {exc.explanation or exc}", step=step,
                           hint="is the image built? (invoke images.build --name NAME)") from None
    try:
        if inputs:
            container.put_archive("/tmp", inputs_archive(inputs))
        container.start()
        try:
            rc = int(container.wait(timeout=timeout).get("StatusCode", -1))
        except requests.exceptions.ConnectionError:
            raise GpuprovError(f"the container of {image} ran longer than {timeout} s", step=step,
                               command=" ".join(argv),
                               output=container.logs(tail=30).decode(errors="replace")) from None
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    except docker.errors.APIError as exc:
        raise GpuprovError(f"the container of {image} failed to run: {exc.explanation or exc}", step=step,
                           command=" ".join(argv)) from None
    finally:
        container.remove(force=True)
    return Ran(rc, stdout, stderr)
