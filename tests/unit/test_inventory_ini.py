"""Ansible's INI inventory format loads as its YAML form does (groups, `:vars`, `:children`, host patterns with
ranges and ports, inline `key=value`), and every problem in it is a located error, exit 2, before any host is
contacted. Expected hosts and groups are written out by hand from Ansible's documented rules."""

from __future__ import annotations

import textwrap

import pytest
from helpers.inventory import check_fails, write
from invoke import Config, Context
from invoke.exceptions import Exit

from gpuprov.inventory import Inventory, InventoryError, load_inventory
from gpuprov.tasks import facts as facts_tasks
from gpuprov.tasks import inventory as inventory_tasks

INI = """\
# the bastion is in no group
bastion ansible_host=203.0.113.10 ansible_port=2222

[hgx]
gpu[01:03] ansible_user=ops rack=r1   # three hosts
gpu04:2201 ansible_host=10.0.0.4 note="two words"

[hgx:vars]
hardware={"gpu": "H100-SXM", "count": 8, "nvswitch": True}
gpuprov_jump=bastion
stack={"cuda": 12.8, "driver": 580}
ansible_become_password=hunter2

[fleet:children]
hgx

[all:vars]
ansible_user=gpuadmin
site = dc1
"""

YAML_FORM = """\
all:
  vars: {ansible_user: gpuadmin, site: dc1}
  hosts:
    bastion: {ansible_host: 203.0.113.10, ansible_port: 2222}
  children:
    fleet:
      children:
        hgx:
          vars:
            hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
            gpuprov_jump: bastion
            stack: {cuda: 12.8, driver: 580}
            ansible_become_password: hunter2
          hosts:
            gpu[01:03]: {ansible_user: ops, rack: r1}
            gpu04:2201: {ansible_host: 10.0.0.4, note: two words}
"""


def shape(inventory: Inventory) -> tuple:
    return ({name: host.to_dict() for name, host in inventory.hosts.items()},
            {name: (g.vars, g.children, g.parents, g.hosts) for name, g in inventory.groups.items()})


def test_the_ini_form_loads_as_the_yaml_form(tmp_path):
    ini = load_inventory(write(tmp_path, INI, "hosts.ini"))
    assert ini.format == "ansible-ini" and load_inventory(write(tmp_path, YAML_FORM)).format == "ansible"
    assert shape(ini) == shape(load_inventory(tmp_path / "inv.yaml"))
    assert list(ini.hosts) == ["bastion", "gpu01", "gpu02", "gpu03", "gpu04"]
    gpu01, gpu04 = ini.hosts["gpu01"], ini.hosts["gpu04"]
    assert (gpu01.address, gpu01.port, gpu01.user, gpu01.jump) == ("gpu01", 22, "ops", "bastion")
    assert (gpu04.address, gpu04.port, gpu04.user) == ("10.0.0.4", 2201, "gpuadmin")
    assert gpu01.groups == ("fleet", "hgx") and ini.groups["fleet"].hosts == ("gpu01", "gpu02", "gpu03", "gpu04")
    assert gpu04.vars == {"site": "dc1", "hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True},
                          "stack": {"cuda": "12.8", "driver": "580"}, "note": "two words"}
    assert gpu04.sources == {"site": "defaults", "hardware": "group:hgx", "stack": "group:hgx", "note": "host"}
    assert ini.hosts["bastion"].port == 2222 and ini.hosts["bastion"].groups == ("ungrouped",)
    assert "hunter2" not in repr(shape(ini)) and len(ini.warnings) == 1
    assert ini.warnings[0] == (f"{tmp_path / 'hosts.ini'}:12:1: hgx.vars.ansible_become_password: not read (secrets "
                               "never come from a file); set gpuprov_sudo: {password_env: NAME} and export the "
                               "password in NAME")


@pytest.mark.parametrize(("pattern", "hosts", "port"), [
    ("gpu[01:04]", ["gpu01", "gpu02", "gpu03", "gpu04"], 22),
    ("gpu[8:11]", ["gpu8", "gpu9", "gpu10", "gpu11"], 22),
    ("gpu[:2]", ["gpu0", "gpu1", "gpu2"], 22),
    ("db-[a:d].example.com", ["db-a.example.com", "db-b.example.com", "db-c.example.com", "db-d.example.com"], 22),
    ("www[01:09:4]", ["www01", "www05", "www09"], 22),
    ("db-[x:B]", ["db-x", "db-y", "db-z", "db-A", "db-B"], 22),
    ("r[1:2]-g[a:b]:2200", ["r1-ga", "r1-gb", "r2-ga", "r2-gb"], 2200),
    ("[fd00::1]:2222", ["fd00::1"], 2222),
])
def test_host_patterns_expand_as_ansible_documents_them(tmp_path, pattern, hosts, port):
    for text, name in ((f"[fleet]\n{pattern}\n", "hosts"), (f"all:\n  hosts:\n    '{pattern}':\n", "inv.yaml")):
        inventory = load_inventory(write(tmp_path, text, name))
        assert list(inventory.hosts) == hosts and {h.port for h in inventory.hosts.values()} == {port}


@pytest.mark.parametrize(("text", "value"), [
    ("count=8", 8), ("count='8'", "8"), ("flag=True", True), ("name=plain words", "plain words"),
    ("racks=['r1', 'r2']", ["r1", "r2"]), ("pair=(1, 2)", [1, 2]), ("nothing=None", None),
    ("spaced = 12 # a number", 12),
])
def test_values_are_read_as_ansible_reads_them(tmp_path, text, value):
    inventory = load_inventory(write(tmp_path, f"[g]\nh1\n[g:vars]\n{text}\n", "hosts.ini"))
    assert list(inventory.groups["g"].vars.values()) == [value]


def test_a_number_keeps_the_text_it_was_written_with(tmp_path):
    path = write(tmp_path, '[g]\nh1 stack=\'{"pytorch": 2.10}\'\n[g:vars]\nstack={"cuda": 12.10}\n', "hosts.ini")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    [error] = info.value.errors
    assert error.startswith(f"{path}:4:7: g.vars.stack.cuda: unknown CUDA release '12.10'. Accepted: ")
    path.write_text('[g]\nh1 stack=\'{"pytorch": 2.10}\'\n')
    assert load_inventory(path).hosts["h1"].vars == {"stack": {"pytorch": "2.10"}}


BAD = """\
[hgx]
gpu[01:8] rack=r1
gpu10 ansible_port=99999
gpu11 stray
gpu12:22²
gpu13 note="unclosed
[hgx:vars]
no equals sign here
[hgx:child]
skipped line
[gpu s]
skipped
[ghost:vars]
x=1
[fleet:children]
hgx
nowhere
"""


def test_every_problem_is_located_and_exit_2(tmp_path, capsys):
    path = write(tmp_path, BAD, "hosts.ini")
    assert check_fails(path, capsys) == [
        f"{path}:2:1: hgx.hosts.gpu[01:8]: host range 'gpu[01:8]': a zero-padded begin and its end have the same "
        "number of digits, like [01:08]; not [01:8]",
        f"{path}:3:20: hgx.hosts.gpu10.ansible_port: bad port 99999: give an integer from 1 to 65535",
        f"{path}:4:7: hgx.hosts.gpu11: expected key=value after the host, not 'stray'",
        f"{path}:5:1: hgx.hosts.gpu12:22²: host pattern 'gpu12:22²': bad port '22²': it has digits that are not "
        "ASCII; write it with the digits 0-9",
        f"{path}:6:1: (file): cannot split the host line: No closing quotation",
        f"{path}:8:1: hgx.vars: expected key=value, not 'no equals sign here'",
        f"{path}:9:2: hgx: unknown section type 'child': give [hgx], [hgx:vars] or [hgx:children]",
        f"{path}:11:1: (file): bad section header '[gpu s]': write [NAME], [NAME:vars] or [NAME:children], "
        "without spaces",
        f"{path}:13:2: ghost: [ghost:vars] is for a group no section declares: add a [ghost] section",
        f"{path}:17:1: fleet.children.nowhere: group 'nowhere' is not declared: add a [nowhere] section (Ansible "
        "needs one for every child group)",
        f"10 errors in {path}",
    ]


@pytest.mark.parametrize(("text", "error"), [
    ("[g]\nh[0:200000]\n", "2:1: g.hosts.h[0:200000]: host range 'h[0:200000]' makes 200001 hosts; ranges add "
                           "up to 100000 hosts to an inventory"),
    ("[g]\nh[5:1]\n", "2:1: g.hosts.h[5:1]: host range 'h[5:1]': begin 5 is greater than end 1"),
    ("[g]\nh[1:4:0]\n", "2:1: g.hosts.h[1:4:0]: host range 'h[1:4:0]': the step '0' must be a whole number >= 1"),
    ("[g]\nh[１:4]\n", "2:1: g.hosts.h[１:4]: host range 'h[１:4]': '１' has digits that are not ASCII; write it "
                      "with the digits 0-9"),
    ("[g]\nh[a:4]\n", "2:1: g.hosts.h[a:4]: host range 'h[a:4]': begin and end must both be numbers or both "
                     "single letters, not 'a' and '4'"),
    ("[g]\nh[1:4\n", "2:1: g.hosts.h[1:4: host pattern 'h[1:4': a range is [begin:end] or [begin:end:step], with "
                    "one [ and one ]"),
    ("[g]\ngpu01 ansible_port=２２\n", "2:20: g.hosts.gpu01.ansible_port: bad port '２２': it has digits that are "
                                     "not ASCII; write it with the digits 0-9"),
    ("# nothing yet\n[g]\n", "1:1: all: no hosts: add a [group] section with host lines"),
])
def test_bad_patterns_and_values(tmp_path, capsys, text, error):
    path = write(tmp_path, text, "hosts.ini")
    assert check_fails(path, capsys) == [f"{path}:{error}", f"1 error in {path}"]


def test_a_file_is_ini_by_its_name_its_first_section_header_or_its_first_host_line(tmp_path, capsys):
    assert load_inventory(write(tmp_path, "gpu01 ansible_host=10.0.0.1\n", "fleet.ini")).format == "ansible-ini"
    assert load_inventory(write(tmp_path, "; fleet\n\n[g]\ngpu01\n", "hosts")).format == "ansible-ini"
    # hosts before any section, as Ansible's INI reader takes them: in `ungrouped` (and `all`)
    inventory = load_inventory(write(tmp_path, "gpu01 ansible_host=10.0.0.1\ngpu02\n", "hosts"))
    assert inventory.format == "ansible-ini" and list(inventory.hosts) == ["gpu01", "gpu02"]
    assert inventory.groups["ungrouped"].hosts == ("gpu01", "gpu02")
    # a file named .yaml stays YAML: its top level must be a mapping
    path = write(tmp_path, "gpu01 ansible_host=10.0.0.1\ngpu02\n", "hosts.yaml")
    assert check_fails(path, capsys) == [
        f"{path}:1:1: (top level): the top level must be a mapping with hosts:, groups:, defaults: (or an Ansible "
        "inventory with all:), not str; an Ansible INI inventory starts with a [group] line or has a name ending "
        "in .ini",
        f"1 error in {path}",
    ]


def test_a_host_task_with_a_bad_ini_inventory_contacts_no_host(tmp_path, capsys, monkeypatch):
    contacted: list[str] = []
    monkeypatch.setattr("gpuprov.core.executor.connect", lambda host, *args, **kwargs: contacted.append(host.name))
    path = write(tmp_path, textwrap.dedent("""\
        [hgx]
        gpu01 ansible_host=192.0.2.11
        gpu02 ansible_host=192.0.2.12 ansible_port=0
        """), "hosts.ini")
    c = Context(Config(overrides={"gpuprov": {"known_hosts": str(tmp_path / "known_hosts")}}))
    with pytest.raises(Exit) as info:
        facts_tasks.facts(c, group=["hgx"], inventory=str(path))
    assert info.value.code == 2 and contacted == []
    assert capsys.readouterr().err == (
        f"error: inventory: {path}: 1 error:\n"
        f"  {path}:3:44: hgx.hosts.gpu02.ansible_port: bad port 0: give an integer from 1 to 65535\n"
        f"  next: fix the inventory, then run: invoke inventory.check --inventory {path}\n")
    assert not (tmp_path / "known_hosts").exists()


def test_check_prints_the_format(tmp_path, capsys):
    path = write(tmp_path, INI, "hosts.ini")
    inventory_tasks.check(Context(), inventory=str(path))
    captured = capsys.readouterr()
    assert captured.out == (f"{path}: ok (ansible-ini format): 5 hosts, 3 groups\n"
                            "hosts: bastion, gpu01, gpu02, gpu03, gpu04\ngroups: hgx, fleet, ungrouped\n")
    assert captured.err == (f"warning: {path}:12:1: hgx.vars.ansible_become_password: not read (secrets never come "
                            "from a file); set gpuprov_sudo: {password_env: NAME} and export the password in NAME\n")
