"""YAML as people write it: keys are their text (`on`, `yes` and `1` are host names, never a boolean or a number),
every error is at its own key, and a syntax error names where the parser noticed it and where the construct it
was reading began. Each bad file is exit 2 from `inventory.check`, with the exact text, and stays as it was."""

from __future__ import annotations

import pytest
from helpers.inventory import check_fails, write
from invoke import Context

from gpuprov.inventory import load_inventory
from gpuprov.tasks import inventory as inventory_tasks


def test_yaml_1_1_booleans_and_numbers_are_host_names(tmp_path, capsys):
    path = write(tmp_path, """\
        hosts:
          on: {address: 10.0.0.1}
          yes: {address: 10.0.0.2}
          1: {address: 10.0.0.3}
          01: {address: 10.0.0.4}
          true: {address: 10.0.0.5, vars: {off: 1, 2: two}}
        """)
    inventory_tasks.check(Context(), inventory=str(path))
    assert capsys.readouterr().out == (f"{path}: ok (native format): 5 hosts, 0 groups\n"
                                       "hosts: on, yes, 1, 01, true\n")
    host = load_inventory(path).hosts["true"]
    assert host.address == "10.0.0.5" and host.vars == {"off": 1, "2": "two"}


def test_the_same_text_quoted_or_not_is_the_same_key(tmp_path, capsys):
    path = write(tmp_path, 'hosts:\n  on: {address: 10.0.0.1}\n  "on": {address: 10.0.0.2}\n')
    assert check_fails(path, capsys) == [f"{path}:3:3: hosts.on: duplicate host 'on' (first at line 2)",
                                         f"1 error in {path}"]


def test_a_list_mapping_or_tagged_key_is_an_error_at_that_key(tmp_path, capsys):
    path = write(tmp_path, """\
        hosts:
          h1:
            address: 10.0.0.1
            vars:
              site: dc1
              ? [a, b]
              : x
              ? {a: 1}
              : y
              !custom key: 1
        """)
    assert check_fails(path, capsys) == [
        f"{path}:6:9: hosts.h1.vars: a key must be a plain value, not a list",
        f"{path}:8:9: hosts.h1.vars: a key must be a plain value, not a mapping",
        f"{path}:10:7: hosts.h1.vars.key: unsupported YAML tag '!custom' on a key: a key is plain text",
        f"3 errors in {path}",
    ]


@pytest.mark.parametrize(("text", "expected"), [
    # an unclosed [ on line 7, noticed on line 8
    ("defaults:\n  user: ops\nhosts:\n  h1:\n    address: 10.0.0.1\n    vars:\n      racks: [r1, r2\n"
     "      site: dc1\n",
     "8:11: (file): YAML syntax error: did not find expected ',' or ']' (while parsing a flow sequence that began "
     "at line 7, column 14)"),
    ("hosts:\n  h1:\n    address: \"10.0.0.1\n    user: ops\n",
     "5:1: (file): YAML syntax error: found unexpected end of stream (while scanning a quoted scalar that began at "
     "line 3, column 14)"),
    ("hosts:\n  h1: {address: 10.0.0.1}\n  h2: {address: 10.0.0.2\n  h3: {address: 10.0.0.3}\n",
     "4:5: (file): YAML syntax error: did not find expected ',' or '}' (while parsing a flow mapping that began at "
     "line 3, column 7)"),
    ("hosts:\n  h1: {address: 10.0.0.1}\n   h2: {}\n",
     "3:4: (file): YAML syntax error: did not find expected key (while parsing a block mapping that began at "
     "line 2, column 3)"),
])
def test_a_syntax_error_names_where_it_was_noticed_and_where_the_construct_began(tmp_path, capsys, text,
                                                                                   expected):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    assert check_fails(path, capsys) == [f"{path}:{expected}", f"1 error in {path}"]


def test_a_value_error_is_at_the_value_and_a_key_error_at_the_key(tmp_path, capsys):
    path = write(tmp_path, """\
        hosts:
          h1:
            address: 10.0.0.1
            groups:
              - gpu
              - 7
            prot: 22
        """)
    assert check_fails(path, capsys) == [
        f"{path}:5:9: hosts.h1.groups[0]: unknown group 'gpu'",
        f"{path}:6:9: hosts.h1.groups[1]: a group name must be a string, not int",
        f"{path}:7:5: hosts.h1.prot: unknown host key 'prot' (did you mean 'port'?); expected one of: address, port, "
        "user, identity_file, jump, sudo, groups, vars",
        f"3 errors in {path}",
    ]
