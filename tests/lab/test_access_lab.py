"""Reaching hosts as operators do: through a jump host, and as a non-root user with a sudo password."""

from __future__ import annotations

import json

import pytest
from labutil import copy_inventory, invoke, on_host, snapshot

pytestmark = pytest.mark.lab
SUDO_VAR = "GPUPROV_TEST_SUDO_PASSWORD"


def test_facts_through_a_jump_host(lab, tmp_path):
    """A host with no published port, reached over the internal network through another lab host."""
    bastion, target = lab.hosts[0], lab.hosts[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(lab.known_hosts.read_text())  # the bastion is known; the target is not yet

    def behind_bastion(document):
        document["hosts"]["inside"] = {"address": target.internal_ip, "port": 22, "jump": bastion.name,
                                       "vars": {"hardware": dict(target.hardware)}}

    inventory = copy_inventory(lab, tmp_path, known_hosts, edit=behind_bastion)
    refused = invoke("facts", "--host", "inside", "--inventory", str(inventory), check_code=1)
    assert "unknown host key" in refused.stdout + refused.stderr
    proc = invoke("facts", "--host", "inside", "--json", "--trust-new-hosts", "--inventory", str(inventory))
    facts = json.loads(proc.stdout)["inside"]
    assert {g["device_id"] for g in facts["pci_gpus"]} == {d for d in _device_ids(lab, target.name)}
    assert target.internal_ip in known_hosts.read_text()


def _device_ids(lab, name: str) -> set[str]:
    out = on_host(lab, name, "lspci -nn -d 10de:")
    return {line.rsplit("[10de:", 1)[1][:4] for line in out.splitlines() if "[10de:" in line
            and "Bridge" not in line}


@pytest.fixture
def sudo_user_host(lab):
    """A lab host whose gpuadmin needs a password for sudo; restored afterwards."""
    name = lab.hosts[2].name
    on_host(lab, name, "echo 'gpuadmin:right-password' | chpasswd && mv /etc/sudoers.d/gpuadmin /root/gpuadmin.sudoers")
    yield name
    on_host(lab, name, "mv /root/gpuadmin.sudoers /etc/sudoers.d/gpuadmin && rm -f "
                       "/etc/apt/sources.list.d/gpuprov-nvidia.list /usr/share/keyrings/gpuprov-nvidia.gpg "
                       "/etc/gpuprov/repo-key.fingerprint")


def _as_gpuadmin(name: str):
    def edit(document):
        document["hosts"][name]["user"] = "gpuadmin"
        document["hosts"][name]["sudo"] = {"password_env": SUDO_VAR}
    return edit


def test_wrong_sudo_password_is_a_clear_error_and_changes_nothing(lab, tmp_path, sudo_user_host):
    name = sudo_user_host
    inventory = copy_inventory(lab, tmp_path, edit=_as_gpuadmin(name))
    before = snapshot(lab, name)
    proc = invoke("provision", "--host", name, "--only", "sources", "--inventory", str(inventory), check_code=1,
                  env={SUDO_VAR: "wrong-password", "INVOKE_GPUPROV_REPORTS": str(tmp_path / "reports")})
    assert "sudo refused" in proc.stdout + proc.stderr
    assert "wrong-password" not in proc.stdout + proc.stderr
    assert all("wrong-password" not in path.read_text() for path in (tmp_path / "reports").glob("*.json"))
    assert snapshot(lab, name) == before


def test_sudo_password_from_the_environment(lab, tmp_path, sudo_user_host):
    name = sudo_user_host
    inventory = copy_inventory(lab, tmp_path, edit=_as_gpuadmin(name))
    invoke("provision", "--host", name, "--only", "sources", "--inventory", str(inventory),
           env={SUDO_VAR: "right-password", "INVOKE_GPUPROV_REPORTS": str(tmp_path / "reports")})
    assert "signed-by=/usr/share/keyrings/gpuprov-nvidia.gpg" in on_host(
        lab, name, "cat /etc/apt/sources.list.d/gpuprov-nvidia.list")
    missing = invoke("provision", "--host", name, "--only", "sources", "--inventory", str(inventory), check_code=2,
                     env={"INVOKE_GPUPROV_REPORTS": str(tmp_path / "reports")})
    assert SUDO_VAR in missing.stdout + missing.stderr
