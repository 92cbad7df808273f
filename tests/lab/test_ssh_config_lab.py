"""OpenSSH's client config reaching lab hosts: an inventory that names only `gpu-a` and `gpu-b`, and a ssh_config
that says where they are, as operators write one: `gpu-a` an alias of the first lab host's published port,
`gpu-b` the second lab host's internal address reached through `gpu-a` (ProxyJump), both logging in with a key in
PEM format (`ssh-keygen -m PEM`, the EC key paramiko used to refuse as `expected OPENSSH key`). The session's bare
hosts are used as they are: facts and hostname change nothing on them. Host keys are verified: the known_hosts
file names the second host by its internal address, with the key the lab recorded for its published port."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from labutil import invoke, on_host

from gpuprov.core.executor import Settings, run_on_hosts
from gpuprov.inventory import load_inventory
from gpuprov.inventory.ssh_config import apply_ssh_config

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """(the ssh_config, the inventory, the known_hosts file, the two lab hosts): the first two of the session's."""
    first, second = lab.hosts[0], lab.hosts[1]
    folder = tmp_path_factory.mktemp("ssh_config")
    key = folder / "id_ecdsa_pem"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-m", "PEM", "-N", "", "-C", "gpuprov-ssh-config-test",
                    "-f", str(key)], check=True)
    assert key.read_text().startswith("-----BEGIN EC PRIVATE KEY-----")
    public = Path(f"{key}.pub").read_text().strip()
    for host in (first, second):
        on_host(lab, host.name, f"echo '{public}' >> /root/.ssh/authorized_keys")
    config = folder / "ssh_config"
    config.write_text(f"Host gpu-a\n  HostName 127.0.0.1\n  Port {first.port}\n"
                      f"Host gpu-b\n  HostName {second.internal_ip}\n  ProxyJump gpu-a\n"
                      f"Host gpu-*\n  User root\n  IdentityFile {key}\n")
    published = f"[127.0.0.1]:{second.port} "
    [line] = [line for line in lab.known_hosts.read_text().splitlines() if line.startswith(published)]
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(lab.known_hosts.read_text() + f"{second.internal_ip} {line[len(published):]}\n")
    inventory = folder / "inventory.yaml"
    inventory.write_text(f"known_hosts: {known_hosts}\nhosts:\n  gpu-a: {{}}\n  gpu-b: {{}}\n")
    yield config, inventory, known_hosts, (first, second)
    for host in (first, second):
        on_host(lab, host.name, "sed -i '/ gpuprov-ssh-config-test$/d' /root/.ssh/authorized_keys")


def test_the_alias_and_the_jump_reach_the_two_hosts(lab, fleet):
    config, inventory, known_hosts, (first, second) = fleet
    inv = apply_ssh_config(load_inventory(inventory), config)
    assert inv.hosts["gpu-b"].jump == "gpu-a"
    outcomes = run_on_hosts(list(inv.hosts.values()), lambda conn: conn.run("hostname").stdout.strip(),
                            Settings(known_hosts=known_hosts, connect_retries=0), jump_of=inv.jump_host)
    assert [(o.host.name, o.error) for o in outcomes] == [("gpu-a", None), ("gpu-b", None)]
    expected = [on_host(lab, host.name, "hostname").strip() for host in (first, second)]
    assert [o.value for o in outcomes] == expected


def test_facts_and_inventory_show_over_the_ssh_config(lab, fleet):
    config, inventory, _, (first, second) = fleet
    env = {"INVOKE_GPUPROV_SSH_CONFIG": str(config)}
    proc = invoke("facts", "--host", "gpu-a,gpu-b", "--json", "--inventory", str(inventory), env=env)
    facts = json.loads(proc.stdout)
    for name, host in (("gpu-a", first), ("gpu-b", second)):
        out = on_host(lab, host.name, "lspci -nn -d 10de:")
        expected = {line.rsplit("[10de:", 1)[1][:4] for line in out.splitlines()
                    if "[10de:" in line and "Bridge" not in line}
        assert {gpu["device_id"] for gpu in facts[name]["pci_gpus"]} == expected, name
    shown = json.loads(invoke("inventory.show", "--host", "gpu-b", "--json", "--inventory", str(inventory),
                              env=env).stdout)
    assert (shown["address"], shown["port"], shown["user"], shown["jump"]) == (second.internal_ip, 22, "root", "gpu-a")
    assert shown["setting_sources"] == {"address": f"{config}:5", "jump": f"{config}:6", "user": f"{config}:8",
                                        "identity_file": f"{config}:9"}
    assert shown["jump_via"] == {"name": "gpu-a", "address": "127.0.0.1", "port": first.port, "user": "root"}
