"""The Docker engine the lab runs on: connect, or install and start `dockerd` on Debian as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpuprov.core.errors import GpuprovError
from gpuprov.lab.labels import LABEL

DOCKERD_LOG = Path("/var/log/gpuprov-lab-dockerd.log")
APT_PACKAGES = ("docker.io", "debootstrap")
START_TIMEOUT_S = 60


def _client():
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except Exception:  # noqa: BLE001 - any failure here means "no engine answers"
        return None


def container_of(host):
    """The Docker container of a lab host: a LabHost (its container id), a container name or id, or a Container
    itself (anything with `exec_run`)."""
    if hasattr(host, "exec_run"):
        return host
    import docker

    ident = getattr(host, "container_id", None) or getattr(host, "name", None) or str(host)
    return docker.from_env().containers.get(ident)


def find_lab_container(client, name: str, step: str):
    """The lab's container `name` (one with the lab's label), None when there is none; an error at `step` when a
    container of that name is not the lab's."""
    import docker.errors

    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    if container.labels.get(LABEL) != "1":
        raise GpuprovError(f"a container named {name} exists but is not the lab's", step=step,
                           hint=f"remove or rename it (docker rm -f {name})")
    return container


def _is_debian() -> bool:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        return False
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    ids = {fields.get("ID", "").strip('"')} | set(fields.get("ID_LIKE", "").strip('"').split())
    return "debian" in ids


def _run(cmd: list[str], step: str, timeout: int = 900) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise GpuprovError(f"`{cmd[0]}` failed with exit code {proc.returncode}", step=step,
                           command=" ".join(cmd), output=proc.stdout + proc.stderr,
                           hint="fix the package manager problem shown above, then rerun `invoke lab.up`")


def missing_tools() -> list[str]:
    """Debian packages the lab needs whose programs are not installed."""
    programs = {"docker.io": "dockerd", "debootstrap": "debootstrap"}
    return [pkg for pkg in APT_PACKAGES if shutil.which(programs[pkg], path=os.environ.get("PATH", "") +
                                                        ":/usr/sbin:/sbin") is None]


def install_tools(progress: Callable[[str], None]) -> None:
    """apt-get install what is missing (apt-get update first, once, if the install cannot find it)."""
    missing = missing_tools()
    if not missing:
        return
    progress(f"engine: installing {' '.join(missing)} with apt-get")
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    try:
        _run(install, "lab engine: apt-get install")
    except GpuprovError:
        _run(["apt-get", "update"], "lab engine: apt-get update")
        _run(install, "lab engine: apt-get install")


def _start_dockerd(progress: Callable[[str], None]) -> None:
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    progress(f"engine: starting dockerd in the background (log: {DOCKERD_LOG})")
    DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(DOCKERD_LOG, "ab") as log:
        subprocess.Popen([dockerd], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, close_fds=True)


def _log_tail() -> str:
    try:
        return "\n".join(DOCKERD_LOG.read_text(errors="replace").splitlines()[-15:])
    except OSError:
        return ""


def ensure_engine(progress: Callable[[str], None] = print):
    """A docker client whose engine answers; installs and starts one where we are allowed to."""
    client = _client()
    if client is not None:
        return client
    if not (_is_debian() and os.geteuid() == 0):
        raise GpuprovError("no Docker engine answers and this is not Debian as root, so the lab will not "
                           "install one", step="lab engine",
                           hint="start a Docker engine (`sudo systemctl start docker`; on Debian: "
                                "`sudo apt-get install -y docker.io debootstrap && "
                                "sudo setsid dockerd >/var/log/dockerd.log 2>&1 &`), then rerun "
                                "`invoke lab.up`")
    install_tools(progress)
    client = _client()
    if client is not None:
        return client
    _start_dockerd(progress)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        client = _client()
        if client is not None:
            info = client.info()
            progress(f"engine: dockerd {info.get('ServerVersion')} answers "
                     f"(storage driver {info.get('Driver')}, cgroup v{info.get('CgroupVersion')})")
            return client
        time.sleep(0.5)
    raise GpuprovError(f"dockerd did not answer within {START_TIMEOUT_S} s", step="lab engine",
                       command="dockerd", output=_log_tail(),
                       hint=f"read {DOCKERD_LOG}, fix the cause, then rerun `invoke lab.up`")


def verify_runs(client, image: str) -> None:
    """Prove the engine's storage driver and runtime can run a container of `image`."""
    from gpuprov.lab.labels import LABELS

    try:
        output = client.containers.run(image, ["/bin/echo", "gpuprov-lab-ok"], remove=True,
                                       labels=LABELS, network_mode="none")
    except Exception as exc:  # noqa: BLE001 - report any engine failure the same way
        raise GpuprovError(f"the engine cannot run a container: {exc}", step="lab engine",
                           command=f"docker run --rm {image} /bin/echo gpuprov-lab-ok", output=_log_tail(),
                           hint="check the storage driver (`docker info`) and dockerd's log") from exc
    if b"gpuprov-lab-ok" not in output:
        raise GpuprovError("a test container ran but printed nothing", step="lab engine",
                           command=f"docker run --rm {image} /bin/echo gpuprov-lab-ok")
