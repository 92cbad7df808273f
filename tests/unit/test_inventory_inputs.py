"""Say what is really wrong, and print it literally: an identity file that is a folder or not a regular file,
digits that are not ASCII (a superscript or full-width port), control characters in names (escaped, so no input
can forge an extra FILE:LINE:COL line), and stack pins or GPU models gpuprov's data does not have."""

from __future__ import annotations

import os

import pytest
from helpers.inventory import check_fails, write


@pytest.mark.parametrize(("make", "problem"), [
    (lambda p: p.mkdir(), "is a folder, not a file"),
    (lambda p: os.mkfifo(p), "is not a regular file (a device, a pipe or a socket)"),
    (lambda p: None, "not found"),
])
def test_an_identity_file_that_is_not_a_regular_file(tmp_path, capsys, make, problem):
    make(tmp_path / "key")
    path = write(tmp_path, "defaults:\n  identity_file: key\nhosts:\n  h1: {address: 10.0.0.1}\n")
    assert check_fails(path, capsys) == [
        f"{path}:2:18: defaults.identity_file: identity file {tmp_path / 'key'} {problem} (relative paths are "
        f"relative to the inventory's folder {tmp_path})",
        f"1 error in {path}",
    ]


def test_an_absolute_identity_file_path_is_not_explained_as_relative(tmp_path, capsys):
    path = write(tmp_path, "defaults:\n  identity_file: /dev/null\nhosts:\n  h1: {address: 10.0.0.1}\n")
    assert check_fails(path, capsys) == [
        f"{path}:2:18: defaults.identity_file: identity file /dev/null is not a regular file (a device, a pipe or "
        "a socket)",
        f"1 error in {path}",
    ]


@pytest.mark.parametrize(("text", "error"), [
    ("hosts:\n  h1: {address: 10.0.0.1, port: '22²'}\n",
     "2:33: hosts.h1.port: bad port '22²': it has digits that are not ASCII; write it with the digits 0-9"),
    ("hosts:\n  h1: {address: 10.0.0.1, port: '２２'}\n",
     "2:33: hosts.h1.port: bad port '２２': it has digits that are not ASCII; write it with the digits 0-9"),
    ("hosts:\n  h1: {address: 10.0.0.1, port: '22'}\n",
     "2:33: hosts.h1.port: bad port '22': give an integer from 1 to 65535 (without quotes)"),
    ("all:\n  hosts:\n    h1: {ansible_host: 10.0.0.1, ansible_port: '22²'}\n",
     "3:48: all.hosts.h1.ansible_port: bad port '22²': it has digits that are not ASCII; write it with the "
     "digits 0-9"),
    ("hosts:\n  h1:\n    address: 10.0.0.1\n    vars: {firewall: {allow: [{port: '٢٢', sources: [10.0.0.0/8]}]}}\n",
     "4:38: hosts.h1.vars.firewall.allow[0].port: bad port '٢٢': it has digits that are not ASCII; write it with "
     "the digits 0-9"),
])
def test_a_port_with_digits_that_are_not_ascii_says_so(tmp_path, capsys, text, error):
    path = write(tmp_path, text)
    assert check_fails(path, capsys) == [f"{path}:{error}", f"1 error in {path}"]


def test_control_characters_in_names_cannot_forge_a_line(tmp_path, capsys):
    forged = "x\\n/etc/passwd:1:1: hosts.root: fine"
    path = write(tmp_path, f'hosts:\n  "{forged}": {{address: 10.0.0.1}}\n  h2:\n    vars: {{"a\\e[31m": 1}}\n'
                           '    prot: 1\n')
    assert check_fails(path, capsys) == [
        f"{path}:2:3: hosts.x\\n/etc/passwd:1:1: hosts.root: fine: bad host name 'x\\n/etc/passwd:1:1: "
        "hosts.root: fine': use letters, digits, '.', '_', ':' and '-'",
        f"{path}:5:5: hosts.h2.prot: unknown host key 'prot' (did you mean 'port'?); expected one of: address, "
        "port, user, identity_file, jump, sudo, groups, vars",
        f"2 errors in {path}",
    ]


@pytest.mark.parametrize(("stack", "col", "message"), [
    ("{driver: '570.999'}", 23, "NVIDIA never published 570.999 as far as gpuprov's data knows; published 570 "
                                "versions: "),
    ("{cuda: '１２.８'}", 21, "CUDA version '１２.８' has digits that are not ASCII ('１', '２', '８'); write it "
                            "with the digits 0-9"),
    ("{ngc: '25.13'}", 20, "unknown NGC PyTorch tag '25.13'. Accepted: "),
])
def test_check_refuses_what_the_resolver_cannot_resolve(tmp_path, capsys, stack, col, message):
    path = write(tmp_path, f"hosts:\n  h1:\n    vars:\n      stack: {stack}\n")
    [error, count] = check_fails(path, capsys)
    assert error.startswith(f"{path}:4:{col}: hosts.h1.vars.stack.{stack[1:stack.index(':')]}: {message}"), error
    assert count == f"1 error in {path}"


def test_an_unknown_gpu_model_has_a_did_you_mean(tmp_path, capsys):
    path = write(tmp_path, "groups:\n  hgx:\n    vars:\n      hardware: {gpu: H100-SMX, count: 8}\nhosts:\n"
                           "  h1: {groups: [hgx]}\n")
    [error, count] = check_fails(path, capsys)
    assert error.startswith(f"{path}:4:23: groups.hgx.vars.hardware.gpu: unknown GPU model 'H100-SMX' (did you "
                            "mean 'H100-SXM'"), error
    assert count == f"1 error in {path}"
