"""The harden facts script run for real on this machine (read-only), parsed; the address gpuprov connects from is
read from the nearest ancestor that has SSH_CONNECTION (sudo clears the environment)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuprov.harden.facts import facts_script, parse_controller, parse_facts, parse_sshd


def run_script(*args: str, env_outer: dict | None = None) -> dict:
    """The script under a parent shell that has `env_outer`, itself started without SSH_CONNECTION."""
    inner = "env -u SSH_CONNECTION sh -s -- " + " ".join(args)
    proc = subprocess.run(["sh", "-c", inner], input=facts_script(), capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], **(env_outer or {})})
    assert proc.returncode == 0, proc.stderr
    return parse_facts(proc.stdout)


def os_release_id() -> str:
    for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
        if line.startswith("ID="):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no ID= in /etc/os-release")


@pytest.mark.skipif(os.geteuid() != 0, reason="the facts script runs as root")
def test_facts_of_this_machine(tmp_path):
    managed = tmp_path / "managed.conf"
    managed.write_text("Key value\n")
    facts = run_script("root", str(managed), str(tmp_path / "absent"),
                       env_outer={"SSH_CONNECTION": "203.0.113.5 50022 10.0.0.2 2222"})
    assert facts["complete"] and facts["os"]["id"] == os_release_id()
    assert facts["controller"] == {"address": "203.0.113.5", "port": 2222}
    assert facts["files"] == {str(managed): "Key value\n", str(tmp_path / "absent"): None}
    assert "root" in facts["user_groups"]
    assert facts["systemd"] is os.path.isdir("/run/systemd/system")


def test_parsers_on_what_the_tools_print():
    config, error = parse_sshd("port 22\nport 2222\nciphers aes256-ctr,aes128-ctr\nallowusers a\nallowusers b\n@@rc=0")
    assert error is None and config == {"port": ["22", "2222"], "ciphers": ["aes256-ctr,aes128-ctr"],
                                        "allowusers": ["a", "b"]}
    assert parse_sshd("/etc/ssh/sshd_config line 3: Bad configuration option: Foo\n@@rc=255") == (
        None, "/etc/ssh/sshd_config line 3: Bad configuration option: Foo")
    assert parse_sshd("") == (None, "sshd is not installed")
    assert parse_controller("fe80::1 51000 fe80::2 22") == {"address": "fe80::1", "port": 22}
    assert parse_controller("") is None
