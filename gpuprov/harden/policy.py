"""A host's hardening policy: its inventory variables (ssh_hardening, firewall, cluster_cidrs, monitoring_cidrs,
service_ports) read against its facts (the ports sshd listens on, the algorithms its OpenSSH supports, Docker's
bridges)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpuprov.harden.algorithms import KINDS, AlgorithmChoice, choose
from gpuprov.harden.firewall import Rule, build_rules


@dataclass(frozen=True)
class SshPolicy:
    """The sshd settings of the dev-sec ssh-hardening baseline, as the inventory's ssh_hardening adjusts them."""

    permit_root_login: str = "prohibit-password"
    x11_forwarding: bool = False
    agent_forwarding: bool = False
    max_auth_tries: int = 3
    login_grace_time: int = 30
    client_alive_interval: int = 300
    client_alive_count_max: int = 3
    allow_users: tuple[str, ...] = ()
    allow_groups: tuple[str, ...] = ()

    @classmethod
    def from_vars(cls, settings: dict) -> SshPolicy:
        names = {f.name for f in fields(cls)}
        values = {key: tuple(value) if isinstance(value, list) else value
                  for key, value in settings.items() if key in names}
        return cls(**values)


@dataclass(frozen=True)
class HardenPolicy:
    """What harden makes of one host."""

    ssh: SshPolicy
    algorithms: tuple[AlgorithmChoice, ...]
    rules: tuple[Rule, ...]
    ssh_ports: tuple[int, ...]
    docker_bridges: tuple[str, ...] = ()    # left to Docker by the published-ports chain (firewall.render)

    def algorithm(self, kind: str) -> AlgorithmChoice:
        return next(choice for choice in self.algorithms if choice.kind == kind)

    def value(self, name: str):
        """A policy value a control's expected value refers to (`{policy: NAME}`), as sshd -T prints it."""
        from gpuprov.stack.families import BLACKLIST

        if name in KINDS:
            return list(self.algorithm(name).names)
        if name == "nvidia_holds":
            return list(BLACKLIST)
        value = getattr(self.ssh, name)
        if isinstance(value, bool):
            return "yes" if value else "no"
        return list(value) if isinstance(value, tuple) else str(value)


POLICY_VALUES = ("permit_root_login", "x11_forwarding", "agent_forwarding", "max_auth_tries", "login_grace_time",
                 "client_alive_interval", "client_alive_count_max", "allow_users", "allow_groups", *KINDS,
                 "nvidia_holds")


def ssh_ports(facts: dict) -> tuple[int, ...]:
    """The ports sshd listens on (sshd -T), else the one gpuprov came in on, else 22."""
    ports = [int(p) for p in ((facts.get("sshd") or {}).get("port") or []) if p.isdigit()]
    if not ports and facts.get("controller"):
        ports = [facts["controller"]["port"]]
    return tuple(dict.fromkeys(ports or [22]))


def build_policy(variables: dict, facts: dict) -> HardenPolicy:
    """The policy of a host with these merged inventory variables and these harden facts."""
    settings = variables.get("ssh_hardening") or {}
    sshd = facts.get("sshd") or {}
    supports = facts.get("ssh_supports") or {}
    current = {kind: ",".join(sshd.get(kind.replace("_", ""), [])).split(",") for kind in KINDS}
    algorithms = tuple(choose(kind, settings.get(kind), supports.get(kind) or [n for n in current[kind] if n])
                       for kind in KINDS)
    ports = ssh_ports(facts)
    return HardenPolicy(SshPolicy.from_vars(settings), algorithms, tuple(build_rules(variables, list(ports))), ports,
                        tuple(facts.get("docker_bridges") or ()))
