"""group_vars/ and host_vars/ beside an Ansible inventory: which files are read (ansible-core's host_group_vars
plugin and DataLoader.find_vars_files), in Ansible's precedence ("Understanding variable precedence"), and every
problem in them told at its own file, line and column, exit 2, with the others.

Expected values are written out by hand from Ansible's documented rules; the precedence ones were checked against
ansible-core 2.19's `ansible-inventory --list` (test_inventory_ansible_tree.py compares a whole tree with it)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers.inventory import check_fails

from gpuprov.inventory import InventoryError, load_inventory

INI = """\
[hgx]
gpu01 ansible_host=192.0.2.11
gpu02 ansible_host=192.0.2.12 layer=host-file

[pcie]
gpu03 ansible_host=192.0.2.13

[gpus:children]
hgx
pcie

[gpus:vars]
layer=file-gpus

[hgx:vars]
layer=file-hgx

[all:vars]
layer=file-all
"""


def tree(tmp_path: Path, files: dict[str, str], inventory: str = INI, name: str = "hosts") -> Path:
    """An inventory file and its vars files (paths relative to its folder)."""
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    path = tmp_path / name
    path.write_text(textwrap.dedent(inventory))
    return path


def layers(path: Path) -> dict[str, str]:
    inventory = load_inventory(path)
    return {name: host.vars.get("layer") for name, host in inventory.hosts.items()}


def test_precedence_is_ansibles(tmp_path):
    # inventory file group vars < group_vars/all < group_vars/<group> (by depth) < file host vars < host_vars
    path = tree(tmp_path, {"group_vars/all.yml": "layer: groupvars-all\n",
                           "group_vars/gpus.yml": "layer: groupvars-gpus\n"})
    assert layers(path) == {"gpu01": "groupvars-gpus", "gpu02": "host-file", "gpu03": "groupvars-gpus"}
    (tmp_path / "group_vars/hgx.yml").write_text("layer: groupvars-hgx\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/gpu02.yml").write_text("layer: hostvars-gpu02\n")
    assert layers(path) == {"gpu01": "groupvars-hgx", "gpu02": "hostvars-gpu02", "gpu03": "groupvars-gpus"}


def test_group_vars_all_is_above_every_groups_inventory_vars(tmp_path):
    path = tree(tmp_path, {"group_vars/all.yaml": "layer: groupvars-all\n"})
    assert layers(path) == {"gpu01": "groupvars-all", "gpu02": "host-file", "gpu03": "groupvars-all"}


def test_groups_of_one_depth_apply_by_priority_then_name(tmp_path):
    inventory = """\
        [b]
        gpu01
        [a]
        gpu01
        """
    path = tree(tmp_path, {"group_vars/a.yml": "layer: a\n", "group_vars/b.yml": "layer: b\n"}, inventory)
    assert layers(path) == {"gpu01": "b"}  # same depth: by name, b last
    path = tree(tmp_path, {}, inventory + "[a:vars]\nansible_group_priority=5\n")
    assert layers(path) == {"gpu01": "a"}


def test_the_first_of_name_yml_yaml_json_is_read_and_a_folder_is_read_in_name_order(tmp_path):
    path = tree(tmp_path, {
        "group_vars/hgx.yaml": "layer: yaml\n",
        "group_vars/hgx.json": '{"layer": "json"}',
        "group_vars/pcie/20-b.json": '{"layer": "b", "fabric": "pcie"}',
        "group_vars/pcie/10-a.yml": "layer: a\nrack: r1\n",
        "group_vars/pcie/sub/30-c": "rack: r3\n",
        "group_vars/pcie/.hidden.yml": "layer: hidden\n",
        "group_vars/pcie/40-d.yml~": "layer: backup\n",
        "group_vars/pcie/50-e.txt": "layer: text\n",
    })
    inventory = load_inventory(path)
    assert inventory.hosts["gpu01"].vars["layer"] == "yaml"
    assert inventory.hosts["gpu03"].vars == {"layer": "b", "fabric": "pcie", "rack": "r3"}
    assert inventory.hosts["gpu03"].sources == {"layer": "group_vars/pcie/20-b.json",
                                                "fabric": "group_vars/pcie/20-b.json",
                                                "rack": "group_vars/pcie/sub/30-c"}


def test_host_vars_give_connection_settings_and_the_yaml_form_reads_them_too(tmp_path):
    inventory = """\
        all:
          children:
            hgx:
              hosts:
                gpu01:
        """
    path = tree(tmp_path, {"host_vars/gpu01.json": '{"ansible_host": "192.0.2.50", "ansible_port": 2200}',
                           "group_vars/hgx.yml": "ansible_user: ops\n"}, inventory, "inv.yml")
    gpu01 = load_inventory(path).hosts["gpu01"]
    assert (gpu01.address, gpu01.port, gpu01.user) == ("192.0.2.50", 2200, "ops")
    assert gpu01.setting_sources == {"address": "host_vars/gpu01.json", "port": "host_vars/gpu01.json",
                                     "user": "group_vars/hgx.yml"}


def test_a_name_that_is_no_group_or_host_is_a_warning(tmp_path):
    path = tree(tmp_path, {"group_vars/hgxx.yml": "layer: x\n", "host_vars/gpu-01.yml": "layer: x\n"})
    warnings = load_inventory(path).warnings
    assert warnings == [
        f"{tmp_path}/group_vars/hgxx.yml:1:1: (file): no group 'hgxx' in the inventory (did you mean 'hgx'?): this "
        "is not read (Ansible ignores it too)",
        f"{tmp_path}/host_vars/gpu-01.yml:1:1: (file): no host 'gpu-01' in the inventory (did you mean 'gpu01'?): "
        "this is not read (Ansible ignores it too)",
    ]


def test_every_problem_in_every_vars_file_is_located_and_exit_2(tmp_path, capsys):
    path = tree(tmp_path, {
        "group_vars/all.yml": "layer: ok\nansible_port: 0\n",
        "group_vars/hgx.yml": "layer: [unclosed\n",
        "group_vars/pcie/10.json": '{"ansible_user": "bad user"}',
        "host_vars/gpu01.yml": "- a list\n",
        "host_vars/gpu02.yml": "ansible_become_method: su\nansible_become_user: postgres\n",
    }, INI.replace("gpu03 ansible_host=192.0.2.13", "gpu03 ansible_host=192.0.2.13 ansible_port=x"))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert check_fails(path, capsys) == [
        f"{path}:6:44: pcie.hosts.gpu03.ansible_port: bad port 'x': give an integer from 1 to 65535",
        f"{tmp_path}/group_vars/all.yml:2:15: ansible_port: bad port 0: give an integer from 1 to 65535",
        f"{tmp_path}/group_vars/hgx.yml:2:1: (file): YAML syntax error: did not find expected ',' or ']' (while "
        "parsing a flow sequence that began at line 1, column 8)",
        f"{tmp_path}/group_vars/pcie/10.json:1:18: ansible_user: bad user 'bad user': letters, digits, '_', '.', "
        "'-' (up to 32, not starting with a digit or '-')",
        f"{tmp_path}/host_vars/gpu01.yml:1:1: (top level): a vars file must be a mapping of variables, not a list",
        f"{tmp_path}/host_vars/gpu02.yml:1:24: ansible_become_method: become method 'su' is not supported: gpuprov "
        "becomes root with sudo only; remove it or set it to sudo",
        f"{tmp_path}/host_vars/gpu02.yml:2:22: ansible_become_user: become user 'postgres' is not supported: "
        "gpuprov runs its steps as root (through sudo when the user is not root); remove it or set it to root",
        f"7 errors in {path}",
    ]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_declared_variable_in_a_vars_file_is_checked_where_written(tmp_path):
    path = tree(tmp_path, {"group_vars/hgx.yml": "layer: x\nvalidate:\n  threshold_pct: 500\n"})
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    [error] = info.value.errors
    assert error.startswith(f"{tmp_path}/group_vars/hgx.yml:3:18: validate.threshold_pct: ")
    assert info.value.exit_code == 2


@pytest.mark.parametrize("text, message", [
    ("$ANSIBLE_VAULT;1.1;AES256\n6162\n", "1:1: (file): encrypted with ansible-vault: gpuprov does not decrypt; "
                                          "read the inventory through ansible-inventory with --inventory-plugin "
                                          "ansible"),
    ("blob: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n", "1:7: blob: unsupported YAML tag '!vault': gpuprov reads "
                                                     "plain values only (no encrypted or custom-tagged values)"),
    ("a: 1\na: 2\n", "2:1: a: duplicate key 'a' (first at line 1)"),
    ("k: \x07\n", "1:4: (file): character '\\x07' is not allowed in YAML"),
])
def test_vault_and_bad_yaml_in_a_vars_file(tmp_path, capsys, text, message):
    path = tree(tmp_path, {"group_vars/hgx.yml": text})
    assert check_fails(path, capsys) == [f"{tmp_path}/group_vars/hgx.yml:{message}", f"1 error in {path}"]


def test_a_vars_file_that_is_not_a_regular_file_is_refused(tmp_path, capsys):
    path = tree(tmp_path, {})
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/gpu01").symlink_to("/dev/zero")
    assert check_fails(path, capsys) == [
        f"{tmp_path}/host_vars/gpu01:1:1: (file): not read: the file is not a regular file (a device, a pipe or a "
        "socket)",
        f"1 error in {path}",
    ]


def test_a_native_inventory_reads_no_vars_folders(tmp_path):
    path = tree(tmp_path, {"group_vars/all.yml": "layer: x\n"}, "hosts:\n  gpu01: {}\n", "inv.yaml")
    assert load_inventory(path).hosts["gpu01"].vars == {}


def test_a_folder_linked_into_itself_is_read_once(tmp_path):
    path = tree(tmp_path, {"group_vars/hgx/10.yml": "layer: ten\n"})
    (tmp_path / "group_vars/hgx/loop").symlink_to(tmp_path / "group_vars/hgx")
    assert load_inventory(path).hosts["gpu01"].vars["layer"] == "ten"


def test_a_folder_that_cannot_be_listed_is_located_and_exit_2(tmp_path, capsys, monkeypatch):
    path = tree(tmp_path, {"group_vars/hgx/10.yml": "layer: ten\n"})
    listed = Path.iterdir

    def iterdir(folder: Path):
        if folder.name == "hgx":  # as a folder without read permission answers (root reads any)
            raise PermissionError(13, "Permission denied", str(folder))
        return listed(folder)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert check_fails(path, capsys) == [
        f"{tmp_path}/group_vars/hgx:1:1: (file): cannot be read: Permission denied", f"1 error in {path}"]
