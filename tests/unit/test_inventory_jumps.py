"""Jump chains: gpuprov connects through one jump host, so a jump host with a jump host of its own is refused by
inventory.check, located at the jump setting and naming the hop that has its own jump, never silently shortened;
a host task on such an inventory exits 2 before any host is contacted."""

from __future__ import annotations

import pytest
from helpers.inventory import check_fails, write
from invoke import Config, Context
from invoke.exceptions import Exit

from gpuprov.inventory import load_inventory
from gpuprov.tasks import provision as provision_tasks

TAIL = ("and gpuprov connects through one jump host, never skipping a hop; set jump: null on 'bastion' if gpuprov can "
        "reach it directly, or jump through a host it can")


def test_a_jump_host_with_its_own_jump_host_is_refused(tmp_path, capsys):
    path = write(tmp_path, """\
        hosts:
          outer: {address: 203.0.113.5}
          bastion: {address: 10.0.0.9, jump: outer}
          gpu01: {address: 10.0.0.1, jump: bastion}
        """)
    assert check_fails(path, capsys) == [
        f"{path}:4:36: hosts.gpu01.jump: jump chain gpu01 -> bastion -> outer: the jump host 'bastion' has a jump "
        f"host of its own, {TAIL}",
        f"1 error in {path}",
    ]


def test_a_chain_set_once_for_many_hosts_is_one_error_at_that_setting(tmp_path, capsys):
    path = write(tmp_path, """\
        defaults:
          jump: bastion
        hosts:
          bastion: {address: 10.0.0.9, jump: ops@203.0.113.5:2222}
          gpu01: {address: 10.0.0.1}
          gpu02: {address: 10.0.0.2}
          gpu03: {address: 10.0.0.3}
        """)
    assert check_fails(path, capsys) == [
        f"{path}:2:9: defaults.jump: jump chain gpu01 -> bastion -> ops@203.0.113.5:2222 (and 2 more hosts through "
        f"the same setting): the jump host 'bastion' has a jump host of its own, {TAIL}",
        f"1 error in {path}",
    ]


def test_one_hop_is_fine(tmp_path):
    inventory = load_inventory(write(tmp_path, """\
        defaults:
          jump: bastion
        hosts:
          bastion: {address: 10.0.0.9, jump: null}
          gpu01: {address: 10.0.0.1}
          gpu02: {address: 10.0.0.2, jump: ops@203.0.113.5}
        """))
    assert inventory.jump_host(inventory.hosts["gpu01"]) is inventory.hosts["bastion"]
    assert inventory.jump_host(inventory.hosts["bastion"]) is None
    assert inventory.jump_host(inventory.hosts["gpu02"]).address == "203.0.113.5"


@pytest.mark.parametrize(("jump", "message"), [
    ("ops@bastion:２２", "bad jump 'ops@bastion:２２': bad port '２２': it has digits that are not ASCII; write it "
                        "with the digits 0-9"),
    ("ops@bastion:22²", "bad jump 'ops@bastion:22²': bad port '22²': it has digits that are not ASCII; write it with "
                       "the digits 0-9"),
    ("ops@bastion:0", "bad jump 'ops@bastion:0': bad port '0': give an integer from 1 to 65535"),
])
def test_a_jump_port_is_ascii_digits(tmp_path, capsys, jump, message):
    path = write(tmp_path, f"hosts:\n  gpu01: {{address: 10.0.0.1, jump: '{jump}'}}\n")
    assert check_fails(path, capsys) == [f"{path}:2:36: hosts.gpu01.jump: {message}", f"1 error in {path}"]


def test_provision_through_a_chain_contacts_no_host(tmp_path, capsys, monkeypatch):
    contacted: list[str] = []
    monkeypatch.setattr("gpuprov.core.executor.connect", lambda host, *args, **kwargs: contacted.append(host.name))
    path = write(tmp_path, """\
        hosts:
          outer: {address: 192.0.2.5}
          bastion: {address: 192.0.2.9, jump: outer}
          gpu01: {address: 192.0.2.11, jump: bastion}
        """)
    c = Context(Config(overrides={"gpuprov": {"reports": str(tmp_path / "reports"), "locks": str(tmp_path / "locks"),
                                              "known_hosts": str(tmp_path / "known_hosts")}}))
    with pytest.raises(Exit) as info:
        provision_tasks.provision(c, host=["gpu01"], inventory=str(path))
    assert info.value.code == 2 and contacted == []
    assert "jump chain gpu01 -> bastion -> outer" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv.yaml"]
