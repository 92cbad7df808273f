"""The harden facts script run for real on this machine (read-only), parsed; the address gpuprov connects from is
read from the nearest ancestor that has SSH_CONNECTION (sudo clears the environment)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuprov.facts.providers import NoAnswer
from gpuprov.harden.facts import (
    facts_script,
    parse_controller,
    parse_docker_bridges,
    parse_facts,
    parse_firewall_units,
    parse_sshd,
)


def run_script(user: str, *files: str, env_outer: dict | None = None) -> dict:
    """The script under a parent shell that has `env_outer`, itself started without SSH_CONNECTION."""
    inner = "env -u SSH_CONNECTION sh -s"
    proc = subprocess.run(["sh", "-c", inner], input=facts_script(user, files), capture_output=True, text=True,
                          timeout=120, env={"PATH": os.environ["PATH"], **(env_outer or {})})
    assert proc.returncode == 0, proc.stderr
    return parse_facts(proc.stdout)


def os_release_id() -> str:
    for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
        if line.startswith("ID="):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no ID= in /etc/os-release")


@pytest.mark.root
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


def test_docker_bridges_and_other_firewalls_as_the_tools_print_them():
    inspect = ("f475990ba860fa7727959011bcb9a40bf0207618b739aa70b5007881fd753400 docker0\n"
               "1234797dcb8d1c3ef21771b4244ee0184145c2420583a85801d8eaf722c13c6f <no value>\n"
               "ab34797dcb8d1c3ef21771b4244ee0184145c2420583a85801d8eaf722c13c6f gpu-net\n"
               "cd34797dcb8d1c3ef21771b4244ee0184145c2420583a85801d8eaf722c13c6f bad;name\n"
               "not-an-id docker1\n")
    assert parse_docker_bridges(inspect, 0) == ["br-1234797dcb8d", "docker0", "gpu-net"]
    assert parse_docker_bridges("", 0) == []
    assert parse_docker_bridges("", 127) is None      # no Docker
    with pytest.raises(NoAnswer, match="did not answer"):    # Docker did not answer: unknown, with a notice
        parse_docker_bridges("", 1)
    units = ("firewalld.service enabled inactive\nnftables.service disabled active\nufw enabled\nufw active\n")
    assert parse_firewall_units(units) == {"firewalld.service": "enabled", "ufw": "enabled, active"}
    assert parse_firewall_units("nftables.service enabled active\nfirewalld.service absent inactive\n") == {
        "nftables.service": "enabled"}


def bridge_interfaces() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


@pytest.mark.root
@pytest.mark.tool
@pytest.mark.docker
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("docker") is None or shutil.which("ip") is None,
                    reason="the facts script runs as root; needs docker and ip")
def test_docker_bridges_of_this_machine():
    """Judged by Docker's own count of its bridge networks and the kernel's bridge interfaces."""
    listed = subprocess.run(["docker", "network", "ls", "-q", "--filter", "driver=bridge"], capture_output=True,
                            text=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip("Docker does not answer here")
    bridges = run_script("root")["docker_bridges"]
    assert len(bridges) == len(listed.stdout.split())
    if "docker0" in bridge_interfaces():     # this machine is the Docker host: its bridges are interfaces here
        assert set(bridges) <= bridge_interfaces()


# Docker's own rules for its default network (and a user network's), as Docker writes them with iptables (nf_tables
# backend); Docker does not answer the facts script, so the user network's bridge is known by Docker's naming only
DOCKER_RULES = """
iptables -t nat -N DOCKER
iptables -t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
iptables -t nat -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
iptables -t nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
iptables -t nat -A POSTROUTING -s 172.17.0.2/32 -d 172.17.0.2/32 -p tcp -m tcp --dport 80 -j MASQUERADE
iptables -t nat -A DOCKER -i docker0 -j RETURN
iptables -t nat -A DOCKER ! -i docker0 -p tcp --dport 8081 -j DNAT --to-destination 172.17.0.2:80
iptables -N DOCKER && iptables -N DOCKER-ISOLATION-STAGE-1 && iptables -N DOCKER-ISOLATION-STAGE-2
iptables -N DOCKER-USER
iptables -P FORWARD DROP
iptables -A FORWARD -j DOCKER-USER
iptables -A FORWARD -j DOCKER-ISOLATION-STAGE-1
iptables -A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
iptables -A FORWARD -o docker0 -j DOCKER
iptables -A FORWARD -i docker0 ! -o docker0 -j ACCEPT
iptables -A FORWARD -i docker0 -o docker0 -j ACCEPT
iptables -A FORWARD -o br-0123456789ab -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
iptables -A FORWARD -i br-0123456789ab ! -o br-0123456789ab -j ACCEPT
iptables -A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp --dport 80 -j ACCEPT
iptables -A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
iptables -A DOCKER-ISOLATION-STAGE-1 -j RETURN
iptables -A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
iptables -A DOCKER-ISOLATION-STAGE-2 -j RETURN
iptables -A DOCKER-USER -j RETURN
"""
# Debian's /etc/nftables.conf as shipped: chains that accept everything filter nothing
DEBIAN_DEFAULT = ("table inet filter {\n chain input {\n  type filter hook input priority filter;\n }\n"
                  " chain forward {\n  type filter hook forward priority filter;\n }\n"
                  " chain output {\n  type filter hook output priority filter;\n }\n}\n")


@pytest.mark.root
@pytest.mark.tool
@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("nft", "iptables", "iptables-legacy")),
                    reason="needs root, nft, iptables and iptables-legacy")
@pytest.mark.parametrize(("extra", "expected"), [
    ("", []),
    ("nft add table ip redirect && nft 'add chain ip redirect pre { type nat hook prerouting priority dstnat; }' "
     "&& nft add rule ip redirect pre tcp dport 80 redirect to :8080", []),     # NAT filters nothing
    ("iptables -A INPUT -p tcp --dport 3306 -j DROP && iptables -A DOCKER-USER -s 10.0.0.0/8 -j DROP",
     ["table ip filter: chain DOCKER-USER (1 rules), chain INPUT (1 rules)"]),
    ("nft add table inet f2b-table && nft 'add chain inet f2b-table input { type filter hook input priority -1; }' "
     "&& nft add rule inet f2b-table input tcp dport 22 ip saddr 203.0.113.9 drop",
     ["table inet f2b-table: chain input (1 rules)"]),
    ("nft add table ip6 strict && nft 'add chain ip6 strict in { type filter hook input priority 0; policy drop; }'",
     ["table ip6 strict: chain in (policy drop)"]),
    ("iptables-legacy -P INPUT DROP && iptables-legacy -A INPUT -p tcp --dport 22 -j ACCEPT",
     ["iptables-legacy filter: chain INPUT (policy drop, 1 rules)"]),
])
def test_the_rulesets_besides_gpuprovs_and_dockers(tmp_path, extra, expected):
    """Loaded for real in a scratch network namespace, seen by the facts script: gpuprov's table, Docker's rules and
    Debian's inert default table are not another ruleset; anything else that filters is, table by table."""
    from gpuprov.harden.firewall import build_rules, render

    (tmp_path / "gpuprov.nft").write_text(render(build_rules({}, [22])))
    (tmp_path / "debian.nft").write_text(DEBIAN_DEFAULT)
    (tmp_path / "facts.sh").write_text(facts_script("root", ()))
    setup = "\n".join(["set -e", f"nft -f {tmp_path / 'debian.nft'}", f"nft -f {tmp_path / 'gpuprov.nft'}",
                       DOCKER_RULES, extra, "set +e", f"sh {tmp_path / 'facts.sh'}"])
    proc = subprocess.run(["unshare", "-n", "sh", "-c", setup], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("no permission to create a network namespace here")
    assert proc.returncode == 0, proc.stderr
    facts = parse_facts(proc.stdout)
    assert facts["complete"] and facts["docker_bridges"] is None
    assert facts["other_rulesets"] == expected


def test_a_hostile_hosts_names_reach_the_report_as_plain_text():
    from gpuprov.harden.firewall import other_rulesets

    listing = ('table netdev edge {\n\tchain ingress {\n\t\ttype filter hook ingress device "eth0" priority filter; '
               'policy accept;\n\t\tip saddr 203.0.113.0/24 drop\n\t}\n}\n')
    legacy = "ip *filter\nip :INPUT \x1b[2J ACCEPT\nip -A \x1b]0;owned\x07 -j DROP\nip COMMIT\n"
    found = other_rulesets(listing, legacy, ())
    assert found == ["table netdev edge: chain ingress (1 rules)", "iptables-legacy filter: chain INPUT (policy ??2j), "
                     "chain ??0?owned? (1 rules)"]
    assert all(ch.isprintable() for line in found for ch in line)
