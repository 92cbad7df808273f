"""A sudo password set for a host whose sudo needs none (NOPASSWD, as the lab's gpuadmin has) is never executed
as a line of a batch nor written anywhere on the host, judged with real OpenSSH and sudo."""

from __future__ import annotations

import json
import os

import pytest
from labutil import copy_inventory, invoke, on_host

pytestmark = pytest.mark.lab
SUDO_VAR = "GPUPROV_TEST_SUDO_PASSWORD"


def test_a_sudo_password_is_never_run_nor_written_where_sudo_needs_none(lab, tmp_path):
    name = lab.hosts[1].name
    token = os.urandom(8).hex()
    password = f"touch /tmp/gpuprov-ran-{token}"  # what `sh -s` would do with it, as root, if it read it

    def as_gpuadmin(document):
        document["hosts"][name]["user"] = "gpuadmin"
        document["hosts"][name]["sudo"] = {"password_env": SUDO_VAR}

    assert "NOPASSWD" in on_host(lab, name, "cat /etc/sudoers.d/gpuadmin")
    inventory = copy_inventory(lab, tmp_path, edit=as_gpuadmin)
    proc = invoke("facts", "--host", name, "--json", "--inventory", str(inventory), env={SUDO_VAR: password})
    assert json.loads(proc.stdout)[name]["pci_gpus"]  # the batch ran, through sudo
    assert token not in proc.stdout + proc.stderr
    on_host(lab, name, f"test ! -e /tmp/gpuprov-ran-{token}")  # the password line was not executed
    found = on_host(lab, name, f"(grep -rlF {token} /etc /root /home /tmp /var /run 2>/dev/null; "
                               f"journalctl --no-pager -o cat 2>/dev/null | grep -F {token}) || true")
    assert found == ""  # in no file, log or journal entry of the host
