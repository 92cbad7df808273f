"""Lab hosts: systemd containers with sshd on 127.0.0.1 and one internal network between them."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import os
import shutil
import socket
import tarfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.lab.debian import DEFAULT_RELEASE
from gpuprov.lab.keys import ensure_keypair, render_known_hosts
from gpuprov.lab.labels import (
    HOST_PREFIX,
    HOST_ROLE,
    LABEL,
    LABEL_FILTER,
    LABELS,
    NETWORK,
    PROFILE_LABEL,
    ROLE_LABEL,
)
from gpuprov.lab.profiles import Profile
from gpuprov.lab.removal import GONE_STATES, remove_container, remove_network
from gpuprov.lab.state import LabHost, LabPaths, render_inventory

PORT_LABEL = "gpuprov.lab.ssh-port"
HARDWARE_LABEL = "gpuprov.lab.hardware"
RELEASE_LABEL = "gpuprov.lab.release"   # the host's Debian release (hosts made before releases: bookworm)
PORT_BASE = int(os.environ.get("GPUPROV_LAB_SSH_PORT_BASE", "42200"))
READY_TIMEOUT_S = int(os.environ.get("GPUPROV_LAB_READY_TIMEOUT", "300"))
READY_STATES = ("running", "degraded")
RUN_OPTIONS = {
    "cap_add": ["SYS_ADMIN", "NET_ADMIN"],
    "cgroupns": "host",
    "volumes": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
    "tmpfs": {"/run": "", "/run/lock": ""},
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    # `systemctl reboot` ends PID 1; the engine starts the container again, as a server comes back
    "restart_policy": {"Name": "unless-stopped"},
    # a server's /dev/shm (tmpfs, half its memory) rather than a container's 64 MiB: DataLoader workers and the
    # suite's host.shm (validate.shm_min_gib, 8 GiB by default) need it; a limit, not memory taken
    "shm_size": "8g",
}
# Hosts created with other run options are recreated (reconcile compares this label).
RUN_LABEL = "gpuprov.lab.run"
RUN_DIGEST = hashlib.sha256(json.dumps(RUN_OPTIONS, sort_keys=True).encode()).hexdigest()[:12]


def host_name(index: int) -> str:
    return f"{HOST_PREFIX}{index:02d}"


def host_port(index: int) -> int:
    return PORT_BASE + index


def lab_containers(client) -> list:
    """The lab's host containers (by label and role), running or not, in name order."""
    found = client.containers.list(all=True, filters={"label": [LABEL_FILTER, f"{ROLE_LABEL}={HOST_ROLE}"]})
    return sorted(found, key=lambda c: (len(c.name), c.name))


# The internal network's address plan: a subnet of its own (the first of these Docker accepts: it refuses one that
# overlaps a network it has), each host at a fixed address from its index, dynamic addresses (mirror, registry) from
# the upper half. A host keeps its address when its container restarts, as after a reboot: Docker would otherwise
# hand out the addresses again in the order the containers come back, and swap them under the inventory.
SUBNETS = tuple(f"10.{second}.{third}.0/24" for second in (213, 214) for third in range(0, 256, 16))
HOST_OFFSET = 10
# The subnet the lab gave the network, as a label of its own: the engine's IPAM block is not relied on for it.
SUBNET_LABEL = "gpuprov.lab.subnet"


def ensure_network(client, progress: Callable[[str], None] = print):
    """The lab's internal network (no route out), created once, with a subnet of its own."""
    import docker.errors
    from docker.types import IPAMConfig, IPAMPool

    for network in client.networks.list(names=[NETWORK]):
        if network.name == NETWORK:
            if (network.attrs.get("Labels") or {}).get(LABEL) != "1":
                raise GpuprovError(f"a network named {NETWORK} exists but is not the lab's", step="lab network",
                                   hint=f"remove or rename it (docker network rm {NETWORK})")
            if str(_subnet(network)) in SUBNETS:
                return network
            progress(f"network: replacing {NETWORK} (not on the lab's address plan)")
            try:
                network.remove()
            except docker.errors.APIError as exc:
                raise GpuprovError(f"{NETWORK} was made by an older lab and is still in use: {exc.explanation}",
                                   step="lab network", hint="run `invoke lab.down`, then `invoke lab.up`") from None
    for subnet in SUBNETS:
        base = ipaddress.ip_network(subnet)
        pool = IPAMPool(subnet=subnet, iprange=str(list(base.subnets(new_prefix=base.prefixlen + 1))[1]))
        try:
            network = client.networks.create(NETWORK, driver="bridge", internal=True,
                                             labels={**LABELS, SUBNET_LABEL: subnet}, check_duplicate=True,
                                             ipam=IPAMConfig(pool_configs=[pool]))
        except docker.errors.APIError as exc:
            if "overlap" in str(exc).lower():
                continue
            raise
        progress(f"network: created {NETWORK} (internal, {subnet})")
        return network
    raise GpuprovError(f"every subnet the lab can use for {NETWORK} overlaps a Docker network here", step="lab network",
                       command="docker network ls", hint=f"remove unused networks; the lab tries {', '.join(SUBNETS)}")


def _subnet(network) -> ipaddress.IPv4Network | None:
    """The subnet the lab gave `network` (its label); for a network an older lab made, the engine's IPAM block
    (None where that leaves it out: such a network is replaced)."""
    subnet = (network.attrs.get("Labels") or {}).get(SUBNET_LABEL)
    if not subnet:
        config = (network.attrs.get("IPAM") or {}).get("Config") or []
        subnet = config[0].get("Subnet") if config else None
    try:
        return ipaddress.IPv4Network(subnet) if subnet else None
    except ValueError:
        return None


def host_address(network, index: int) -> str:
    """The fixed internal address of lab host `index` (1, 2, ...): in the lower half of the subnet."""
    subnet = _subnet(network)
    address = subnet.network_address + HOST_OFFSET + index
    if address not in subnet or address >= subnet.network_address + subnet.num_addresses // 2:
        raise GpuprovError(f"lab host {index} has no fixed address left in {subnet}", step="lab network",
                           hint="use fewer lab hosts")
    return str(address)


def port_free(port: int) -> bool:
    """Whether 127.0.0.1:`port` can be bound here (a lab host's sshd is published there)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _host_files(profile: Profile, host_key: bytes, host_pub: str) -> io.BytesIO:
    """Tar of the per-host files put into the container before it boots."""
    files = [("etc/ssh/ssh_host_ed25519_key", host_key, 0o600),
             ("etc/ssh/ssh_host_ed25519_key.pub", (host_pub + "\n").encode(), 0o644),
             ("etc/gpuprov-lab/profile", (profile.name + "\n").encode(), 0o644),
             ("etc/gpuprov-lab/devices.json", json.dumps(profile.devices, indent=1).encode(), 0o644)]
    return tar_files(files)


def tar_files(files: list[tuple[str, bytes, int]]) -> io.BytesIO:
    """A tar (for put_archive) of (path, content, mode) entries."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def host_key_pair(paths: LabPaths, name: str) -> tuple[bytes, str]:
    """The host's own ed25519 host key (created once per lab host name)."""
    private = paths.host_keys / name / "ssh_host_ed25519_key"
    public = ensure_keypair(private, f"root@{name}")
    return private.read_bytes(), public


def create_host(client, index: int, profile: Profile, image: str, paths: LabPaths, network) -> None:
    """Create, fill and start one host container."""
    name, port = host_name(index), host_port(index)
    if not port_free(port):
        raise GpuprovError(f"port 127.0.0.1:{port} is in use", host=name, step="lab host create",
                           hint="free it, or set GPUPROV_LAB_SSH_PORT_BASE to another port range")
    key, pub = host_key_pair(paths, name)
    labels = {**LABELS, ROLE_LABEL: HOST_ROLE, PROFILE_LABEL: profile.name, PORT_LABEL: str(port),
              HARDWARE_LABEL: json.dumps(profile.hardware), RUN_LABEL: RUN_DIGEST, RELEASE_LABEL: profile.release}
    container = client.containers.create(
        image, name=name, hostname=name, detach=True, labels=labels, network="bridge",
        ports={"22/tcp": ("127.0.0.1", port)}, **RUN_OPTIONS)
    container.put_archive("/", _host_files(profile, key, pub))
    network.connect(container, aliases=[name], ipv4_address=host_address(network, index))
    container.start()


def _ssh_banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            return sock.recv(64).startswith(b"SSH-2.0")
    except OSError:
        return False


def wait_ready(container, port: int, deadline: float) -> str:
    """Block until systemd says running/degraded and sshd answers. Returns systemd's state."""
    state = "unknown"
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            logs = container.logs(tail=30).decode(errors="replace")
            raise GpuprovError(f"container stopped while booting (status {container.status})",
                               host=container.name, step="lab host boot", output=logs,
                               hint="check `fs.inotify.max_user_instances` and dockerd's log")
        result = container.exec_run(["systemctl", "is-system-running"])
        state = result.output.decode(errors="replace").strip()
        if state in READY_STATES and _ssh_banner(port):
            return state
        time.sleep(1)
    raise GpuprovError(f"not ready after {READY_TIMEOUT_S} s (systemd: {state})", host=container.name,
                       step="lab host boot", command=f"docker exec {container.name} systemctl --failed",
                       hint="inspect the host with that command, then `invoke lab.down` and retry")


def host_from_container(container) -> LabHost:
    labels = container.labels
    networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
    ip = (networks.get(NETWORK) or {}).get("IPAddress") or None
    return LabHost(name=container.name, profile=labels.get(PROFILE_LABEL, ""), port=int(labels[PORT_LABEL]),
                   internal_ip=ip, container_id=container.id,
                   hardware=json.loads(labels.get(HARDWARE_LABEL, "{}")), state=container.status,
                   release=labels.get(RELEASE_LABEL, DEFAULT_RELEASE))


def write_files(hosts: list[LabHost], paths: LabPaths, lab_vars: dict | None = None) -> None:
    """known_hosts and inventories/lab.yaml for these hosts (lab_vars: the lab group's variables)."""
    entries = []
    for host in hosts:
        pub = (paths.host_keys / host.name / "ssh_host_ed25519_key.pub").read_text(encoding="utf-8")
        entries.append((host.address, host.port, pub.strip()))
    paths.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    paths.known_hosts.write_text(render_known_hosts(entries), encoding="utf-8")
    paths.inventory.parent.mkdir(parents=True, exist_ok=True)
    paths.inventory.write_text(render_inventory(hosts, paths, lab_vars), encoding="utf-8")


def reconcile(client, profiles: list[Profile], images: dict[str, str], paths: LabPaths,
              progress: Callable[[str], None] = print, lab_vars: dict | None = None) -> list[LabHost]:
    """Make the lab exactly len(profiles) running, ready hosts; keep those that already match. `images`: the host
    image of each Debian release (a profile's `release`)."""
    progress = _serialised(progress)
    wanted = {host_name(i + 1): (i + 1, p) for i, p in enumerate(profiles)}
    for name in wanted:
        for other in client.containers.list(all=True, filters={"name": f"^/{name}$"}):
            if other.labels.get(LABEL) != "1":
                raise GpuprovError(f"a container named {name} exists but is not the lab's", host=name,
                                   step="lab host create", hint=f"remove or rename it (docker rm -f {name})")
    network = ensure_network(client, progress)
    keep = []
    for container in lab_containers(client):
        spec = wanted.get(container.name)
        matches = (spec is not None and container.status not in GONE_STATES
                   and container.labels.get(PROFILE_LABEL) == spec[1].name
                   and container.labels.get(RELEASE_LABEL, DEFAULT_RELEASE) == spec[1].release
                   and container.image.tags and images[spec[1].release] in container.image.tags
                   and container.labels.get(PORT_LABEL) == str(host_port(spec[0]))
                   and container.labels.get(RUN_LABEL) == RUN_DIGEST
                   and (paths.host_keys / container.name / "ssh_host_ed25519_key.pub").exists())
        if matches:
            keep.append(container.name)
            if container.status != "running":
                container.start()
        else:
            progress(f"host {container.name}: removing (not part of the requested lab)")
            remove_container(container)
    to_create = [(i, p) for name, (i, p) in wanted.items() if name not in keep]

    def create(item):
        index, profile = item
        create_host(client, index, profile, images[profile.release], paths, network)
        progress(f"host {host_name(index)}: started ({profile.name}, Debian {profile.release}, "
                 f"ssh 127.0.0.1:{host_port(index)})")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, to_create))
    for name in keep:
        progress(f"host {name}: reused")
    deadline = time.monotonic() + READY_TIMEOUT_S

    def ready(name):
        container = client.containers.get(name)
        state = wait_ready(container, host_port(wanted[name][0]), deadline)
        container.reload()
        progress(f"host {name}: ready (systemd {state})")
        return host_from_container(container)

    with ThreadPoolExecutor(max_workers=16) as pool:
        hosts = list(pool.map(ready, wanted))
    write_files(hosts, paths, lab_vars)
    return hosts


def find_host(client, name: str):
    import docker.errors

    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        container = None
    if container is None or container.labels.get(LABEL) != "1" or container.labels.get(ROLE_LABEL) != HOST_ROLE:
        raise InputError(f"no lab host named {name}", step="lab", hint="see `invoke lab.status`")
    return container


def remove_lab(client, paths: LabPaths, progress: Callable[[str], None] = print) -> None:
    """Remove every labelled container (hosts and lab services) and network, and the lab's files;
    nothing else."""
    for container in client.containers.list(all=True, filters={"label": LABEL_FILTER}):
        remove_container(container)
        progress(f"host {container.name}: removed")
    for network in client.networks.list(filters={"label": LABEL_FILTER}):
        remove_network(network)
        progress(f"network {network.name}: removed")
    for path in (paths.inventory, paths.known_hosts):
        path.unlink(missing_ok=True)
    shutil.rmtree(paths.host_keys, ignore_errors=True)


def _serialised(progress: Callable[[str], None]) -> Callable[[str], None]:
    """`progress` made safe to call from the worker threads (one whole line at a time)."""
    lock = threading.Lock()

    def emit(line: str) -> None:
        with lock:
            progress(line)

    return emit
