"""--host patterns with the meaning of Ansible's --limit: the examples of Ansible's "Patterns: targeting hosts and
groups" (docs/docsite/rst/inventory_guide/intro_patterns.rst, ansible-documentation), gpuprov's refusals, and the
selections of a real ansible-core where one is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.core.errors import InputError
from gpuprov.inventory import load_inventory
from gpuprov.inventory.limit import parse_pattern, split_patterns

# the documentation's hosts and groups: its common patterns, its wildcards (192.0.*, *.example.com, one*.com) and
# its position example ([webservers] cobweb webbing weber)
DOC_INI = """\
one.example.com
two.example.com
192.0.2.50
[webservers]
cobweb
webbing
weber
[dbservers]
db1.example.com
one.example.com
[atlanta]
cobweb
db1.example.com
[staging]
webbing
db1.example.com
[phoenix]
webbing
"""
EVERY = ["one.example.com", "two.example.com", "192.0.2.50", "cobweb", "webbing", "weber", "db1.example.com"]

DOCUMENTED = [
    # (pattern, hosts it targets by the documentation's words)
    ("all", EVERY),
    ("*", EVERY),
    ("one.example.com", ["one.example.com"]),
    ("one.example.com:two.example.com", ["one.example.com", "two.example.com"]),
    ("one.example.com,two.example.com", ["one.example.com", "two.example.com"]),
    ("192.0.2.50", ["192.0.2.50"]),
    ("192.0.*", ["192.0.2.50"]),
    ("*.example.com", ["one.example.com", "two.example.com", "db1.example.com"]),
    ("*.com", ["one.example.com", "two.example.com", "db1.example.com"]),
    ("one*.com:dbservers", ["one.example.com", "db1.example.com"]),
    ("webservers", ["cobweb", "webbing", "weber"]),
    ("webservers:dbservers", ["cobweb", "webbing", "weber", "db1.example.com", "one.example.com"]),
    ("webservers:!atlanta", ["webbing", "weber"]),
    ("webservers:&staging", ["webbing"]),
    ("webservers:dbservers:&staging:!phoenix", ["db1.example.com"]),
    ("all:!cobweb", [h for h in EVERY if h != "cobweb"]),
    ("~(web|db).*\\.example\\.com", ["db1.example.com"]),
    ("webservers[0]", ["cobweb"]),
    ("webservers[-1]", ["weber"]),
    ("webservers[0:2]", ["cobweb", "webbing", "weber"]),
    ("webservers[1:2]", ["webbing", "weber"]),
    ("webservers[1:]", ["webbing", "weber"]),
    ("webservers[-0]", ["cobweb"]),
    ("webservers[1:1]", ["webbing"]),
]


@pytest.fixture(scope="module")
def doc_inventory(tmp_path_factory):
    path = tmp_path_factory.mktemp("doc") / "hosts.ini"
    path.write_text(DOC_INI)
    return load_inventory(path)


def names(inv, hosts=(), groups=()) -> set[str]:
    return {h.name for h in inv.select(list(hosts), list(groups), False)}


@pytest.mark.parametrize(("pattern", "expected"), DOCUMENTED)
def test_documented_patterns(doc_inventory, pattern, expected):
    assert names(doc_inventory, [pattern]) == set(expected)


@pytest.mark.parametrize("order", ["a:b:&c:!d:!e", "&c:a:!d:b:!e", "!d:a:!e:&c:b", "a:b:!e:!d:&c", "a,b,&c,!d,!e"])
def test_processing_order_is_the_documentations(tmp_path, order):
    """'a:b:&c:!d:!e == &c:a:!d:b:!e == !d:a:!e:&c:b': host in (a or b) and in c and in neither d nor e."""
    path = tmp_path / "hosts.ini"
    path.write_text("[a]\nh1\nh2\nh3\nh4\n[b]\nh5\nh6\n[c]\nh2\nh3\nh4\nh5\nh6\nh7\n[d]\nh3\n[e]\nh6\n")
    assert names(load_inventory(path), [order]) == {"h2", "h4", "h5"}


@pytest.mark.parametrize(("value", "patterns"), [
    # the docstring example of Ansible's split_host_pattern, and its colon rules (IPv6, ranges, ports)
    ("a,b[1], c[2:3] , d", ["a", "b[1]", "c[2:3]", "d"]),
    ("webservers:dbservers:&staging:!phoenix", ["webservers", "dbservers", "&staging", "!phoenix"]),
    ("fd00::1", ["fd00::1"]),
    ("[fd00::1]:2222", ["[fd00::1]:2222"]),
    ("gpu01:2222", ["gpu01:2222"]),
    ("gpu[01:04]", ["gpu[01:04]"]),
    ("gpu[01:04]:hgx", ["gpu[01:04]", "hgx"]),
    ("hgx[1:]:!gpu03", ["hgx[1:]", "!gpu03"]),
    ("hgx:training,gpu03", ["hgx:training", "gpu03"]),
    ("hgx training", ["hgx", "training"]),
    ("192.0.2.*:10.0.0.5", ["192.0.2.*", "10.0.0.5"]),
])
def test_values_split_as_ansible_splits_them(value, patterns):
    assert split_patterns(value) == patterns


def test_host_and_group_options_join(doc_inventory, tmp_path):
    assert names(doc_inventory, ["cobweb", "weber"]) == {"cobweb", "weber"}
    # --group's hosts come first, and `&`/`!` narrow them: `--group a --host '!h2'` is `a:!h2`, never every host
    # but h2 joined with a (which would take in h2 again, and every host outside a)
    path = tmp_path / "hosts.ini"
    path.write_text("[a]\nh1\nh2\nh3\n[b]\nh4\nh5\n[c]\nh3\nh5\n")
    inv = load_inventory(path)
    assert names(inv, ["!h2"], ["a"]) == {"h1", "h3"}
    assert names(inv, ["&c"], ["a"]) == {"h3"}
    assert names(inv, ["h1"], ["b"]) == {"h1", "h4", "h5"}
    assert names(inv, ["b:!c"], ["a"]) == {"h1", "h2", "h4"}


@pytest.mark.parametrize("value", [":!h2", "a:", "a::!h2:b", "~", "~^", "~^$", "a,,b"])
def test_an_empty_part_is_refused_not_read_as_every_host(tmp_path, value):
    # `--host "$RACK:!h2"` or `--host "~^$PREFIX"` with the variable unset: Ansible drops the empty part or matches
    # every name; gpuprov refuses, so that an unset variable never widens the selection
    path = tmp_path / "hosts.ini"
    path.write_text("[a]\nh1\nh2\n[b]\nh3\n")
    refused = refusal(load_inventory(path), value)
    assert "empty" in refused and "every host" in refused or "widen" in refused, refused


@pytest.mark.parametrize("value", ["gpu[01:04]", "gpu[01]", "gpu[0:04]"])
def test_zero_padded_positions_are_refused_even_where_a_group_gives_them_a_meaning(tmp_path, value):
    # with a group `gpu` of gpu01..gpu08, Ansible's --limit reads gpu[01:04] as the group's positions 1 to 4
    # (gpu02..gpu05): what an operator writing it rarely means
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\n" + "".join(f"gpu0{i}\n" for i in range(1, 9)))
    refused = refusal(load_inventory(path), value)
    assert "as positions in what 'gpu' selects, not as names" in refused, refused


def refusal(inv, *values, groups=()) -> str:
    with pytest.raises(InputError) as info:
        inv.select(list(values), list(groups), False)
    assert info.value.exit_code == 2
    return str(info.value)


@pytest.mark.parametrize(("value", "words"), [
    ("cobwb", ["unknown host 'cobwb'", "did you mean 'cobweb'"]),
    ("webservers:!phenix", ["pattern '!phenix'", "unknown host 'phenix'", "did you mean 'phoenix'"]),
    ("web*:&nothere", ["pattern '&nothere'", "unknown host 'nothere'"]),
    ("zz*", ["pattern 'zz*' matches no host or group"]),
    ("~^zz", ["pattern '~^zz'", "matches no host or group"]),
    ("~(", ["pattern '~('", "bad regular expression '('"]),
    ("webservers[3]", ["pattern 'webservers[3]'", "selects 3 hosts, at positions 0 to 2 (or -3 to -1)"]),
    ("webservers[2:1]", ["pattern 'webservers[2:1]'", "none at positions 2 to 1"]),
    ("webservers[1-2]", ["pattern 'webservers[1-2]'", "write [1:2] for positions"]),
    ("webservers[2:0]", ["[2:0] selects position 2 in Ansible", "write [2] for one host"]),
    ("webservers[:3]", ["pattern 'webservers[:3]' matches no host or group"]),
    ("webservers:&dbservers", ["--host 'webservers:&dbservers' selects no host"]),
    ("webservers:!webservers", ["--host 'webservers:!webservers' selects no host"]),
    ("webservers,weber:cobweb", ["pattern 'weber:cobweb'", "Ansible splits at commas only", "write weber,cobweb"]),
    ("cobweb:22", ["pattern 'cobweb:22' matches no host or group", "a host and a port"]),
    ("@retry.txt", ["--limit @FILE reads patterns from a file, gpuprov does not"]),
    ("!", ["'!' needs a host or group pattern after it"]),
    (" : ", ["--host ' : ' has an empty part between colons"]),
])
def test_a_pattern_that_selects_nothing_is_exit_2_naming_it(doc_inventory, value, words):
    message = refusal(doc_inventory, value)
    for word in words:
        assert word in message, message


def test_every_problem_is_named_at_once(doc_inventory):
    message = refusal(doc_inventory, "cobwb,!phenix", ":", groups=["webserver"])
    assert "unknown host 'cobwb'" in message and "unknown host 'phenix'" in message
    assert "--host ':' has an empty part between colons" in message
    assert "unknown group 'webserver' (did you mean 'webservers'?)" in message


def test_an_inventory_range_written_as_a_pattern_says_how_to_name_the_hosts(tmp_path):
    """Ansible's --limit reads gpu[01:04] as positions 1 to 4 of a host or group `gpu`, not as names."""
    path = tmp_path / "hosts.ini"
    path.write_text("[hgx]\ngpu[01:06]\n")
    message = refusal(load_inventory(path), "gpu[01:04]")
    assert "pattern 'gpu[01:04]': 'gpu' matches no host or group" in message
    assert "[01:04] picks positions in what 'gpu' selects, not names" in message
    assert "for the hosts gpu01 to gpu04 write gpu01,gpu02,gpu03,gpu04" in message
    assert names(load_inventory(path), ["gpu01,gpu02,gpu03,gpu04"]) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    assert names(load_inventory(path), ["hgx[0:3]"]) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    assert names(load_inventory(path), ["~gpu0[1-4]$"]) == {"gpu01", "gpu02", "gpu03", "gpu04"}


# ---------- against ansible-core: the expected selections come from Ansible itself ----------

ANSIBLE_INI = """\
solo
10.0.0.5
[hgx]
gpu01
gpu02
[pcie]
gpu03
gpu04
[training:children]
hgx
pcie
[training]
gpu05
[canary]
gpu02
gpu04
[db-a]
db01
"""
BASES = ["all", "*", "ungrouped", "hgx", "pcie", "training", "canary", "db-a", "solo", "10.0.0.5", "gpu01", "gpu04",
         "gpu05", "db01", "gpu0*", "g?u0[13]", "*.0.0.5", "10.0.*", "db*", "*a*", "~gpu0[12]", "~(hgx|pcie)$",
         "~d", "nosuch", "gpu9"]
PART = st.builds(lambda op, base, pos: op + base + pos, st.sampled_from(["", "", "&", "!"]), st.sampled_from(BASES),
                 st.sampled_from(["", "", "", "[0]", "[-1]", "[0:1]", "[1:]"]))
VALUE = st.builds(lambda parts, sep: sep.join(parts), st.lists(PART, min_size=1, max_size=4),
                  st.sampled_from([",", ":"]))
ANSIBLE = shutil.which("ansible-playbook") and shutil.which("ansible")


def ansible_env(tmp: Path) -> dict:
    return {**os.environ, "ANSIBLE_HOME": str(tmp / "ansible"), "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
            "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_DEPRECATION_WARNINGS": "false"}


def ansible_selections(inventory: Path, patterns: list[str]) -> list[set[str]]:
    """Each pattern's hosts per ansible-playbook --list-hosts, one play per pattern: a play's `hosts:` goes
    through the same evaluation as --limit (InventoryManager._evaluate_patterns); one process for all."""
    playbook = inventory.parent / "plays.yml"
    playbook.write_text(json.dumps([{"name": f"p{i}", "hosts": p, "gather_facts": False, "tasks": []}
                                    for i, p in enumerate(patterns)]))
    proc = subprocess.run(["ansible-playbook", "-i", str(inventory), "--list-hosts", str(playbook)],
                          capture_output=True, text=True, timeout=120, env=ansible_env(inventory.parent))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blocks = re.split(r"\n  play #\d+ ", proc.stdout)[1:]
    assert len(blocks) == len(patterns), proc.stdout
    return [set(re.findall(r"^      (\S+)$", block, re.M)) for block in blocks]


def ansible_limit(inventory: Path, value: str) -> tuple[int, set[str], str]:
    """`ansible all --list-hosts --limit VALUE`: (exit code, hosts, output)."""
    proc = subprocess.run(["ansible", "all", "-i", str(inventory), "--list-hosts", "--limit", value],
                          capture_output=True, text=True, timeout=60, env=ansible_env(inventory.parent))
    return proc.returncode, set(re.findall(r"^    (\S+)$", proc.stdout, re.M)), proc.stdout + proc.stderr


def gpuprov_selection(inv, value: str) -> set[str] | None:
    try:
        return names(inv, [value])
    except InputError:
        return None


@pytest.fixture(scope="module")
def ansible_inventory(tmp_path_factory):
    path = tmp_path_factory.mktemp("ansible") / "hosts.ini"
    path.write_text(ANSIBLE_INI)
    return path


@pytest.mark.tool
@pytest.mark.skipif(not ANSIBLE, reason="ansible-core is not installed")
@pytest.mark.parametrize(("value", "ansible_fails"), [
    ("training[0]", False), ("training[1:]:!gpu02", False), ("gpu0*:&canary,db01", False), ("!training", False),
    ("webservers[:3]", True), ("hgx[9]", True), ("~(", True), ("hgx:gpu05,solo", False),
])
def test_limit_selects_what_ansible_selects(ansible_inventory, value, ansible_fails):
    """Against `ansible all --limit`: the same hosts, or gpuprov refuses where Ansible fails or selects nothing
    (or, the comma case, warns that a part matches nothing)."""
    code, hosts, output = ansible_limit(ansible_inventory, value)
    assert (code != 0) == ansible_fails, output
    mine = gpuprov_selection(load_inventory(ansible_inventory), value)
    if mine is None:
        assert ansible_fails or not hosts or "Could not match supplied host pattern" in output, output
    else:
        assert mine == hosts, output


SPLITS = ["fd00::1", "[fd00::1]:22", "zz01:2222", "zz[01:04]", "zz[01:04]:yy", "zza:zzb", "zzc zzd", "10.9.9.9:22",
          "zze,zzf:zzg", "zz-x[a:c]", "1:2", "ab::cd", "dead:beef", "zz_:22", "ff[0:1]:zzq[3]", "zzh:&zzi:!zzj"]


@pytest.mark.tool
@pytest.mark.skipif(not ANSIBLE, reason="ansible-core is not installed")
def test_values_split_where_ansible_splits_them(ansible_inventory):
    """Names no host or group has: Ansible warns for each expression it tried, in order, once each."""
    playbook = ansible_inventory.parent / "splits.yml"
    playbook.write_text(json.dumps([{"name": f"p{i}", "hosts": value, "gather_facts": False, "tasks": []}
                                    for i, value in enumerate(SPLITS)]))
    proc = subprocess.run(["ansible-playbook", "-i", str(ansible_inventory), "--list-hosts", str(playbook)],
                          capture_output=True, text=True, timeout=120,
                          env={**ansible_env(ansible_inventory.parent), "COLUMNS": "1000"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warned = re.findall(r"Could not match supplied host pattern, ignoring: (.+)$", proc.stderr, re.M)
    mine = [parse_pattern(part).expr for value in SPLITS for part in split_patterns(value)]
    assert warned == list(dict.fromkeys(mine))


@pytest.mark.tool
@pytest.mark.skipif(not ANSIBLE, reason="ansible-core is not installed")
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(VALUE, min_size=20, max_size=30))
def test_random_patterns_select_what_ansible_selects(ansible_inventory, values):
    """Random names, wildcards, regexes, positions and operators: each pattern gpuprov accepts selects Ansible's
    hosts; each part does on its own too; gpuprov refuses exactly where a part, or the whole, selects nothing."""
    inv = load_inventory(ansible_inventory)
    parts = sorted({part.lstrip("&!") for value in values for part in split_patterns(value)})
    expected = ansible_selections(ansible_inventory, values + parts)
    whole, alone = expected[:len(values)], dict(zip(parts, expected[len(values):], strict=True))
    for value, hosts in zip(values, whole, strict=True):
        mine = gpuprov_selection(inv, value)
        empty_part = any(not alone[part.lstrip("&!")] for part in split_patterns(value))
        assert mine == (None if empty_part or not hosts else hosts), value
    for part, hosts in alone.items():
        assert gpuprov_selection(inv, part) == (hosts or None), part


def test_the_ansible_inventory_reads_as_ansible_orders_it(ansible_inventory):
    """The order positions count in (the group's own hosts, then its children's), on the inventory the tool
    tests use; the expected lists are `ansible training --list-hosts` and `ansible all --list-hosts` of it."""
    inv = load_inventory(ansible_inventory)
    assert [sorted(names(inv, [f"training[{i}]"])) for i in range(5)] == [
        ["gpu05"], ["gpu01"], ["gpu02"], ["gpu03"], ["gpu04"]]
    assert [sorted(names(inv, [f"all[{i}]"])) for i in range(8)] == [
        ["solo"], ["10.0.0.5"], ["gpu05"], ["gpu02"], ["gpu04"], ["db01"], ["gpu01"], ["gpu03"]]
