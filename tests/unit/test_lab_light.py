"""gpuprov.lab.light's pure parts: host plan (names, ports, refused counts) and the inventory/known_hosts it writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuprov.core.errors import InputError
from gpuprov.lab.keys import render_known_hosts
from gpuprov.lab.light import LightFiles, LightHost, plan_hosts, render_inventory
from gpuprov.lab.state import LabPaths

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl root@gpuprov-light-001"


def test_plan_names_and_ports_are_distinct_and_counted_from_one():
    hosts = plan_hosts(3, base=43000)
    assert hosts == [LightHost("gpuprov-light-001", 43001), LightHost("gpuprov-light-002", 43002),
                     LightHost("gpuprov-light-003", 43003)]
    assert all(h.address == "127.0.0.1" for h in hosts)


def test_plan_of_128_hosts_has_128_distinct_ports():
    hosts = plan_hosts(128, base=43000)
    assert len({h.port for h in hosts}) == 128
    assert (hosts[0].port, hosts[-1].port, hosts[-1].name) == (43001, 43128, "gpuprov-light-128")


@pytest.mark.parametrize("count", [0, -1, 513, 2.5, "8", True, None])
def test_bad_counts_are_refused(count):
    with pytest.raises(InputError, match="count"):
        plan_hosts(count, base=43000)


@pytest.mark.parametrize("base", [80, 65500])
def test_ports_outside_the_unprivileged_range_are_refused(base):
    with pytest.raises(InputError, match="ports"):
        plan_hosts(64, base=base)


def test_known_hosts_uses_the_bracketed_host_port_form():
    # sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT": a non-standard port is written [host]:port; the comment is dropped
    text = render_known_hosts([("127.0.0.1", 43001, KEY)])
    assert text == ("[127.0.0.1]:43001 ssh-ed25519 "
                    "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")


def test_inventory_names_every_host_with_its_port_and_the_light_known_hosts(tmp_path: Path):
    files = LightFiles.of(LabPaths(tmp_path))
    assert files.inventory == tmp_path / ".lab" / "light" / "inventory.yaml"
    document = yaml.safe_load(render_inventory(plan_hosts(2, base=43000), files))
    assert document["known_hosts"] == "known_hosts"
    assert document["defaults"] == {"user": "root", "identity_file": str(tmp_path / ".lab" / "id_ed25519")}
    assert document["hosts"] == {
        "gpuprov-light-001": {"address": "127.0.0.1", "port": 43001, "groups": ["light"]},
        "gpuprov-light-002": {"address": "127.0.0.1", "port": 43002, "groups": ["light"]},
    }


def test_the_inventory_loads_as_a_gpuprov_inventory(tmp_path: Path):
    from gpuprov.inventory import load_inventory

    files = LightFiles.of(LabPaths(tmp_path))
    files.folder.mkdir(parents=True)
    files.key.write_text("a private key\n", encoding="utf-8")   # the inventory checks that the file is there
    files.known_hosts.write_text(render_known_hosts([("127.0.0.1", 43001, KEY)]), encoding="utf-8")
    files.inventory.write_text(render_inventory(plan_hosts(1, base=43000), files), encoding="utf-8")
    inventory = load_inventory(files.inventory)
    host = inventory.hosts["gpuprov-light-001"]
    assert (host.address, host.port, host.user) == ("127.0.0.1", 43001, "root")
    assert Path(inventory.known_hosts) == files.known_hosts
