"""The hardening variables `invoke harden` reads: cluster and monitoring networks, per-group service ports and the
sshd policy. Checked where they are written, like the other validated variables (`schema.VariableSchema` mixes
this in); `check_references` checks, on each host's merged variables, a service that names a network the host
does not have.

    cluster_cidrs: ["10.1.0.0/16"]            # every port open between cluster hosts (NCCL, torchrun)
    monitoring_cidrs: ["10.20.0.0/24"]        # where Prometheus scrapes from
    service_ports:                            # a group's service ports
      - {name: triton-http, port: 8000}                          # from anywhere
      - {name: node-exporter, port: 9100, sources: monitoring}   # from monitoring_cidrs
      - {name: triton-grpc, port: 8001, proto: tcp, sources: ["10.0.0.0/8"]}
    ssh_hardening: {permit_root_login: prohibit-password, allow_users: [gpuadmin], max_auth_tries: 3, ...}
"""

from __future__ import annotations

import re
from typing import Any

from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.levels import INVALID
from gpuprov.inventory.located import Located
from gpuprov.inventory.settings import port_number

NETWORK_NAMES = ("monitoring", "cluster")
ROOT_LOGIN = ("prohibit-password", "no")
SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
# sshd_config(5) AllowUsers patterns: USER or USER@HOST, with * and ? wildcards; AllowGroups: group names
USER_PATTERN = re.compile(r"[A-Za-z0-9_*?][A-Za-z0-9_.*?-]{0,31}(@[A-Za-z0-9_.:/*?-]{1,253})?")
GROUP_PATTERN = re.compile(r"[A-Za-z0-9_*?][A-Za-z0-9_.*?-]{0,31}")
ALGORITHM = re.compile(r"[a-z0-9][a-z0-9@._+-]{0,79}")
ALGORITHM_KEYS = ("kex_algorithms", "ciphers", "macs", "host_key_algorithms")


class HardeningVariables:
    """Checks of the hardening variables; mixed into VariableSchema (uses its doc, struct, cidrs, boolean)."""

    doc: Located

    def hardening_checker(self, key: str):
        return {"cluster_cidrs": self.cidrs, "monitoring_cidrs": self.cidrs, "service_ports": self.service_ports,
                "ssh_hardening": self.ssh_hardening}.get(key)

    def service_ports(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, list):
            self.doc.error(path, f"service_ports must be a list of {{name, port, proto, sources}}, not "
                                 f"{type_name(value)}")
            return INVALID
        out = []
        for i, item in enumerate(value):
            entry = self.struct(item, (*path, i), "service port", {
                "name": self.service_name, "port": lambda v, p: port_number(self.doc, v, p),
                "proto": self.proto, "sources": self.service_sources}, required=("name", "port"))
            if entry is not INVALID:
                out.append({"name": entry["name"], "port": entry["port"], "proto": entry.get("proto", "tcp"),
                            "sources": entry.get("sources")})
        return out if len(out) == len(value) else INVALID

    def service_name(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and SERVICE_NAME.fullmatch(value):
            return value
        self.doc.error(path, f"bad service name {show(value)}: letters, digits, '_', '.' and '-', up to 32")
        return INVALID

    def service_sources(self, value: Any, path: tuple) -> Any:
        """A list of CIDRs, or `monitoring` / `cluster` (that variable's networks)."""
        if isinstance(value, str):
            if value in NETWORK_NAMES:
                return value
            self.doc.error(path, f"bad sources {show(value)}: give a list of CIDRs, or monitoring or cluster"
                                 f"{suggest(value, NETWORK_NAMES)}")
            return INVALID
        return self.cidrs(value, path)

    def ssh_hardening(self, value: Any, path: tuple) -> Any:
        fields = {
            "permit_root_login": self.root_login, "allow_users": self.patterns(USER_PATTERN, "user"),
            "allow_groups": self.patterns(GROUP_PATTERN, "group"), "x11_forwarding": self.boolean,
            "agent_forwarding": self.boolean, "max_auth_tries": self.bounded(1, 10),
            "login_grace_time": self.bounded(1, 600), "client_alive_interval": self.bounded(1, 3600),
            "client_alive_count_max": self.bounded(1, 10),
        }
        fields.update({key: self.algorithms for key in ALGORITHM_KEYS})
        return self.struct(value, path, "ssh_hardening", fields)

    def root_login(self, value: Any, path: tuple) -> Any:
        if value in ROOT_LOGIN:
            return value
        self.doc.error(path, f"bad permit_root_login {show(value)}: give prohibit-password or no (root with a "
                             f"password is never allowed){suggest(value, ROOT_LOGIN)}")
        return INVALID

    def bounded(self, low: int, high: int):
        def check(value: Any, path: tuple) -> Any:
            if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
                return value
            self.doc.error(path, f"expected an integer from {low} to {high}, not {show(value)}")
            return INVALID
        return check

    def patterns(self, pattern: re.Pattern, what: str):
        def check(value: Any, path: tuple) -> Any:
            if not isinstance(value, list) or not value:
                self.doc.error(path, f"expected a non-empty list of {what} names, not {show(value)}")
                return INVALID
            bad = [(i, item) for i, item in enumerate(value) if not (isinstance(item, str)
                                                                      and pattern.fullmatch(item))]
            for i, item in bad:
                self.doc.error((*path, i), f"bad {what} name {show(item)}: letters, digits, '_', '.', '-' and the "
                                           "wildcards * and ?" + (" (USER@HOST allowed)" if what == "user" else ""))
            return INVALID if bad else list(value)
        return check

    def algorithms(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, list) or not value:
            self.doc.error(path, f"expected a non-empty list of algorithm names, not {show(value)}")
            return INVALID
        bad = [(i, item) for i, item in enumerate(value) if not (isinstance(item, str) and ALGORITHM.fullmatch(item))]
        for i, item in bad:
            self.doc.error((*path, i), f"bad algorithm name {show(item)}: as `ssh -Q` prints them "
                                       "(like curve25519-sha256)")
        return INVALID if bad else list(value)


def check_references(doc: Located, variables: dict, paths: dict) -> None:
    """An error at each service port whose sources name a network variable the host has none of."""
    for i, entry in enumerate(variables.get("service_ports") or []):
        network = entry.get("sources")
        if isinstance(network, str) and not variables.get(f"{network}_cidrs"):
            doc.error((*paths["service_ports"], i, "sources"),
                      f"{entry['name']} is open to {network}, but {network}_cidrs is not set for this host: set "
                      f"{network}_cidrs (a list of CIDRs) where this host gets it")
