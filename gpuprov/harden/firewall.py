"""The firewall: rules from the inventory, the nftables ruleset rendered from templates/nftables.conf.j2, and
whether a given source reaches a port under them (the lockout check asks that of the controller's address).

Inbound: default drop; established/related, loopback and the ICMP/ICMPv6 types networks need are accepted;
everything from the cluster networks; SSH from the `firewall.allow` entry for the SSH port (from anywhere when
there is none); the other `firewall.allow` entries; the service ports; the exporters `monitoring.deploy` runs
(node_exporter 9100, dcgm-exporter 9400) from monitoring_cidrs, where the host has them. Connections DNATed to
containers (ports published by Docker) pass the same allow list in a forward chain that runs before Docker's own
(priority filter - 1): the port compared is the one published on the host; connections from Docker's own bridges
(docker0 and the bridges of Docker's networks, by name from the facts) are left to Docker, and no other interface is
(an uplink bridge named `br-ex` meets the allow list). DHCPv6 replies to the host's link-local addresses are
accepted, as ufw and firewalld do by default. Only gpuprov's table, `inet gpuprov`, is replaced; Docker's tables and
any other are never flushed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

TABLE = "inet gpuprov"
RULESET = "/etc/gpuprov/firewall.nft"
LISTING = "/var/lib/gpuprov/firewall.listing"   # `nft list table` of the ruleset as gpuprov loaded it
UNIT = "gpuprov-firewall.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DOCKER_BRIDGE = "docker0"                       # Docker's default bridge, exempted even before Docker runs
INTERFACE = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # what a facts-supplied bridge name must be to reach the ruleset


@dataclass(frozen=True)
class Rule:
    """Accept `proto`/`port` (None: every protocol and port) from `sources` (None: from anywhere)."""

    comment: str
    proto: str | None
    port: int | None
    sources: tuple[Network, ...] | None

    def family(self, version: int) -> tuple[str, ...]:
        return tuple(str(n) for n in self.sources or () if n.version == version)

    def matches(self, address: str, proto: str, port: int) -> bool:
        if self.proto not in (None, proto) or self.port not in (None, port):
            return False
        ip = ipaddress.ip_address(address)
        return self.sources is None or any(ip in network for network in self.sources)


def networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs collapsed per family (nftables refuses overlapping intervals in one set)."""
    parsed = [ipaddress.ip_network(c) for c in cidrs]
    out: list[Network] = []
    for version in (4, 6):
        out += ipaddress.collapse_addresses(n for n in parsed if n.version == version)
    return tuple(out)


def _merged(entries: list[dict]) -> dict[tuple[int, str], tuple[Network, ...] | None]:
    """(port, proto) -> sources, each port once: sources merged, any entry without sources opens it to all."""
    merged: dict[tuple[int, str], list | None] = {}
    for entry in entries:
        key = (entry["port"], entry.get("proto") or "tcp")
        if key in merged and merged[key] is None:
            continue
        sources = entry.get("sources")
        merged[key] = None if sources is None else [*(merged.get(key) or []), *sources]
    return {key: None if sources is None else networks(sources) for key, sources in merged.items()}


def build_rules(variables: dict, ssh_ports: list[int]) -> list[Rule]:
    """The accept rules of a host, from its inventory variables and the ports its sshd listens on."""
    rules = []
    cluster = variables.get("cluster_cidrs") or []
    if cluster:
        rules.append(Rule("cluster", None, None, networks(cluster)))
    allow = _merged((variables.get("firewall") or {}).get("allow") or [])
    for port in ssh_ports:
        rules.append(Rule("ssh", "tcp", port, allow.pop((port, "tcp"), None)))
    for (port, proto), sources in allow.items():
        rules.append(Rule(f"allow {port}/{proto}", proto, port, sources))
    for service in variables.get("service_ports") or []:
        sources = service.get("sources")
        if isinstance(sources, str):
            sources = variables.get(f"{sources}_cidrs") or []
        rules.append(Rule(service["name"], service["proto"], service["port"],
                          None if sources is None else networks(sources)))
    monitoring = variables.get("monitoring_cidrs") or []
    taken = {(rule.port, rule.proto) for rule in rules}
    for name, port in exporter_ports(variables).items():
        if monitoring and (port, "tcp") not in taken:
            rules.append(Rule(name, "tcp", port, networks(monitoring)))
    return rules


def exporter_ports(variables: dict) -> dict[str, int]:
    """The ports `monitoring.deploy` makes the host's exporters listen on: open from monitoring_cidrs only."""
    from gpuprov.monitoring.policy import EXPORTER_PORTS, MonitoringPolicy

    policy = MonitoringPolicy(host="", address="", gpu_count=(variables.get("hardware") or {}).get("count") or 0,
                              dcgm_exporter=(variables.get("monitoring") or {}).get("dcgm_exporter", "auto"))
    return {name: port for name, port in EXPORTER_PORTS.items()
            if name != "dcgm-exporter" or policy.expects_dcgm_exporter}


def reaches(rules: list[Rule], address: str, proto: str, port: int) -> bool:
    """Whether a new connection from `address` to `port` is accepted on input."""
    return any(rule.matches(address, proto, port) for rule in rules)


def _lines(rule: Rule, port_match: str) -> list[str]:
    """nft rule bodies (without the verdict) for one rule: one per address family it names."""
    match = port_match.format(proto=rule.proto, port=rule.port) if rule.port is not None else ""
    if rule.sources is None:
        return [match.strip()]
    out = []
    for version, keyword in ((4, "ip"), (6, "ip6")):
        family = rule.family(version)
        if family:
            elements = family[0] if len(family) == 1 else "{ " + ", ".join(family) + " }"
            out.append(f"{keyword} saddr {elements} {match}".strip())
    return out


def bridge_set(bridges: Iterable[str]) -> str:
    """The nft interface-name set of Docker's bridges: docker0 and the named ones (exact names, never a wildcard)."""
    names = sorted({DOCKER_BRIDGE, *(name for name in bridges if INTERFACE.fullmatch(name))})
    return "{ " + ", ".join(f'"{name}"' for name in names) + " }"


def render(rules: list[Rule], bridges: Iterable[str] = ()) -> str:
    """The whole ruleset file (nftables syntax) for these rules; `bridges`: the host's Docker bridges (facts)."""
    from gpuprov.harden.templates import render_template

    inbound, published = [], []
    for rule in rules:
        comment = f'comment "{rule.comment}"'
        inbound += [f"{body} accept {comment}" for body in _lines(rule, "{proto} dport {port}")]
        published += [f"{body} return {comment}"
                      for body in _lines(rule, "meta l4proto {proto} ct original proto-dst {port}")]
    return render_template("nftables.conf.j2", table=TABLE, inbound=inbound, published=published,
                           bridges=bridge_set(bridges))


def unit_file() -> str:
    """The systemd unit that loads the ruleset at boot, before the network and Docker come up."""
    return ("# Managed by gpuprov (invoke harden): loads gpuprov's nftables table at boot. It replaces that table\n"
            "# only; Docker's tables and any other are left alone.\n"
            "[Unit]\nDescription=gpuprov firewall (nftables table inet gpuprov)\n"
            "Wants=network-pre.target\nBefore=network-pre.target docker.service\nAfter=nftables.service\n"
            "DefaultDependencies=no\nConflicts=shutdown.target\nBefore=shutdown.target\n\n"
            f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/usr/sbin/nft -f {RULESET}\n"
            f"ExecReload=/usr/sbin/nft -f {RULESET}\n\n[Install]\nWantedBy=multi-user.target\n")


DOCKER_TABLES = ("ip docker-bridges", "ip6 docker-bridges")   # Docker's own tables (its nftables firewall backend)
_DOCKER_JUMP = re.compile(r"\b(jump|goto) DOCKER|-[jg] DOCKER|\bbr-[0-9a-f]{12}\b")   # also: Docker's bridge names
_BASE = re.compile(r"type (\w+) hook (\w+)[^;]*;(?: policy (\w+);)?")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/@+ (),-]")    # a host's table and chain names, as they may reach a terminal


def _dockers(chain: str, rule: str, bridges: tuple[str, ...]) -> bool:
    """Whether a rule is one Docker adds: in its chains (DOCKER-USER holds the operator's own, so only a bare
    return there), a jump to its chains, or a match on one of its bridges (named by the facts, or br-ID[:12] as
    Docker names them, for when Docker does not answer)."""
    if chain == "DOCKER-USER":
        return re.fullmatch(r"(counter( packets \d+ bytes \d+)? )?return|-j RETURN", rule) is not None
    return (chain.startswith("DOCKER") or _DOCKER_JUMP.search(rule) is not None
            or any(f'"{name}"' in rule or f" {name} " in f" {rule} " for name in bridges))


def _nat(table: str) -> bool:
    return table.endswith(" nat")


def _describe(table: str, chains: dict[str, list]) -> str | None:
    """`TABLE: chain C (policy drop, N rules), ...` for the chains with something of their own, else None."""
    parts = []
    for name, (policy, rules) in chains.items():
        found = ([f"policy {policy}"] if policy else []) + ([f"{rules} rules"] if rules else [])
        if found:
            parts.append(_UNSAFE.sub("?", f"chain {name} ({', '.join(found)})"))
    if not parts:
        return None
    more = f" and {len(parts) - 4} more chains" if len(parts) > 4 else ""
    return f"{_UNSAFE.sub('?', table)}: " + ", ".join(parts[:4]) + more


def other_rulesets(listing: str, legacy: str, bridges: Iterable[str]) -> list[str]:
    """The rules that filter this host besides gpuprov's table and Docker's own: one line per table, from
    `nft -t list ruleset` and `iptables-legacy-save` (each line `ip|ip6 SAVE-LINE`). Chains that drop nothing
    (policy accept, no rules) are left out; so are Docker's FORWARD policy drop, every rule Docker adds, and NAT
    (nat tables and chains: they change where a packet goes, and it still meets gpuprov's chains after)."""
    names = (DOCKER_BRIDGE, *bridges)
    tables: dict[str, dict[str, list]] = {}

    def slot(table: str, chain: str) -> list:
        return tables.setdefault(table, {}).setdefault(chain, ["", 0])

    depth, table, chain = 0, "", ""
    for raw in listing.splitlines():
        line = raw.strip()
        if depth == 0 and line.startswith("table ") and line.endswith("{"):
            table, chain = "table " + line[6:-1].strip(), ""
        elif depth == 1:
            chain = line[6:-1].strip() if line.startswith("chain ") and line.endswith("{") else ""
        elif depth == 2 and chain and line and table[6:] not in (TABLE, *DOCKER_TABLES) and not _nat(table):
            base = _BASE.match(line)
            if base and base.group(1) != "filter":
                chain = ""                       # a nat or route chain
            elif base:
                docker_forward = base.group(2) == "forward" and chain == "FORWARD" and table.endswith(" filter")
                slot(table, chain)[0] = "" if base.group(3) in (None, "accept") or docker_forward else base.group(3)
            elif not line.startswith(("#", "}", "comment ")) and not _dockers(chain, line, names):
                slot(table, chain)[1] += 1
        depth += line.count("{") - line.count("}")
    for raw in legacy.splitlines():
        family, _, line = raw.partition(" ")
        if line.startswith("*"):
            table = f"{family}tables-legacy {line[1:].strip()}"
        elif _nat(table):
            continue
        elif line.startswith(":") and len(line.split()) >= 2:
            chain, policy = line[1:].split()[:2]
            foreign = policy not in ("ACCEPT", "-") and not (chain == "FORWARD" and table.endswith(" filter"))
            slot(table, chain)[0] = policy.lower() if foreign else ""
        elif line.startswith("-A ") and len(line.split()) >= 2:
            chain = line.split()[1]
            if not _dockers(chain, " ".join(line.split()[2:]), names):
                slot(table, chain)[1] += 1
    return [text for name, chains in tables.items() if (text := _describe(name, chains))]
