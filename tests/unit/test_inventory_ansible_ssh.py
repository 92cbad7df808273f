"""ansible_ssh_common_args / ansible_ssh_extra_args give the jump host (`-o ProxyJump=`, `-J`), as ssh(1) reads
them; what gpuprov cannot do as ssh would (ProxyCommand, a chain, two jump hosts) is refused where it is written,
exit 2; become to root with sudo is what gpuprov does, anything else is refused. Expected values follow ssh(1),
ssh_config(5) and Ansible's become documentation."""

from __future__ import annotations

import pytest
from helpers.inventory import check_fails, write

from gpuprov.inventory import load_inventory


def inventory(tmp_path, line: str):
    return write(tmp_path, f"[hgx]\ngpu01 ansible_host=192.0.2.11\n[hgx:vars]\n{line}\n", "hosts")


@pytest.mark.parametrize("line, jump", [
    ("ansible_ssh_common_args='-o ProxyJump=ops@203.0.113.10:2222'", "ops@203.0.113.10:2222"),
    ("ansible_ssh_common_args='-oProxyJump=ops@203.0.113.10'", "ops@203.0.113.10"),
    ('ansible_ssh_common_args="-o \'ProxyJump ops@bastion.example.net\'"', "ops@bastion.example.net"),
    ("ansible_ssh_common_args='-o proxyjump=ssh://ops@[2001:db8::1]:2200'", "ops@[2001:db8::1]:2200"),
    ("ansible_ssh_extra_args='-J ops@203.0.113.10'", "ops@203.0.113.10"),
    ("ansible_ssh_extra_args='-Jops@203.0.113.10:22'", "ops@203.0.113.10:22"),
    ("ansible_ssh_common_args='-o ProxyJump=none'", None),
])
def test_proxyjump_becomes_the_jump_host(tmp_path, line, jump):
    assert load_inventory(inventory(tmp_path, line)).hosts["gpu01"].jump == jump


def test_a_jump_host_named_by_the_inventory_and_the_setting_source(tmp_path):
    path = write(tmp_path, "bastion ansible_host=203.0.113.10\n[hgx]\ngpu01 ansible_host=192.0.2.11\n[hgx:vars]\n"
                           "ansible_ssh_common_args='-o ProxyJump=bastion -o ServerAliveInterval=30'\n", "hosts")
    inv = load_inventory(path)
    gpu01 = inv.hosts["gpu01"]
    assert gpu01.jump == "bastion" and gpu01.setting_sources["jump"] == "group:hgx"
    assert inv.jump_host(gpu01).address == "203.0.113.10"
    assert inv.warnings == [f"{path}:5:1: hgx.vars.ansible_ssh_common_args: not read by gpuprov (it connects with "
                            "its own SSH client): '-o ServerAliveInterval=30'"]


def test_args_without_a_jump_host_leave_the_groups_jump_host(tmp_path):
    path = write(tmp_path, "[hgx]\ngpu01 ansible_ssh_extra_args='-C'\n[hgx:vars]\n"
                           "ansible_ssh_common_args='-J ops@203.0.113.10'\n", "hosts")
    assert load_inventory(path).hosts["gpu01"].jump == "ops@203.0.113.10"


@pytest.mark.parametrize("line, message", [
    ("ansible_ssh_common_args='-o ProxyCommand=\"ssh -W %h:%p ops@203.0.113.10\"'",
     "4:25: hgx.vars.ansible_ssh_common_args: ProxyCommand 'ssh -W %h:%p ops@203.0.113.10' is not read: gpuprov runs "
     "no local command to connect; give -o ProxyJump=user@host[:port] instead (what `ssh -W %h:%p user@host` does), "
     "or gpuprov_jump"),
    ("ansible_ssh_common_args='-J ops@a.example.net,ops@b.example.net'",
     "4:25: hgx.vars.ansible_ssh_common_args: a chain of jump hosts 'ops@a.example.net,ops@b.example.net': gpuprov "
     "connects through one jump host; name the last one and make it reachable directly"),
    ("ansible_ssh_common_args='-J ops@a.example.net -o ProxyJump=ops@b.example.net'",
     "4:25: hgx.vars.ansible_ssh_common_args: two jump hosts ('ops@a.example.net', 'ops@b.example.net'): give one"),
    ("ansible_ssh_common_args='-o ProxyJump=\"unclosed'",
     "4:25: hgx.vars.ansible_ssh_common_args: cannot split the ssh arguments '-o ProxyJump=\"unclosed': No closing "
     "quotation"),
    ("ansible_ssh_common_args='-o ProxyJump=ops@bad_host!'",
     "4:25: hgx.vars.ansible_ssh_common_args: bad jump 'ops@bad_host!': bad address 'bad_host!' in jump host"),
    ("ansible_ssh_extra_args=42", "4:24: hgx.vars.ansible_ssh_extra_args: ssh arguments must be text, not int"),
    ("ansible_become=maybe", "4:16: hgx.vars.ansible_become: ansible_become must be true or false, not 'maybe'"),
    ("ansible_become_user=postgres",
     "4:21: hgx.vars.ansible_become_user: become user 'postgres' is not supported: gpuprov runs its steps as root "
     "(through sudo when the user is not root); remove it or set it to root"),
    ("ansible_become_method=doas",
     "4:23: hgx.vars.ansible_become_method: become method 'doas' is not supported: gpuprov becomes root with sudo "
     "only; remove it or set it to sudo"),
    ("ansible_group_priority=high",
     "4:24: hgx.vars.ansible_group_priority: ansible_group_priority must be an integer, not 'high'"),
])
def test_what_gpuprov_cannot_do_as_ssh_or_become_would_is_refused_where_written(tmp_path, capsys, line, message):
    path = inventory(tmp_path, line)
    assert check_fails(path, capsys) == [f"{path}:{message}", f"1 error in {path}"]


@pytest.mark.parametrize("line", ["ansible_become=true", "ansible_become=yes", "ansible_become=False",
                                  "ansible_become_user=root", "ansible_become_method=sudo"])
def test_become_to_root_with_sudo_is_accepted(tmp_path, line):
    assert load_inventory(inventory(tmp_path, line)).hosts["gpu01"].vars == {}
