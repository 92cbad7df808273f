"""An INI inventory that begins with ungrouped hosts (host lines before the first [section]) is read as Ansible
reads it: those hosts are in `ungrouped` (and `all`), unless a section puts them in a group. Expected values follow
Ansible's INI documentation (values are Python literals, else text) and were checked against ansible-inventory."""

from __future__ import annotations

import string

from helpers.inventory import check_fails, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.inventory import load_inventory

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

names = st.text(string.ascii_lowercase, min_size=1, max_size=3).map(lambda s: f"node-{s}")
values = st.one_of(st.integers(0, 10**6).map(lambda n: (str(n), n)),
                   st.text(string.ascii_lowercase, min_size=1, max_size=8).map(lambda s: (s, s)))
host_vars = st.dictionaries(st.text(string.ascii_lowercase, min_size=1, max_size=6).map(lambda s: f"x_{s}"), values,
                            max_size=3)


@SETTINGS
@given(hosts=st.dictionaries(names, host_vars, min_size=1, max_size=6), grouped=st.booleans(),
       lead=st.sampled_from(["", "# fleet\n", "\n\n", "; hosts\n"]))
def test_hosts_before_the_first_section_are_ungrouped(tmp_path, hosts, grouped, lead):
    lines = [" ".join([name, *(f"{key}={written}" for key, (written, _) in items.items())])
             for name, items in hosts.items()]
    text = lead + "\n".join(lines) + "\n" + ("[gpus]\ngpu01 ansible_host=192.0.2.11\n" if grouped else "")
    inventory = load_inventory(write(tmp_path, text, "hosts"))
    assert inventory.format == "ansible-ini"
    assert list(inventory.hosts) == [*hosts, *(["gpu01"] if grouped else [])]
    assert inventory.groups["ungrouped"].hosts == tuple(hosts)
    for name, items in hosts.items():
        host = inventory.hosts[name]
        assert host.groups == ("ungrouped",) and host.address == name
        assert host.vars == {key: value for key, (_, value) in items.items()}


def test_a_host_also_in_a_section_is_not_ungrouped(tmp_path):
    inventory = load_inventory(write(tmp_path, "gpu01\ngpu02\n[g]\ngpu01\n", "hosts"))
    assert inventory.groups["ungrouped"].hosts == ("gpu02",) and inventory.groups["g"].hosts == ("gpu01",)
    assert inventory.hosts["gpu01"].groups == ("g",)


def test_literals_as_ansible_reads_them(tmp_path):
    host = load_inventory(write(tmp_path, "gpu01 a=1 b=x c=True\n", "hosts")).hosts["gpu01"]
    assert host.vars == {"a": 1, "b": "x", "c": True}


def test_a_bad_ungrouped_host_line_is_located_and_exit_2(tmp_path, capsys):
    path = write(tmp_path, "# fleet\nbastion ansible_host=203.0.113.10 oops\nlogin01 ansible_port=0\n[g]\ngpu01\n",
                 "hosts")
    assert check_fails(path, capsys) == [
        f"{path}:2:35: all.hosts.bastion: expected key=value after the host, not 'oops'",
        f"{path}:3:22: all.hosts.login01.ansible_port: bad port 0: give an integer from 1 to 65535",
        f"2 errors in {path}",
    ]
