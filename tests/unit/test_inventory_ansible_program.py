"""load_inventory(path, plugin="ansible") runs `ansible-inventory --list` as a program (argv, no shell, a timeout)
and reads its JSON as data: a missing program, a failure (its stderr shown literally), a timeout and a bad value are
each a clean error. A stand-in ansible-inventory on PATH plays the program here; test_inventory_ansible_tree.py runs
the real one."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.inventory import InventoryError, load_inventory
from gpuprov.inventory.ansible_program import load_with_ansible

LISTING = {
    "_meta": {"hostvars": {
        "bastion": {"ansible_host": "203.0.113.10", "ansible_user": "ops"},
        "gpu01": {"ansible_host": "192.0.2.11", "ansible_ssh_common_args": "-o ProxyJump=bastion", "rack": "r1"},
    }},
    "all": {"children": ["ungrouped", "gpus"]},
    "gpus": {"children": ["hgx"]},
    "hgx": {"hosts": ["gpu01", "gpu02"]},
    "ungrouped": {"hosts": ["bastion"]},
}


def program(tmp_path: Path, monkeypatch, body: str) -> Path:
    """A stand-in ansible-inventory, alone on PATH, that records its argv and environment, then runs `body`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "ansible-inventory"
    record = f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(tmp_path / 'call')!r}, 'w'))"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n{record}\n" + textwrap.dedent(body))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    return tmp_path / "call"


def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inventory $(touch pwned).ini"
    path.write_text("# a source only ansible-inventory reads\n")
    return path


def test_the_listing_becomes_the_inventory(tmp_path, monkeypatch):
    call = program(tmp_path, monkeypatch, f"print(json.dumps({LISTING!r}))\n"
                                           "print('[WARNING]: a plugin said something', file=sys.stderr)\n")
    path = inventory_file(tmp_path)
    inventory = load_inventory(path, plugin="ansible")
    recorded = json.loads(call.read_text())
    assert recorded["argv"] == ["--list", "--inventory", str(path.absolute())]
    assert recorded["env"]["ANSIBLE_INVENTORY_UNPARSED_FAILED"] == "True"
    assert not (tmp_path / "pwned").exists()
    assert inventory.format == "ansible-inventory"
    assert list(inventory.hosts) == ["bastion", "gpu01", "gpu02"]
    gpu01 = inventory.hosts["gpu01"]
    assert (gpu01.address, gpu01.user, gpu01.jump, gpu01.vars) == ("192.0.2.11", "root", "bastion", {"rack": "r1"})
    assert gpu01.groups == ("gpus", "hgx") and inventory.hosts["bastion"].groups == ("ungrouped",)
    assert inventory.groups["gpus"].hosts == ("gpu01", "gpu02")
    assert inventory.warnings == ["ansible-inventory: [WARNING]: a plugin said something"]


def test_a_missing_program_is_exit_2_naming_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError) as info:
        load_inventory(inventory_file(tmp_path), plugin="ansible")
    assert info.value.exit_code == 2
    assert "ansible-inventory, which is not installed" in info.value.message
    assert "pip install ansible-core" in info.value.hint


def test_its_failure_shows_its_stderr_literally(tmp_path, monkeypatch):
    program(tmp_path, monkeypatch, "sys.stderr.write('ERROR! Unable to parse x as an inventory source\\n"
                                   "\\x1b[31mred\\n')\nsys.exit(1)\n")
    with pytest.raises(InputError) as info:
        load_inventory(inventory_file(tmp_path), plugin="ansible")
    assert info.value.exit_code == 2 and "could not list" in info.value.message and "(exit 1)" in info.value.message
    assert info.value.output == "ERROR! Unable to parse x as an inventory source\n\x1b[31mred\n"
    assert "    ERROR! Unable to parse x as an inventory source\n    \\x1b[31mred" in str(info.value)


def test_no_answer_in_time_is_a_step_failure_with_the_command(tmp_path, monkeypatch):
    program(tmp_path, monkeypatch, "time.sleep(30)\n")
    with pytest.raises(GpuprovError) as info:
        load_with_ansible(inventory_file(tmp_path), timeout=0.5)
    assert info.value.exit_code == 1 and "within 0.5 s" in info.value.message
    assert info.value.command.startswith(str(tmp_path / "bin" / "ansible-inventory") + " --list --inventory ")


def test_at_the_timeout_a_child_holding_its_pipes_goes_too(tmp_path, monkeypatch):
    # a vault password script or a dynamic inventory's helper left running with the pipes: killed with it
    pid_file = tmp_path / "child.pid"
    program(tmp_path, monkeypatch, f"""\
        import subprocess
        child = subprocess.Popen([{sys.executable!r}, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """)
    with pytest.raises(GpuprovError) as info:
        load_with_ansible(inventory_file(tmp_path), timeout=1)
    assert "within 1 s" in info.value.message
    child = int(pid_file.read_text())
    state = Path(f"/proc/{child}/stat")
    assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"   # gone (or not yet reaped)


@pytest.mark.parametrize("listing, error", [
    ({**LISTING, "_meta": {"hostvars": {"gpu01": {"ansible_port": 0}}}},
     "_meta.hostvars.gpu01.ansible_port: bad port 0: give an integer from 1 to 65535"),
    ({**LISTING, "_meta": {"hostvars": {"gpu01": {"ansible_become_user": "postgres"}}}},
     "_meta.hostvars.gpu01.ansible_become_user: become user 'postgres' is not supported"),
    ({**LISTING, "_meta": {"hostvars": {"gpu01": {"token": {"__ansible_vault": "$ANSIBLE_VAULT;1.1;AES256\n61"}}}}},
     "_meta.hostvars.gpu01.token: a vault-encrypted value, listed still encrypted"),
    ({**LISTING, "hgx": {"hosts": ["gpu 01"]}}, "hgx.hosts[0]: bad host name 'gpu 01'"),
    ({**LISTING, "hgx": {"hosts": "gpu01"}}, "hgx.hosts: expected a list of names, not str"),
    ({"_meta": {"hostvars": {}}, "all": {"children": ["ungrouped"]}}, "(top level): ansible-inventory lists no hosts"),
    ([1, 2], "(top level): expected a JSON object with _meta and groups, not a list"),
])
def test_its_values_are_data_checked_as_the_file_readers_are(tmp_path, monkeypatch, listing, error):
    program(tmp_path, monkeypatch, f"print(json.dumps({listing!r}))\n")
    path = inventory_file(tmp_path)
    with pytest.raises(InventoryError) as info:
        load_inventory(path, plugin="ansible")
    assert info.value.exit_code == 2
    assert any(line.startswith(f"ansible-inventory --list --inventory {path}:1:1: {error}")
               for line in info.value.errors), info.value.errors


def test_output_that_is_not_json_and_an_unknown_plugin(tmp_path, monkeypatch):
    program(tmp_path, monkeypatch, "print('not json')\n")
    with pytest.raises(InputError, match="output for .* is not JSON"):
        load_inventory(inventory_file(tmp_path), plugin="ansible")
    with pytest.raises(InputError, match="unknown inventory plugin 'salt'"):
        load_inventory(inventory_file(tmp_path), plugin="salt")
    with pytest.raises(InputError, match="not found"):
        load_inventory(tmp_path / "missing", plugin="ansible")
