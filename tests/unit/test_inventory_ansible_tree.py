"""The same Ansible inventory tree read by ansible-core and by gpuprov gives the same hosts, groups and variables.

tests/fixtures/ansible_tree/ is an INI inventory that starts with ungrouped hosts, has nested groups, group_vars/
(a file, a file without an extension, a folder of YAML and JSON files with a hidden file and a .txt file that are not
read) and host_vars/ (YAML and JSON), and a ProxyJump in ansible_ssh_common_args. Every expected value comes from
running ansible-core's `ansible-inventory --list` on it; gpuprov's side is what `inventory.show --json` prints.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from invoke import Context

from gpuprov.inventory import InventoryError, load_inventory
from gpuprov.tasks import inventory as inventory_tasks

TREE = Path(__file__).parent.parent / "fixtures" / "ansible_tree"
INVENTORY = TREE / "hosts"

pytestmark = [
    pytest.mark.tool,
    pytest.mark.skipif(shutil.which("ansible-inventory") is None,
                       reason="needs ansible-inventory (pip install ansible-core)"),
]


@pytest.fixture(scope="module")
def listing() -> dict:
    """ansible-core's own reading of the tree."""
    done = subprocess.run(["ansible-inventory", "-i", str(INVENTORY), "--list"], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def ansible_hosts(listing: dict) -> set[str]:
    found = set(listing["_meta"]["hostvars"])
    for name, body in listing.items():
        if name != "_meta":
            found.update(body.get("hosts", ()))
    return found


def ansible_members(listing: dict, group: str) -> set[str]:
    """Every host in `group`, through its children too (the listing names each group's own hosts only)."""
    body = listing.get(group, {})
    found = set(body.get("hosts", ()))
    for child in body.get("children", ()):
        found |= ansible_members(listing, child)
    return found


def shown(host: str, capsys) -> dict:
    """What `inventory.show --host HOST --json` prints for the tree."""
    inventory_tasks.show(Context(), host=host, inventory=str(INVENTORY), json_=True)
    return json.loads(capsys.readouterr().out)


def test_the_same_hosts_and_groups(listing):
    inventory = load_inventory(INVENTORY)
    assert set(inventory.hosts) == ansible_hosts(listing)
    groups = {name for name in listing if name not in ("_meta", "all")}
    assert set(inventory.groups) == groups
    for group in groups:
        assert set(inventory.groups[group].hosts) == ansible_members(listing, group), group
    for name, host in inventory.hosts.items():
        assert set(host.groups) == {group for group in groups if name in ansible_members(listing, group)}, name


def test_each_host_shows_ansibles_merged_variables_and_connection(listing, capsys):
    hostvars = listing["_meta"]["hostvars"]
    for name in sorted(ansible_hosts(listing)):
        expected = hostvars.get(name, {})
        data = shown(name, capsys)
        assert data["vars"] == {key: value for key, value in expected.items() if not key.startswith("ansible_")}, name
        assert data["address"] == expected.get("ansible_host", name)
        assert data["port"] == int(expected.get("ansible_port", 22))
        assert data["user"] == expected.get("ansible_user", "root")
        jump = re.search(r"-o ProxyJump=(\S+)", expected.get("ansible_ssh_common_args", ""))
        assert data["jump"] == (jump.group(1) if jump else None), name


def test_the_fixture_exercises_every_layer(listing):
    """The tree is worth comparing: the hosts' `layer` differs by where it was last set (ansible-core's answer)."""
    layers = {name: vars_.get("layer") for name, vars_ in listing["_meta"]["hostvars"].items()}
    assert len(set(layers.values())) >= 5, layers
    assert "ProxyJump" in listing["_meta"]["hostvars"]["gpu01"]["ansible_ssh_common_args"]
    assert set(listing["ungrouped"]["hosts"]) == {"bastion", "login01"}


def test_the_ansible_plugin_reads_the_tree_as_the_file_reader_does(listing):
    """--inventory-plugin ansible (ansible-inventory run as a program) and gpuprov's reader agree."""
    by_program = load_inventory(INVENTORY, plugin="ansible")
    by_file = load_inventory(INVENTORY)
    assert by_program.format == "ansible-inventory"
    assert set(by_program.hosts) == ansible_hosts(listing)
    for name, host in by_file.hosts.items():
        other = by_program.hosts[name]
        assert (other.address, other.port, other.user, other.jump, other.vars) == (
            host.address, host.port, host.user, host.jump, host.vars), name
        assert set(other.groups) == set(host.groups), name


def test_a_vault_encrypted_vars_file_is_read_through_ansible_and_refused_by_the_file_reader(tmp_path, monkeypatch):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "hosts").write_text("[hgx]\ngpu01\n")
    (tmp_path / "group_vars/hgx.yml").write_text("token_name: s3cret\n")
    (tmp_path / "pass").write_text("vault password\n")
    subprocess.run(["ansible-vault", "encrypt", "--vault-password-file", str(tmp_path / "pass"),
                    str(tmp_path / "group_vars/hgx.yml")], check=True, capture_output=True, timeout=120)
    assert (tmp_path / "group_vars/hgx.yml").read_text().startswith("$ANSIBLE_VAULT;")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "pass"))
    assert load_inventory(tmp_path / "hosts", plugin="ansible").hosts["gpu01"].vars == {"token_name": "s3cret"}
    with pytest.raises(InventoryError) as info:
        load_inventory(tmp_path / "hosts")
    assert info.value.errors == [f"{tmp_path}/group_vars/hgx.yml:1:1: (file): encrypted with ansible-vault: gpuprov "
                                 "does not decrypt; read the inventory through ansible-inventory with "
                                 "--inventory-plugin ansible"]
