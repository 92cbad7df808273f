"""Proxy and mirror logins (`https://USER:PASSWORD@host/`) never appear in inventory.check errors, in
inventory.show's table or in its --json (an error document included): gpuprov.core.secrets.mask masks them."""

from __future__ import annotations

import json

import pytest
from helpers.inventory import check_fails, write
from invoke import Context
from invoke.exceptions import Exit

from gpuprov.tasks import inventory as inventory_tasks

GOOD = """\
hosts:
  gpu01:
    address: 10.0.0.1
    vars:
      mirror: {url: "https://bob:s3cret@mirror.internal/nvidia/", proxy: "http://alice:pw0rd@proxy:3128/"}
"""
BAD = """\
hosts:
  gpu01:
    address: 10.0.0.1
    vars:
      mirror: {url: "https://bob:s3cret@mirror.internal/nvidia/", proxy: "http://alice:pw0rd@proxy:99999/"}
      container_engine: "http://carol:hunter2@x/"
"""
SECRETS = ("bob", "s3cret", "alice", "pw0rd", "carol", "hunter2")


def test_check_masks_a_password_with_an_at_sign_whole(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("pw0rd@proxy:3128/", "p@ss@proxy:99999/"))
    assert check_fails(path, capsys) == [
        f"{path}:5:74: hosts.gpu01.vars.mirror.proxy: bad URL 'http://***@proxy:99999/': give an http:// or "
        "https:// URL with a host name",
        f"1 error in {path}",
    ]


def test_check_masks_credentials_in_errors(tmp_path, capsys):
    path = write(tmp_path, BAD)
    assert check_fails(path, capsys) == [
        f"{path}:5:74: hosts.gpu01.vars.mirror.proxy: bad URL 'http://***@proxy:99999/': give an http:// or "
        "https:// URL with a host name",
        f"{path}:6:25: hosts.gpu01.vars.container_engine: bad container_engine 'http://***@x/': give docker",
        f"2 errors in {path}",
    ]


def test_show_masks_credentials_in_the_table_and_the_json(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    inventory_tasks.show(Context(), "gpu01", inventory=str(path))
    table = capsys.readouterr().out
    assert "https://***@mirror.internal/nvidia/" in table and "http://***@proxy:3128/" in table
    inventory_tasks.show(Context(), "gpu01", inventory=str(path), json_=True)
    data = json.loads(capsys.readouterr().out)
    assert data["vars"]["mirror"] == {"url": "https://***@mirror.internal/nvidia/",
                                      "proxy": "http://***@proxy:3128/"}
    assert not any(secret in table + json.dumps(data) for secret in SECRETS)


def test_show_json_of_a_bad_inventory_is_one_masked_error_document(tmp_path, capsys):
    path = write(tmp_path, BAD)
    with pytest.raises(Exit) as info:
        inventory_tasks.show(Context(), "gpu01", inventory=str(path), json_=True)
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert info.value.code == 2 and document["exit_code"] == 2
    assert document["errors"][0] == (f"{path}:5:74: hosts.gpu01.vars.mirror.proxy: bad URL "
                                      "'http://***@proxy:99999/': give an http:// or https:// URL with a host name")
    assert not any(secret in captured.out + captured.err for secret in SECRETS)
