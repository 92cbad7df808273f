"""The lab registry: Debian's `docker-registry` package (the Docker Distribution registry) in a lab container.

The controller pushes to it on 127.0.0.1 only (`127.0.0.1:<port>`, which Docker trusts without TLS, as it trusts
every registry on a loopback address); lab hosts pull from it over the lab's internal network (`<ip>:5000`), and
their Docker is told to trust that address as an insecure registry (`insecure-registries` in
/etc/docker/daemon.json, the other keys kept; a running dockerd reloads it on SIGHUP).

The package and what the lab base image lacks for it are downloaded once with `apt-get download`
(gpuprov.lab.debian), installed with dpkg into `gpuprov-lab/registry:<content hash>` (no network in the build),
and served with a config of the lab's own: filesystem storage, no authentication (the Debian default config names
an htpasswd file the package does not ship).

    ensure_registry(paths=None, client=None) -> RegistryInfo    build the image if needed, (re)start the container
    trust_registry(hosts, address)                              lab hosts' Docker trusts `address`
"""

from __future__ import annotations

import io
import os
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuprov.core.errors import GpuprovError
from gpuprov.lab.engine import find_lab_container
from gpuprov.lab.labels import IMAGE_LABELS, LABELS, NETWORK, REGISTRY_REPO, ROLE_LABEL
from gpuprov.lab.removal import GONE_STATES, remove_container
from gpuprov.lab.state import LabPaths

REGISTRY_NAME = "gpuprov-lab-registry"
PACKAGES = ("docker-registry",)
INTERNAL_PORT = 5000
PORT = int(os.environ.get("GPUPROV_LAB_REGISTRY_PORT", "42190"))
READY_TIMEOUT_S = 30
CONFIG = """\
version: 0.1
log:
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: /var/lib/docker-registry
  delete:
    enabled: true
http:
  addr: :5000
"""
# dpkg runs the package's postinst, which starts the service through invoke-rc.d: policy-rc.d says "not here".
DOCKERFILE = """\
FROM {base}
COPY debs /tmp/debs
COPY config.yml /tmp/config.yml
RUN set -eu; \\
    printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d; chmod 0755 /usr/sbin/policy-rc.d; \\
    dpkg -i /tmp/debs/*.deb; \\
    install -m 0644 /tmp/config.yml /etc/docker/registry/config.yml; \\
    rm -rf /tmp/debs /tmp/config.yml /usr/sbin/policy-rc.d
USER docker-registry
EXPOSE 5000
CMD ["/usr/bin/docker-registry", "serve", "/etc/docker/registry/config.yml"]
"""
# Runs inside a lab host as root: add the address to daemon.json's insecure-registries, keep every other key.
TRUST_SCRIPT = r'''
import json, os, sys
path, address = "/etc/docker/daemon.json", sys.argv[1]
try:
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
except FileNotFoundError:
    config = {}
registries = config.setdefault("insecure-registries", [])
if address not in registries:
    registries.append(address)
    os.makedirs("/etc/docker", exist_ok=True)
    with open(path + ".gpuprov", "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
        handle.write("\n")
    os.replace(path + ".gpuprov", path)
'''
Progress = Callable[[str], None]


@dataclass(frozen=True)
class RegistryInfo:
    """Where the registry answers: `push` from the controller, `pull` from lab hosts."""

    push: str
    pull: str
    image: str
    version: str


def _quiet(_: str) -> None:
    """A progress sink that shows nothing."""


def _context(base: str, debs: list) -> io.BytesIO:
    """The registry image's build context: Dockerfile, config and the .debs."""
    files = {"Dockerfile": DOCKERFILE.format(base=base).encode(), "config.yml": CONFIG.encode()}
    files.update({f"debs/{deb.path.name}": deb.path.read_bytes() for deb in debs})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def ensure_image(paths: LabPaths, client, progress: Progress = _quiet) -> tuple[str, str]:
    """The registry image (built once per package set and base image): (tag, docker-registry version)."""
    import docker.errors

    from gpuprov.lab.debian import cached_debian_debs, ensure_debian_debs
    from gpuprov.lab.images import _image_exists, _short_hash, base_tag, ensure_base_image

    base = ensure_base_image(client, progress)
    try:
        debs = ensure_debian_debs(paths, client, base, names=PACKAGES, progress=progress)
    except GpuprovError as exc:
        debs = cached_debian_debs(paths, names=PACKAGES)
        if debs is None:
            raise
        progress(f"registry: using the packages downloaded before ({exc})")
    version = str(debs.version("docker-registry"))
    tag = f"{REGISTRY_REPO}:{_short_hash(base.encode(), DOCKERFILE.encode(), CONFIG.encode(), debs.digest().encode())}"
    if _image_exists(client, tag):
        return tag, version
    progress(f"registry: building {tag} (docker-registry {version} from Debian, on {base_tag()})")
    try:
        client.images.build(fileobj=_context(base, list(debs.debs)), custom_context=True, tag=tag,
                            labels=IMAGE_LABELS, rm=True, forcerm=True, pull=False, network_mode="none")
    except docker.errors.BuildError as exc:
        log = "".join(str(item.get("stream", item.get("error", ""))) for item in exc.build_log)
        raise GpuprovError(f"building the registry image failed: {exc.msg}", step="lab registry",
                           command=f"docker build -t {tag}", output=log,
                           hint="read the build output above; `invoke lab.down --images` starts over") from exc
    return tag, version


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 - a fixed http URL of the lab
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_ready(container, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            break
        if _answers(url):
            return
        time.sleep(0.3)
    raise GpuprovError(f"the lab registry does not answer {url} (status {container.status})", step="lab registry",
                       command=f"docker logs {REGISTRY_NAME}", output=container.logs(tail=30).decode(errors="replace"),
                       hint="read the logs above, then `invoke lab.down` and start the registry again")


def ensure_registry(*, paths: LabPaths | None = None, client=None, network: str = NETWORK,
                    progress: Progress = _quiet) -> RegistryInfo:
    """The lab registry serving on 127.0.0.1:PORT (the controller) and <ip>:5000 on the lab network (the hosts):
    its image built if needed, its container (re)created when the image changed."""
    from gpuprov.lab.engine import ensure_engine
    from gpuprov.lab.hosts import ensure_network

    paths = paths or LabPaths.default()
    client = client or ensure_engine(progress)
    tag, version = ensure_image(paths, client, progress)
    lab_network = ensure_network(client, progress)
    container = find_lab_container(client, REGISTRY_NAME, "lab registry")
    if container is not None and (container.status in GONE_STATES or tag not in (container.image.tags or [])):
        progress(f"registry: replacing {REGISTRY_NAME} (its image changed, or the engine is removing it)")
        remove_container(container)
        container = None
    if container is None:
        container = client.containers.create(
            tag, name=REGISTRY_NAME, hostname=REGISTRY_NAME, detach=True,
            labels={**LABELS, ROLE_LABEL: "registry"}, network="bridge",
            ports={f"{INTERNAL_PORT}/tcp": ("127.0.0.1", PORT)}, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], restart_policy={"Name": "unless-stopped"})
        lab_network.connect(container, aliases=[REGISTRY_NAME])
        progress(f"registry: created {REGISTRY_NAME} from {tag}")
    container.reload()
    if container.status != "running":
        container.start()
    push = f"127.0.0.1:{PORT}"
    _wait_ready(container, f"http://{push}/v2/")
    container.reload()
    ip = (((container.attrs.get("NetworkSettings") or {}).get("Networks") or {}).get(network) or {}).get("IPAddress")
    if not ip:
        raise GpuprovError(f"{REGISTRY_NAME} has no address on {network}", step="lab registry",
                           command=f"docker inspect {REGISTRY_NAME}", hint="`invoke lab.down`, then `invoke lab.up`")
    info = RegistryInfo(push=push, pull=f"{ip}:{INTERNAL_PORT}", image=tag, version=version)
    progress(f"registry: docker-registry {version} answers at {info.push} (controller) and {info.pull} (lab hosts)")
    return info


def trust_registry(hosts: Iterable, address: str, client=None) -> None:
    """Each lab host's Docker trusts `address` as an insecure (plain HTTP) registry: daemon.json gets it, and a
    running dockerd reloads its configuration. `hosts`: LabHosts (or anything with a container_id)."""
    import docker

    client = client or docker.from_env()
    for host in hosts:
        container = client.containers.get(host.container_id)
        for command in (["python3", "-c", TRUST_SCRIPT, address],
                        ["sh", "-c", "if systemctl is-active --quiet docker; then systemctl reload docker; fi"]):
            result = container.exec_run(command)
            if result.exit_code != 0:
                raise GpuprovError(f"cannot make Docker trust the lab registry {address}", host=container.name,
                                   step="lab registry", command=" ".join(command[:2]),
                                   output=result.output.decode(errors="replace"),
                                   hint="look at /etc/docker/daemon.json on the host")

