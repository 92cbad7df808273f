"""The firewall ruleset: every rendered ruleset judged by `nft -c`; which sources reach which ports, written out by
hand; the change planned only when the file, the live table or the boot unit differ."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from judges import needs_nft, nft_check

from gpuprov.harden import nft
from gpuprov.harden.firewall import LISTING, RULESET, UNIT, UNIT_FILE, build_rules, reaches, render, unit_file
from gpuprov.harden.lockout import firewall_refusals
from gpuprov.harden.policy import build_policy

FLEET = {
    "firewall": {"allow": [{"port": 22, "proto": "tcp", "sources": ["198.51.100.0/24", "2001:db8:1::/48"]},
                           {"port": 8080, "proto": "tcp", "sources": ["10.0.0.0/8"]},
                           {"port": 8080, "proto": "tcp", "sources": ["10.2.0.0/16", "192.168.7.0/24"]},
                           {"port": 5353, "proto": "udp", "sources": ["10.9.0.0/16"]}]},
    "cluster_cidrs": ["10.1.0.0/16", "fd00:1::/64"],
    "monitoring_cidrs": ["10.20.0.0/24"],
    "service_ports": [{"name": "triton-http", "port": 8000, "proto": "tcp", "sources": None},
                      {"name": "node-exporter", "port": 9100, "proto": "tcp", "sources": "monitoring"},
                      {"name": "dcgm-exporter", "port": 9400, "proto": "tcp", "sources": "monitoring"}],
}


@pytest.mark.tool
@needs_nft
@pytest.mark.parametrize("variables", [{}, FLEET, {"firewall": {"allow": [{"port": 2222, "proto": "tcp",
                                                                            "sources": ["0.0.0.0/0"]}]}}])
def test_nft_accepts_the_rendered_ruleset(tmp_path, variables):
    result = nft_check(render(build_rules(variables, [22, 2222])), tmp_path)
    assert result.returncode == 0, result.stderr


cidrs = st.one_of(st.ip_addresses(v=4).map(lambda a: f"{a}/{24}"), st.ip_addresses(v=6).map(lambda a: f"{a}/64"))
entries = st.fixed_dictionaries({"port": st.integers(1, 65535), "proto": st.sampled_from(["tcp", "udp"]),
                                 "sources": st.lists(cidrs, min_size=1, max_size=5)})


@pytest.mark.tool
@needs_nft
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(allow=st.lists(entries, max_size=6), cluster=st.lists(cidrs, max_size=4))
def test_nft_accepts_any_inventory(tmp_path, allow, cluster):
    variables = {"firewall": {"allow": [{**e, "sources": [str(ipaddress.ip_network(s, strict=False))
                                                          for s in e["sources"]]} for e in allow]},
                 "cluster_cidrs": [str(ipaddress.ip_network(c, strict=False)) for c in cluster]}
    result = nft_check(render(build_rules(variables, [22])), tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("address", "proto", "port", "accepted"), [
    ("198.51.100.7", "tcp", 22, True),           # the SSH entry's sources
    ("2001:db8:1::5", "tcp", 22, True),
    ("203.0.113.9", "tcp", 22, False),           # anywhere else
    ("10.1.44.3", "tcp", 22, True),              # cluster: every port
    ("10.1.44.3", "udp", 29500, True),
    ("fd00:1::9", "tcp", 12345, True),
    ("10.3.0.1", "tcp", 8080, True),             # both 8080 entries merged
    ("192.168.7.9", "tcp", 8080, True),
    ("192.168.8.9", "tcp", 8080, False),
    ("10.3.0.1", "udp", 8080, False),            # tcp only
    ("10.9.1.1", "udp", 5353, True),
    ("203.0.113.9", "tcp", 8000, True),          # a service open to anywhere
    ("10.20.0.5", "tcp", 9100, True),            # exporters: monitoring only
    ("10.21.0.5", "tcp", 9400, False),
    ("10.20.0.5", "tcp", 9999, False),
])
def test_who_reaches_what(address, proto, port, accepted):
    assert reaches(build_rules(FLEET, [22]), address, proto, port) is accepted


def test_ssh_is_open_to_anywhere_when_the_inventory_names_no_sources():
    rules = build_rules({"firewall": {"allow": [{"port": 443, "proto": "tcp", "sources": ["10.0.0.0/8"]}]}}, [22])
    assert reaches(rules, "203.0.113.9", "tcp", 22) and not reaches(rules, "203.0.113.9", "tcp", 443)


def test_the_ruleset_replaces_only_its_own_table_and_guards_published_ports():
    text = render(build_rules(FLEET, [22]))
    statements = [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in statements if line.startswith("flush")]
    tables = {line.split("{")[0].strip() for line in text.splitlines() if line.startswith(("table", "delete"))}
    assert tables == {"table inet gpuprov", "delete table inet gpuprov"}
    assert "hook input priority filter; policy drop;" in text
    assert "hook forward priority filter - 1; policy accept;" in text
    assert "ct state new ct status dnat jump published" in text
    assert "meta l4proto tcp ct original proto-dst 9100 return" in text


def facts_in_state(ruleset: str, listing: str = "table inet gpuprov {\n}") -> dict:
    return {"systemd": True, "nft": True, "nft_table": listing, "units": {UNIT: "enabled"},
            "files": {RULESET: ruleset, LISTING: listing + "\n", UNIT_FILE: unit_file()}}


def test_no_change_when_file_live_table_and_boot_unit_are_in_state():
    ruleset = render(build_rules(FLEET, [22]))
    assert nft.change(facts_in_state(ruleset), ruleset, "load") is None


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda f: f["files"].update({RULESET: "# edited\n"}), "differs from the inventory"),
    (lambda f: f.update(nft_table="table inet gpuprov {\n\tchain x {\n\t}\n}"), "the loaded table differs"),
    (lambda f: f.update(nft_table=None), "no gpuprov table loaded"),
    (lambda f: f["units"].update({UNIT: "disabled"}), "is not installed and enabled"),
])
def test_a_change_when_anything_drifted(edit, reason):
    ruleset = render(build_rules(FLEET, [22]))
    facts = facts_in_state(ruleset)
    edit(facts)
    change = nft.change(facts, ruleset, "load")
    assert change is not None and reason in change.summary
    assert any(command.startswith("if ! out=$(nft -c -f") for command in change.commands)


@pytest.mark.parametrize(("controller", "refused"), [
    ({"address": "198.51.100.20", "port": 22}, False),
    ({"address": "10.1.0.9", "port": 22}, False),        # from the cluster network
    ({"address": "172.17.0.1", "port": 22}, True),
    ({"address": "198.51.100.20", "port": 2222}, True),  # sshd on another port: no entry allows it from there
    (None, True),
])
def test_lockout_when_the_controller_is_outside_the_ssh_sources(controller, refused):
    variables = {**FLEET, "firewall": {"allow": [*FLEET["firewall"]["allow"],
                                                 {"port": 2222, "proto": "tcp", "sources": ["10.0.0.0/8"]}]}}
    policy = build_policy(variables, {"sshd": {"port": ["22", "2222"]}, "controller": controller})
    assert bool(firewall_refusals(policy, {"controller": controller})) is refused


@pytest.mark.root
@pytest.mark.tool
@needs_nft
def test_the_listing_of_a_loaded_ruleset_is_stable(tmp_path):
    """What makes the live comparison sound: loading the file again lists the same text (a scratch netns)."""
    path = tmp_path / "ruleset.nft"
    path.write_text(render(build_rules(FLEET, [22])))
    script = f"nft -f {path} && nft list table inet gpuprov && echo @@ && nft -f {path} && nft list table inet gpuprov"
    proc = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("no permission to create a network namespace here")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split("@@\n")
    assert first == second and "policy drop" in first


def test_the_exporters_monitoring_deploys_are_open_to_the_monitoring_network_only():
    variables = {"monitoring_cidrs": ["10.20.0.0/24"], "hardware": {"gpu": "H100-SXM", "count": 8}}
    rules = build_rules(variables, [22])
    # node_exporter 9100 and dcgm-exporter 9400 (the ports monitoring.deploy makes them listen on)
    assert reaches(rules, "10.20.0.9", "tcp", 9100) and reaches(rules, "10.20.0.9", "tcp", 9400)
    assert not reaches(rules, "10.30.0.9", "tcp", 9100) and not reaches(rules, "10.30.0.9", "tcp", 9400)
    # no dcgm-exporter on the host: 9400 stays closed
    none = build_rules({**variables, "monitoring": {"dcgm_exporter": "none"}}, [22])
    assert reaches(none, "10.20.0.9", "tcp", 9100) and not reaches(none, "10.20.0.9", "tcp", 9400)
    # a host without GPUs in the inventory (dcgm_exporter auto) runs no dcgm-exporter either
    cpu = build_rules({"monitoring_cidrs": ["10.20.0.0/24"]}, [22])
    assert reaches(cpu, "10.20.0.9", "tcp", 9100) and not reaches(cpu, "10.20.0.9", "tcp", 9400)
    # no monitoring network: nothing opened
    assert not reaches(build_rules({}, [22]), "10.20.0.9", "tcp", 9100)
    # an explicit, narrower allow entry for the port wins
    narrow = build_rules({**variables, "firewall": {"allow": [{"port": 9400, "proto": "tcp",
                                                               "sources": ["10.20.0.10/32"]}]}}, [22])
    assert reaches(narrow, "10.20.0.10", "tcp", 9400) and not reaches(narrow, "10.20.0.9", "tcp", 9400)


@pytest.mark.root
@pytest.mark.tool
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nft") is None,
                    reason="needs root, unshare and nft")
def test_the_ruleset_needs_no_etc_protocols(tmp_path):
    """A minimal server may lack /etc/protocols (netbase): nft must not need it to read the ruleset (a lab host
    without netbase once refused `meta l4proto ipv6-icmp`: "Could not resolve protocol name")."""
    path = tmp_path / "firewall.nft"
    path.write_text(render(build_rules({"cluster_cidrs": ["10.1.0.0/16"], "monitoring_cidrs": ["10.20.0.0/24"]},
                                       [22])))
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind /dev/null /etc/protocols && nft -c -f {path}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# A scratch network namespace is the host (the ruleset loaded there); each peer is a process in a namespace of its
# own, wired to it by a veth pair. The kernel decides what passes: no rule text is compared.
NETNS = r"""
set -e
ip link set lo up
netns() {
  unshare -n sleep 60 >/dev/null 2>&1 &
  while [ "$(readlink /proc/$!/ns/net)" = "$(readlink /proc/self/ns/net)" ]; do sleep 0.05; done
  echo $!
}
"""


def in_netns(tmp_path, ruleset: str, script: str) -> str:
    """`script` as root in a scratch network namespace where `$1` is the ruleset file, loaded by the script."""
    path = tmp_path / "firewall.nft"
    path.write_text(ruleset)
    proc = subprocess.run(["unshare", "-n", "-m", "sh", "-c", NETNS + script, "netns", str(path)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("no permission to create network namespaces here")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


needs_netns = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
                                 reason="needs root, nft and ip (iproute2)")

# The host: an uplink bridge br-ex (192.0.2.1, the outside world behind it), Docker's docker0 with a container
# publishing 8081 -> 80 (Docker's DNAT, written as Docker writes it in effect), and a Docker user network
# br-0123456789ab with a container of its own that reaches the published port through the host's address.
PUBLISHED = r"""
echo 1 > /proc/sys/net/ipv4/ip_forward
bridge() { ip link add "$1" type bridge && ip addr add "$2" dev "$1" && ip link set "$1" up; }
attach() {
  ip link add "v$2" type veth peer name eth0 netns "$2" && ip link set "v$2" master "$1" up
  nsenter -t "$2" -n sh -c "ip link set lo up && ip link set eth0 up && ip addr add $3 dev eth0 && \
    ip route add default via $4"
}
OUTSIDE=$(netns); WEB=$(netns); NEIGHBOUR=$(netns)
bridge br-ex 192.0.2.1/24; bridge docker0 172.17.0.1/16; bridge br-0123456789ab 172.18.0.1/16
attach br-ex $OUTSIDE 192.0.2.2/24 192.0.2.1
attach docker0 $WEB 172.17.0.2/16 172.17.0.1
attach br-0123456789ab $NEIGHBOUR 172.18.0.3/16 172.18.0.1
nat="${1%/*}/nat.nft"
printf 'table ip docker-nat {\n chain prerouting {\n  type nat hook prerouting priority dstnat;\n' > "$nat"
printf '  tcp dport 8081 dnat to 172.17.0.2:80\n }\n}\n' >> "$nat"
nft -f "$nat"
nft -f "$1"
ready="${1%/*}/ready"
timeout 30 nsenter -t $WEB -n python3 -c '
import socket, sys
s = socket.create_server(("0.0.0.0", 80)); s.settimeout(20); open(sys.argv[1], "w").write("ready")
while True:
    s.accept()[0].close()' "$ready" >/dev/null 2>&1 &
web=$!
for _ in $(seq 100); do [ -s "$ready" ] && break; sleep 0.1; done
for peer in outside:$OUTSIDE docker:$NEIGHBOUR; do
  nsenter -t "${peer#*:}" -n python3 -c '
import socket, sys
try:
    socket.create_connection(("192.0.2.1", 8081), timeout=2).close()
    print(sys.argv[1], "open")
except OSError:
    print(sys.argv[1], "closed")' "${peer%%:*}"
done
kill $web $OUTSIDE $WEB $NEIGHBOUR
"""


@pytest.mark.root
@pytest.mark.tool
@needs_netns
@pytest.mark.parametrize(("allow", "expected"), [
    ([], {"outside": "closed", "docker": "open"}),
    ([{"port": 8081, "proto": "tcp", "sources": ["192.0.2.0/24"]}], {"outside": "open", "docker": "open"}),
])
def test_only_dockers_own_bridges_skip_the_published_port_filter(tmp_path, allow, expected):
    """An uplink bridge named br-ex is not Docker's: a port Docker publishes is open through it only as the allow
    list says, while the containers of Docker's networks (named by the facts) still reach it."""
    ruleset = render(build_rules({"firewall": {"allow": allow}}, [22]), ["br-0123456789ab"])
    out = in_netns(tmp_path, ruleset, PUBLISHED)
    assert dict(line.split() for line in out.splitlines()) == expected


# The host (fe80::1, 2001:db8::1) and a DHCPv6 server on its link (fe80::2, 2001:db8::2) sending to UDP 546.
DHCPV6 = r"""
SERVER=$(netns)
ip link add vs type veth peer name eth0 netns $SERVER
ip link set vs up && ip addr add fe80::1/64 dev vs nodad && ip addr add 2001:db8::1/64 dev vs nodad
nsenter -t $SERVER -n sh -c "ip link set lo up && ip link set eth0 up && ip addr add fe80::2/64 dev eth0 nodad && \
  ip addr add 2001:db8::2/64 dev eth0 nodad"
nft -f "$1"
ready="${1%/*}/ready"
timeout 20 python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(("::", 546)); s.settimeout(3)
open(sys.argv[1], "w").write("ready")
try:
    while True:
        print(s.recvfrom(100)[0].decode(), flush=True)
except TimeoutError:
    pass' "$ready" &
for _ in $(seq 100); do [ -s "$ready" ] && break; sleep 0.1; done
nsenter -t $SERVER -n python3 -c '
import socket
eth0 = socket.if_nametoindex("eth0")
for name, source, to in (("link-local", ("fe80::2", 547, 0, eth0), ("fe80::1", 546, 0, eth0)),
                         ("not-from-547", ("fe80::2", 5470, 0, eth0), ("fe80::1", 546, 0, eth0)),
                         ("global", ("2001:db8::2", 547), ("2001:db8::1", 546))):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(source); s.sendto(name.encode(), to); s.close()'
wait
kill $SERVER
"""


@pytest.mark.root
@pytest.mark.tool
@needs_netns
def test_dhcpv6_replies_reach_the_client_from_the_link_only(tmp_path):
    """A DHCPv6 server answers from its link-local address, port 547, to the client's link-local address, port 546:
    accepted; the same port from another source port or to a global address is not."""
    out = in_netns(tmp_path, render(build_rules({}, [22])), DHCPV6)
    assert out.split() == ["link-local"]
