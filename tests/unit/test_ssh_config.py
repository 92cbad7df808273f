"""OpenSSH's client config applied to an inventory (gpuprov.inventory.ssh_config): each host gets the HostName, Port,
User, IdentityFile and ProxyJump that OpenSSH's own `ssh` gives the same destination, the inventory's values winning
as ssh's command-line options do; each value taken records the file and line it came from; what gpuprov cannot
follow as ssh would is exit 2 naming the file and line.

Expected values come from OpenSSH: `ssh -G` prints the settings ssh resolves for a destination (`-l USER` and
`-p PORT` standing for the inventory's), and the IdentityFile tokens are read from `ssh -v`'s own log of the
files it tries, over a connection to `sshd -i` (OpenSSH's server on a pipe, no port opened)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from invoke import Config, Context

from gpuprov.core.config import settings
from gpuprov.core.errors import InputError
from gpuprov.inventory import load_inventory
from gpuprov.inventory.ssh_config import apply_ssh_config

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh")
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def inventory(tmp_path: Path, text: str):
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent(text))
    return load_inventory(path)


def config(tmp_path: Path, text: str, name: str = "ssh_config") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).format(tmp=tmp_path))
    return path


def ssh_g(path: Path, destination: str, *options: str) -> dict[str, str]:
    """What `ssh -G` resolves for a destination: its hostname, port, user and proxyjump."""
    out = subprocess.run(["ssh", "-G", "-F", str(path), *options, destination], capture_output=True, text=True,
                         check=True, stdin=subprocess.DEVNULL).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    return {key: lines.get(key) for key in ("hostname", "port", "user", "proxyjump")}


FLEET = """\
    # before any Host line: every host
    ServerAliveInterval 30
    Include {tmp}/conf.d/*.conf
    Host gpu-a
      HostName 127.0.0.1
      Port 2201
      User admin
    Host gpu-b
      HostName 10.9.0.2
      ProxyJump gpu-a
    Host *.rack !bad.rack
      User racker
      Port 2022
    Match originalhost gpu-m
      HostName 10.9.0.7
    Host gpu-c gpu-d
      HostName %h.example.org
    Host *
      User fallback
    """
INCLUDED = """\
    Host gpu-inc
      HostName 10.9.0.9
      Port 2200
    """
HOSTS = """\
    hosts:
      gpu-a: {}
      gpu-b: {}
      x1.rack: {}
      bad.rack: {}
      gpu-m: {}
      gpu-c: {}
      gpu-inc: {}
      gpu-set: {address: 10.1.0.1, port: 2500, user: ops}
      gpu-port: {port: 2600}
    """


@needs_ssh
@pytest.mark.tool
def test_each_host_gets_what_ssh_resolves_for_it(tmp_path):
    path = config(tmp_path, FLEET)
    config(tmp_path, INCLUDED, "conf.d/10-fleet.conf")
    inv = apply_ssh_config(inventory(tmp_path, HOSTS), path)
    given = {"gpu-set": ["-l", "ops", "-p", "2500"], "gpu-port": ["-p", "2600"]}   # the inventory's own
    for name, host in inv.hosts.items():
        expected = ssh_g(path, "10.1.0.1" if name == "gpu-set" else name, *given.get(name, []))
        assert {"hostname": host.address, "port": str(host.port), "user": host.user, "proxyjump": host.jump} \
            == expected, name


@needs_ssh
@pytest.mark.tool
def test_what_came_from_the_file_says_where(tmp_path):
    path = config(tmp_path, FLEET)
    config(tmp_path, INCLUDED, "conf.d/10-fleet.conf")
    inv = apply_ssh_config(inventory(tmp_path, HOSTS), path)
    assert inv.hosts["gpu-b"].setting_sources == {"address": f"{path}:9", "user": f"{path}:19",
                                                  "jump": f"{path}:10"}
    assert inv.hosts["gpu-inc"].setting_sources == {"address": f"{tmp_path}/conf.d/10-fleet.conf:2",
                                                    "port": f"{tmp_path}/conf.d/10-fleet.conf:3",
                                                    "user": f"{path}:19"}
    assert inv.hosts["gpu-set"].setting_sources == {"address": "host", "port": "host", "user": "host"}
    assert inv.hosts["gpu-port"].setting_sources == {"address": "host name", "port": "host", "user": f"{path}:19"}


def test_inventory_show_prints_where_each_setting_came_from(tmp_path, capsys):
    from gpuprov.tasks.inventory import _print_host

    path = config(tmp_path, FLEET)
    config(tmp_path, INCLUDED, "conf.d/10-fleet.conf")
    inv = apply_ssh_config(inventory(tmp_path, HOSTS), path)
    _print_host({**inv.hosts["gpu-b"].to_dict(), "jump_via": {"name": "gpu-a", "address": "127.0.0.1",
                                                               "port": 2201, "user": "admin"},
                 "inventory": str(inv.path)})
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:4]]
            for line in capsys.readouterr().out.splitlines() if line.count("│") == 4}
    assert rows["address"] == ["10.9.0.2", f"{path}:9"]
    assert rows["port"] == ["22", "built-in"]
    assert rows["jump"] == ["gpu-a", f"{path}:10"]


@needs_ssh
@pytest.mark.tool
@pytest.mark.skipif(not os.access(SSHD, os.X_OK), reason="needs OpenSSH's sshd (run on a pipe, as sshd -i)")
def test_identity_file_tokens_are_expanded_as_ssh_expands_them(tmp_path, monkeypatch):
    host_key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    path = config(tmp_path, """\
        Host gpu-a
          HostName 127.0.0.1
          Port 2201
          User admin
          HostKeyAlias alias-a
          IdentityFile {tmp}/keys/%d/%u-%i-%L-%l-%k-%p-%h-%n-%r-%%-${{GPUPROV_TEST_WORD}}
        """)
    env = {**os.environ, "GPUPROV_TEST_WORD": "word"}
    proxy = f"ProxyCommand={SSHD} -i -f /dev/null -o HostKey={host_key}"
    known = tmp_path / "known_hosts"   # the throwaway sshd's own key, under the config's HostKeyAlias
    known.write_text("alias-a " + " ".join(Path(f"{host_key}.pub").read_text().split()[:2]) + "\n")
    log = subprocess.run(["ssh", "-v", "-F", str(path), "-o", proxy, "-o", "BatchMode=yes",
                          "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}", "gpu-a", "true"],
                         capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60).stderr
    tried = [name for name in re.findall(r"identity file (\S+) type", log) if not name.endswith("-cert")]
    assert len(tried) == 1, log
    Path(tried[0]).parent.mkdir(parents=True)
    Path(tried[0]).write_text("a key\n")
    monkeypatch.setenv("GPUPROV_TEST_WORD", "word")
    inv = apply_ssh_config(inventory(tmp_path, "hosts: {gpu-a: {}}\n"), path)
    assert inv.hosts["gpu-a"].identity_file == tried[0]
    assert inv.hosts["gpu-a"].setting_sources["identity_file"] == f"{path}:6"


def test_the_first_identity_file_that_exists_is_taken_and_the_inventory_s_wins(tmp_path):
    (tmp_path / "second").write_text("a key\n")
    (tmp_path / "own").write_text("a key\n")
    path = config(tmp_path, """\
        Host gpu-*
          IdentityFile {tmp}/first
          IdentityFile {tmp}/second
        """)
    inv = apply_ssh_config(inventory(tmp_path, f"""\
        hosts:
          gpu-a: {{}}
          gpu-b: {{identity_file: {tmp_path}/own}}
        """), path)
    assert inv.hosts["gpu-a"].identity_file == f"{tmp_path}/second"
    assert inv.hosts["gpu-a"].setting_sources["identity_file"] == f"{path}:3"
    assert inv.hosts["gpu-b"].identity_file == f"{tmp_path}/own"
    assert inv.hosts["gpu-b"].setting_sources["identity_file"] == "host"


@needs_ssh
@pytest.mark.tool
def test_proxyjump_none_and_a_jump_host_outside_the_inventory(tmp_path):
    path = config(tmp_path, """\
        Host gpu-a
          ProxyJump none
        Host bastion
          HostName 203.0.113.5
          User jumper
          Port 2022
          ProxyJump none
        Host gpu-b
          ProxyJump bastion
        Host gpu-c
          ProxyJump other@bastion:2100
        Host *
          ProxyJump gpu-a
        """)
    inv = apply_ssh_config(inventory(tmp_path, "hosts: {gpu-a: {}, gpu-b: {}, gpu-c: {}, gpu-d: {}}\n"), path)
    assert [ssh_g(path, name)["proxyjump"] for name in ("gpu-a", "gpu-d")] == [None, "gpu-a"]
    assert inv.hosts["gpu-a"].jump is None and inv.hosts["gpu-d"].jump == "gpu-a"
    bastion = ssh_g(path, "bastion")
    assert inv.hosts["gpu-b"].jump == f"{bastion['user']}@{bastion['hostname']}:{bastion['port']}"
    other = ssh_g(path, "bastion", "-l", "other", "-p", "2100")
    assert inv.hosts["gpu-c"].jump == f"{other['user']}@{other['hostname']}:{other['port']}"
    jump = inv.jump_host(inv.hosts["gpu-b"])
    assert (jump.address, jump.port, jump.user) == ("203.0.113.5", 2022, "jumper")


@pytest.mark.parametrize(("text", "hosts", "message"), [
    ("Host *\n  User x\nMatch host gpu-a exec \"test -e /x\"\n  User y\n", "gpu-a: {}",
     "{path}:3: ssh_config: Match exec: gpuprov runs no command from the ssh_config"),
    ("Host gpu-a\n  ProxyJump one,two\n", "gpu-a: {}",
     "{path}:2: ssh_config: host gpu-a: ProxyJump 'one,two' has more than one hop, and gpuprov connects through one "
     "jump host"),
    ("Host gpu-a\n  ProxyCommand nc %h %p\n", "gpu-a: {}",
     "{path}:2: ssh_config: host gpu-a: ProxyCommand: gpuprov connects directly or through one jump host; write "
     "ProxyJump, or give the host a jump in the inventory"),
    ("Host gpu-a\n  Port 70000\n", "gpu-a: {}",
     "{path}:2: ssh_config: host gpu-a: Port: bad port '70000': give an integer from 1 to 65535"),
    ("Host gpu-a\n  IdentityFile /k/%C\n", "gpu-a: {}",
     "{path}:2: ssh_config: IdentityFile: the token %C is not one gpuprov expands in IdentityFile (%L, %d, %h, %i, "
     "%k, %l, %n, %p, %r, %u, %%)"),
    ("Host gpu-b\n  ProxyJump gpu-a\nHost gpu-a\n  ProxyJump root@10.0.0.1\n", "{gpu-a: {}, gpu-b: {}}",
     "{path}:4: ssh_config: jump chain gpu-b -> gpu-a -> root@10.0.0.1:22: gpuprov connects through one jump host, "
     "never skipping a hop"),
    ("Host *\n  ProxyJump gpu-a\n", "{gpu-a: {}, gpu-b: {}}",
     "{path}:2: ssh_config: jump loop gpu-a -> gpu-a: gpuprov connects through one jump host, never skipping a hop"),
    ("Host gpu-a\n  ProxyJump bastion\nHost bastion\n  IdentityFile {tmp}/k\n", "gpu-a: {}",
     "{path}:2: ssh_config: host gpu-a: the jump host 'bastion' logs in with {tmp}/k and gpu-a with no key file: "
     "gpuprov logs in to a jump host outside the inventory with its target's key"),
    ("Host gpu-a\n  ProxyJump 'bad user'@bastion\n", "gpu-a: {}",
     "{path}:2: ssh_config: host gpu-a: ProxyJump \"'bad user'@bastion\": bad user \"'bad user'\""),
    ("Host gpu-a\n  ProxyJump bastion\nHost bastion\n  HostName \"two words\"\n", "gpu-a: {}",
     "{path}:4: ssh_config: host bastion: HostName 'two words': not an IP address or a host name"),
])
def test_what_gpuprov_cannot_follow_as_ssh_would_is_refused_with_its_line(tmp_path, text, hosts, message):
    (tmp_path / "k").write_text("a key\n")
    path = config(tmp_path, text)
    inv = inventory(tmp_path, "hosts: " + hosts + "\n" if hosts.startswith("{") else f"hosts:\n  {hosts}\n")
    with pytest.raises(InputError) as raised:
        apply_ssh_config(inv, path)
    assert raised.value.message.startswith(message.format(path=path, tmp=tmp_path))
    assert raised.value.exit_code == 2


def test_no_file_is_no_config_unless_one_was_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    inv = inventory(tmp_path, "hosts: {gpu-a: {}}\n")
    assert apply_ssh_config(inv, tmp_path / ".ssh" / "config") is inv
    assert apply_ssh_config(inv, None) is inv
    with pytest.raises(InputError) as raised:
        apply_ssh_config(inv, tmp_path / "elsewhere")
    assert raised.value.message == "~/elsewhere: ssh_config: no such file"   # the home folder, as people write it


@pytest.mark.parametrize(("value", "expected"), [
    (None, "~/.ssh/config"), ("", None), (False, None), ("conf/ssh", "conf/ssh"),
])
def test_the_ssh_config_setting(value, expected):
    overrides = {} if value is None else {"gpuprov": {"ssh_config": value}}
    found = settings(Context(config=Config(overrides=overrides))).ssh_config
    assert found == (None if expected is None else Path(os.path.expanduser(expected)))


def test_a_bad_ssh_config_setting_is_bad_input():
    with pytest.raises(InputError) as raised:
        settings(Context(config=Config(overrides={"gpuprov": {"ssh_config": 3}})))
    assert "gpuprov.ssh_config: must be a path, or '' or false for none, not 3" in str(raised.value)


@needs_ssh
@pytest.mark.tool
def test_an_include_inside_a_host_block_is_read_as_ssh_reads_it(tmp_path):
    path = config(tmp_path, """\
        Host gpu-x
          Include {tmp}/inc/*.conf
          User after-include
        Match originalhost gpu-z,gpu-w
          Include {tmp}/inc/z.conf
        Host *
          Port 2999
        """)
    config(tmp_path, "Port 2300\nHost gpu-y\n  HostName 10.0.0.77\n", "inc/x.conf")
    config(tmp_path, "Host gpu-z gpu-v\n  HostName 10.0.0.78\nMatch all\n  User zed\n", "inc/z.conf")
    inv = apply_ssh_config(inventory(tmp_path, "hosts: {gpu-x: {}, gpu-y: {}, gpu-z: {}, gpu-v: {}, gpu-w: {}}\n"),
                           path)
    for name, host in inv.hosts.items():
        expected = ssh_g(path, name)
        assert {"hostname": host.address, "port": str(host.port), "user": host.user, "proxyjump": host.jump} \
            == {**expected, "user": expected["user"] if host.setting_sources.get("user") else "root"}, name
    assert inv.hosts["gpu-x"].setting_sources["port"] == f"{tmp_path}/inc/x.conf:1"
