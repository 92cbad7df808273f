"""The hardening variables `invoke harden` reads, declared once (gpuprov.inventory.variables) and checked at load;
a service open to a network the host has none of is checked on each host's merged variables
(gpuprov.inventory.hardening.check_references).

    cluster_cidrs: ["10.1.0.0/16"]            # every port open between cluster hosts (NCCL, torchrun)
    monitoring_cidrs: ["10.20.0.0/24"]        # where Prometheus scrapes from
    service_ports:                            # a group's service ports
      - {name: triton-http, port: 8000}                          # from anywhere
      - {name: node-exporter, port: 9100, sources: monitoring}   # from monitoring_cidrs
      - {name: triton-grpc, port: 8001, proto: tcp, sources: ["10.0.0.0/8"]}
    firewall: {allow: [{port: 22, proto: tcp, sources: ["10.0.0.0/8"]}]}
    ssh_hardening: {permit_root_login: prohibit-password, allow_users: [gpuadmin], max_auth_tries: 3, ...}
"""

from __future__ import annotations

import re

from gpuprov.inventory.variables import Spec, declare

NETWORK_NAMES = ("monitoring", "cluster")
PROTOCOLS = ("tcp", "udp")
ROOT_LOGIN = ("prohibit-password", "no")
SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
# sshd_config(5) AllowUsers patterns: USER or USER@HOST, with * and ? wildcards; AllowGroups: group names
USER_PATTERN = re.compile(r"[A-Za-z0-9_*?][A-Za-z0-9_.*?-]{0,31}(@[A-Za-z0-9_.:/*?-]{1,253})?")
GROUP_PATTERN = re.compile(r"[A-Za-z0-9_*?][A-Za-z0-9_.*?-]{0,31}")
ALGORITHM = re.compile(r"[a-z0-9][a-z0-9@._+-]{0,79}")
ALGORITHM_KEYS = ("kex_algorithms", "ciphers", "macs", "host_key_algorithms")
_PROTO = "bad proto {value}: give tcp or udp"
_NAMES = "letters, digits, '_', '.', '-' and the wildcards * and ?"


def _rule_specs(name: str, what: str) -> tuple[Spec, ...]:
    """A port rule's port and protocol (tcp unless given)."""
    return (Spec(f"{name}.port", "port", f"the {what}'s port", required=True),
            Spec(f"{name}.proto", "choice", "tcp or udp", choices=PROTOCOLS, default="tcp", message=_PROTO))


VARIABLES = declare(
    "harden",
    Spec("cluster_cidrs", "cidrs", "the cluster's networks: every port is open between them (NCCL, torchrun)"),
    Spec("monitoring_cidrs", "cidrs", "where Prometheus scrapes from"),
    Spec("service_ports", "list", "a group's service ports and who may reach them",
         message="service_ports must be a list of {{name, port, proto, sources}}, not {type}"),
    Spec("service_ports.*", "mapping", "one service port", label="service port"),
    Spec("service_ports.*.name", "pattern", "the service's name", required=True, pattern=SERVICE_NAME,
         message="bad service name {value}: letters, digits, '_', '.' and '-', up to 32"),
    *_rule_specs("service_ports.*", "service"),
    Spec("service_ports.*.sources", "service_sources", "CIDRs, or monitoring or cluster (that variable's "
         "networks); open to anywhere when missing", choices=NETWORK_NAMES, default=None),
    Spec("firewall", "mapping", "the firewall's extra rules"),
    Spec("firewall.allow", "list", "ports open to some networks", required=True,
         message="allow must be a list of rules ({{port, proto, sources}}), not {type}"),
    Spec("firewall.allow.*", "mapping", "one rule", label="firewall rule"),
    *_rule_specs("firewall.allow.*", "rule"),
    Spec("firewall.allow.*.sources", "cidrs", "the networks the port is open to", required=True),
    Spec("ssh_hardening", "mapping", "sshd settings over the dev-sec ssh-hardening baseline"),
    Spec("ssh_hardening.permit_root_login", "choice", "PermitRootLogin", choices=ROOT_LOGIN,
         message="bad permit_root_login {value}: give prohibit-password or no (root with a password is never "
                 "allowed)"),
    Spec("ssh_hardening.allow_users", "names", "AllowUsers patterns", pattern=USER_PATTERN, label="user",
         message="bad user name {value}: " + _NAMES + " (USER@HOST allowed)"),
    Spec("ssh_hardening.allow_groups", "names", "AllowGroups patterns", pattern=GROUP_PATTERN, label="group",
         message="bad group name {value}: " + _NAMES),
    Spec("ssh_hardening.x11_forwarding", "bool", "X11Forwarding"),
    Spec("ssh_hardening.agent_forwarding", "bool", "AllowAgentForwarding"),
    Spec("ssh_hardening.max_auth_tries", "integer", "MaxAuthTries", low=1, high=10),
    Spec("ssh_hardening.login_grace_time", "integer", "LoginGraceTime, in seconds", low=1, high=600),
    Spec("ssh_hardening.client_alive_interval", "integer", "ClientAliveInterval, in seconds", low=1, high=3600),
    Spec("ssh_hardening.client_alive_count_max", "integer", "ClientAliveCountMax", low=1, high=10),
    *(Spec(f"ssh_hardening.{key}", "names", f"{key}, as `ssh -Q` names them; the first the host supports",
           pattern=ALGORITHM, label="algorithm",
           message="bad algorithm name {value}: as `ssh -Q` prints them (like curve25519-sha256)")
      for key in ALGORITHM_KEYS),
)
