"""The lab itself: real SSH with verified host keys, simulated PCI devices, the internal network,
and a `lab.down` that removes only what the lab made."""

from __future__ import annotations

import ipaddress
import re
import threading
import time
import uuid

import paramiko
import pytest
import yaml
from labutil import docker_networks, on_host

import gpuprov.lab
from gpuprov.lab import profiles as lab_profiles
from gpuprov.lab.labels import LABEL, LABELS, NETWORK

pytestmark = pytest.mark.lab


def connect(lab, host, user="root") -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(lab.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(host.address, port=host.port, username=user, key_filename=str(lab.key),
                   look_for_keys=False, allow_agent=False, timeout=10)
    return client


def run(client: paramiko.SSHClient, command: str, timeout: int = 120) -> tuple[int, str, str]:
    _, stdout, stderr = client.exec_command(command, timeout=timeout)
    out, err = stdout.read().decode(), stderr.read().decode()
    return stdout.channel.recv_exit_status(), out, err


def test_every_host_answers_ssh_with_the_lab_key_and_verified_host_key(lab):
    assert [h.profile for h in lab.hosts] == ["hgx-h100", "l40s", "a100-pcie"]
    for host in lab.hosts:
        with connect(lab, host) as client:
            rc, out, _ = run(client, "hostname; systemctl is-system-running")
            assert rc in (0, 1)
            name, state = out.split()
            assert name == host.name and state in ("running", "degraded")


def test_host_keys_differ_per_host(lab):
    keys = set()
    for host in lab.hosts:
        transport = paramiko.Transport((host.address, host.port))
        try:
            transport.start_client(timeout=10)
            keys.add(transport.get_remote_server_key().get_base64())
        finally:
            transport.close()
    assert len(keys) == len(lab.hosts)


def test_unknown_host_key_is_rejected(lab, tmp_path):
    (tmp_path / "known_hosts").write_text("")
    client = paramiko.SSHClient()
    client.load_host_keys(str(tmp_path / "known_hosts"))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        client.connect("127.0.0.1", port=lab.hosts[0].port, username="root", key_filename=str(lab.key),
                       look_for_keys=False, allow_agent=False, timeout=10)


def test_sudo_user_has_passwordless_sudo(lab):
    with connect(lab, lab.hosts[0], user="gpuadmin") as client:
        rc, out, err = run(client, "sudo -n id -u")
        assert (rc, out.strip()) == (0, "0"), err


@pytest.mark.parametrize("index", [0, 1, 2])
def test_lspci_stand_in_prints_the_profiles_devices(lab, index):
    host = lab.hosts[index]
    profile = lab_profiles.load_profiles()[host.profile]
    with connect(lab, host, user="gpuadmin") as client:
        rc, out, err = run(client, "lspci -nn -d 10de:")
        assert rc == 0, err
        rc_all, everything, _ = run(client, "lspci -Dnn")
    lines = out.splitlines()
    gpu_id = f"[10de:{profile.gpu_devices()[0]['device']}]"
    assert sum(gpu_id in line for line in lines) == profile.hardware["count"] == host.hardware["count"]
    assert sum("[10de:22a3]" in line for line in lines) == (4 if profile.hardware["nvswitch"] else 0)
    assert all(re.match(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] ", line) for line in lines)
    assert rc_all == 0 and any("[8086:" in line for line in everything.splitlines())
    assert all(line.startswith("0000:") for line in everything.splitlines())


def test_hosts_reach_each_other_over_the_internal_network(lab):
    first, second = lab.hosts[0], lab.hosts[1]
    assert first.internal_ip and second.internal_ip and first.internal_ip != second.internal_ip
    probe = f"python3 -c \"import socket; socket.create_connection(('{second.internal_ip}', 22), 5).close()\""
    with connect(lab, first) as client:
        rc, _, err = run(client, probe)
        assert rc == 0, err
        rc, out, _ = run(client, f"getent hosts {second.name}")
        assert rc == 0 and out.split()[0] == second.internal_ip


def test_hosts_reach_only_the_lab_mirror(lab):
    """An air-gapped site: no Debian mirror configured, the lab mirror answers over the internal network."""
    mirror = yaml.safe_load(lab.inventory.read_text())["groups"]["lab"]["vars"]["mirror"]
    with connect(lab, lab.hosts[2]) as client:
        rc, out, err = run(client, "apt-get -q update >/dev/null && grep -rhs '^deb ' /etc/apt/sources.list "
                                   "/etc/apt/sources.list.d; true", timeout=120)
        assert rc == 0, err
        assert all(mirror["url"] in line for line in out.splitlines())
        rc, out, err = run(client, f"curl -fsS {mirror['url']}InRelease | head -n 1")
    assert rc == 0, err
    assert out.startswith("-----BEGIN PGP SIGNED MESSAGE-----")


def test_inventory_describes_the_hosts(lab):
    doc = yaml.safe_load(lab.inventory.read_text())
    assert (lab.inventory.parent / doc["known_hosts"]).resolve() == lab.known_hosts.resolve()
    assert doc["defaults"]["identity_file"] == str(lab.key)
    for host in lab.hosts:
        entry = doc["hosts"][host.name]
        assert entry["port"] == host.port and entry["address"] == "127.0.0.1"
        assert entry["groups"] == ["lab", host.profile]
        # the default lab's hosts run Debian 12 (what their own /etc/os-release says, asked through docker exec)
        release = on_host(lab, host.name, ". /etc/os-release && echo $VERSION_CODENAME").strip()
        assert release == "bookworm"
        assert entry["vars"]["lab"] == {"profile": host.profile, "internal_ip": host.internal_ip, "release": release}
        assert entry["vars"]["hardware"] == host.hardware
    # Docker on the HGX hosts only (profiles.yaml): lab tests cover hosts with and without a container engine
    assert doc["groups"]["hgx-h100"]["vars"] == {"container_engine": "docker"}
    assert doc["groups"]["l40s"]["vars"] == {} and doc["groups"]["a100-pcie"]["vars"] == {}


def test_stop_and_start_host(lab):
    name = lab.hosts[2].name
    gpuprov.lab.stop_host(name)
    assert {h.name: h.state for h in gpuprov.lab.status()}[name] == "exited"
    with pytest.raises(OSError):
        connect(lab, lab.hosts[2]).close()
    host = gpuprov.lab.start_host(name)
    assert host.state == "running"
    with connect(lab, host) as client:
        assert run(client, "hostname")[1].strip() == name
    doc = yaml.safe_load(lab.inventory.read_text())
    assert doc["hosts"][name]["vars"]["lab"]["internal_ip"] == host.internal_ip


def test_unknown_host_is_bad_input(lab):
    from gpuprov.core.errors import InputError

    with pytest.raises(InputError):
        gpuprov.lab.stop_host("gpuprov-lab-99")


def test_the_networks_the_tests_firewall_for_are_the_ones_lab_hosts_see(lab):
    """labutil.docker_networks (the SSH sources of the harden and monitoring tests): its gateway is where the
    controller's SSH connections come from on every host (sshd's SSH_CONNECTION), and its internal subnet holds
    each host's own address on the internal network."""
    gateway, internal = docker_networks(NETWORK)
    for host in lab.hosts:
        with connect(lab, host) as client:
            rc, out, err = run(client, "echo $SSH_CONNECTION; hostname -I")
        assert rc == 0, err
        connection, addresses = out.splitlines()
        assert connection.split()[0] == gateway
        assert [a for a in addresses.split() if ipaddress.ip_address(a) in ipaddress.ip_network(internal)] == [
            host.internal_ip]


def test_a_removal_the_engine_still_runs_is_waited_out(lab):
    """What a `lab.down` cut short (Ctrl-C, a timeout) leaves: the engine still removing a container (here one
    whose writable layer holds many files, so that the removal lasts). Removing it again meets Docker's 409
    "already in progress" (what `lab.up --fresh` failed on), waits that removal out, and returns once the
    container is gone."""
    import docker

    from gpuprov.lab.removal import remove_container

    client = docker.from_env()
    name = f"gpuprov-lab-removal-{uuid.uuid4().hex[:8]}"
    container = client.containers.run(lab.image, ["sleep", "infinity"], name=name, labels=LABELS,
                                      network_mode="none", detach=True)
    filled = container.exec_run(["sh", "-c", "mkdir /fill && cd /fill && seq 150000 | xargs touch"])
    assert filled.exit_code == 0, filled.output
    failures = []

    def cut_short_down():   # the removal the interrupted `lab.down` asked for: the engine goes on with it
        try:
            client.api.remove_container(container.id, force=True, v=True)
        except docker.errors.APIError as exc:
            failures.append(exc)

    def status() -> str:
        try:
            return client.api.inspect_container(container.id)["State"]["Status"]
        except docker.errors.NotFound:
            return "gone"

    engine = threading.Thread(target=cut_short_down)
    engine.start()
    try:
        deadline = time.monotonic() + 60
        while (now := status()) != "removing":
            assert now != "gone" and time.monotonic() < deadline, f"the removal never showed as in progress: {now}"
            time.sleep(0.01)
        with pytest.raises(docker.errors.APIError, match="already in progress"):
            container.remove(force=True, v=True)
        remove_container(container)
        assert status() == "gone"
    finally:
        engine.join(timeout=300)
        if status() != "gone":
            client.api.remove_container(container.id, force=True, v=True)
    assert failures == []


def test_down_removes_only_labelled_things_then_up_again(lab):
    import docker

    client = docker.from_env()
    tag = uuid.uuid4().hex[:8]
    network = client.networks.create(f"not-lab-{tag}", internal=True)
    container = client.containers.create(lab.image, ["sleep", "infinity"], name=f"not-lab-{tag}",
                                         network_mode="none")
    try:
        gpuprov.lab.down(paths=lab.paths)
        assert client.containers.list(all=True, filters={"label": f"{LABEL}=1"}) == []
        assert client.networks.list(filters={"label": f"{LABEL}=1"}) == []
        assert not lab.inventory.exists() and not lab.known_hosts.exists()
        client.networks.get(network.id)
        client.containers.get(container.id)
        client.images.get(lab.image)
    finally:
        container.remove(force=True)
        network.remove()
    again = gpuprov.lab.up(len(lab.hosts), [h.profile for h in lab.hosts], paths=lab.paths)
    assert [h.name for h in again.hosts] == [h.name for h in lab.hosts]
    lab.hosts[:] = again.hosts
