"""Large fleets load; the size guards refuse only what they are for, say what they are, and are checked before
the part they protect is read: the file's size, the nesting depth, what aliases add, what host ranges add."""

from __future__ import annotations

from helpers.inventory import check_fails
from invoke import Context

from gpuprov.inventory import load_inventory
from gpuprov.tasks import inventory as inventory_tasks


def test_a_plain_30000_host_inventory_loads(tmp_path, capsys):
    lines = ["defaults: {user: gpuadmin}", "hosts:"]
    lines += [f"  gpu{i:05d}: {{address: 10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}}}" for i in range(30_000)]
    path = tmp_path / "fleet.yaml"
    path.write_text("\n".join(lines) + "\n")
    inventory_tasks.check(Context(), inventory=str(path))
    assert capsys.readouterr().out.splitlines()[0] == f"{path}: ok (native format): 30000 hosts, 0 groups"


def test_aliases_are_bounded_by_what_they_add(tmp_path, capsys):
    items = ", ".join(["x"] * 50_000)
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults:\n  vars:\n    big: &big [{items}]\n    copy1: *big\n    copy2: *big\n"
                    "hosts:\n  h1: {address: 10.0.0.1}\n")
    assert check_fails(path, capsys) == [
        f"{path}:5:5: defaults.vars.copy2[49998]: aliases (*name) add more than 100000 values; gpuprov copies up to "
        "100000 (is an alias expanding too far?)",
        f"1 error in {path}",
    ]
    path.write_text(f"defaults:\n  vars:\n    big: &big [{items}]\n    copy1: *big\nhosts:\n  h1: {{address: x1}}\n")
    assert load_inventory(path).hosts["h1"].vars["copy1"] == ["x"] * 50_000


def test_deep_nesting_is_refused_before_the_tree_is_built(tmp_path, capsys):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  h1:\n    vars: {deep: " + "[" * 100_000 + "]" * 100_000 + "}\n")
    assert check_fails(path, capsys) == [
        f"{path}:3:78: (file): nested more than 64 levels deep; gpuprov reads YAML nested up to 64",
        f"1 error in {path}",
    ]


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, capsys):
    path = tmp_path / "inv.yaml"
    with path.open("wb") as handle:
        handle.truncate(32 * 1024 * 1024 + 1)  # sparse: nothing is written, nothing need be read
    assert check_fails(path, capsys) == [
        f"{path}:1:1: (file): the file has 33554433 bytes; gpuprov reads inventories of up to 33554432 bytes (32 MiB)",
        f"1 error in {path}",
    ]


def test_host_ranges_are_bounded_by_what_they_add(tmp_path, capsys):
    path = tmp_path / "hosts.ini"
    path.write_text("[a]\nh[0:100001]\n")
    assert check_fails(path, capsys) == [
        f"{path}:2:1: a.hosts.h[0:100001]: host range 'h[0:100001]' makes 100002 hosts; ranges add up to 100000 "
        "hosts to an inventory",
        f"1 error in {path}",
    ]
    path.write_text("[a]\nh[1:50001]\n[b]\ng[1:50002]\n")
    assert check_fails(path, capsys) == [
        f"{path}:4:1: b.hosts.g[1:50002]: host range 'g[1:50002]' makes 50002 hosts; ranges add up to 100000 hosts "
        "to an inventory; earlier ranges added 50000",
        f"1 error in {path}",
    ]
