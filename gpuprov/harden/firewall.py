"""The firewall: rules from the inventory, the nftables ruleset rendered from templates/nftables.conf.j2, and
whether a given source reaches a port under them (the lockout check asks that of the controller's address).

Inbound: default drop; established/related, loopback and the ICMP/ICMPv6 types networks need are accepted;
everything from the cluster networks; SSH from the `firewall.allow` entry for the SSH port (from anywhere when
there is none); the other `firewall.allow` entries; the service ports; the exporters `monitoring.deploy` runs
(node_exporter 9100, dcgm-exporter 9400) from monitoring_cidrs, where the host has them. Connections DNATed to
containers (ports published by Docker) pass the same allow list in a forward chain that runs before Docker's own
(priority filter - 1): the port compared is the one published on the host. Only gpuprov's table, `inet gpuprov`, is
replaced; Docker's tables and any other are never flushed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

TABLE = "inet gpuprov"
RULESET = "/etc/gpuprov/firewall.nft"
LISTING = "/var/lib/gpuprov/firewall.listing"   # `nft list table` of the ruleset as gpuprov loaded it
UNIT = "gpuprov-firewall.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


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


def render(rules: list[Rule]) -> str:
    """The whole ruleset file (nftables syntax) for these rules."""
    from gpuprov.harden.templates import render_template

    inbound, published = [], []
    for rule in rules:
        comment = f'comment "{rule.comment}"'
        inbound += [f"{body} accept {comment}" for body in _lines(rule, "{proto} dport {port}")]
        published += [f"{body} return {comment}"
                      for body in _lines(rule, "meta l4proto {proto} ct original proto-dst {port}")]
    return render_template("nftables.conf.j2", table=TABLE, inbound=inbound, published=published)


def unit_file() -> str:
    """The systemd unit that loads the ruleset at boot, before the network and Docker come up."""
    return ("# Managed by gpuprov (invoke harden): loads gpuprov's nftables table at boot. It replaces that table\n"
            "# only; Docker's tables and any other are left alone.\n"
            "[Unit]\nDescription=gpuprov firewall (nftables table inet gpuprov)\n"
            "Wants=network-pre.target\nBefore=network-pre.target docker.service\nAfter=nftables.service\n"
            "DefaultDependencies=no\nConflicts=shutdown.target\nBefore=shutdown.target\n\n"
            f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/usr/sbin/nft -f {RULESET}\n"
            f"ExecReload=/usr/sbin/nft -f {RULESET}\n\n[Install]\nWantedBy=multi-user.target\n")
