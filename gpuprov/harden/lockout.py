"""Refusals before anything is applied: a policy that would lock gpuprov (and so the operator) out.

- no algorithm of a kind in common with paramiko, gpuprov's SSH client;
- HostKeyAlgorithms without the type of the host key gpuprov verifies (known_hosts would no longer match);
- the connecting user left out by AllowUsers / AllowGroups, or root with PermitRootLogin no;
- a firewall that drops SSH from the address the host sees gpuprov connect from ($SSH_CONNECTION);
- a firewall gpuprov does not own (ufw, firewalld, nftables.service, another table that filters): gpuprov refuses
  to load its table beside it rather than integrate with it, and says how to turn it off or leave the firewall to it.
`--i-have-console-access` turns these into notices; the commit-confirmed guard still reverts a lockout, and the
audit after applying reverts a firewall loaded beside another one.
"""

from __future__ import annotations

import fnmatch
import ipaddress

from gpuprov.harden.algorithms import paramiko_supported, presents_key
from gpuprov.harden.firewall import reaches
from gpuprov.harden.policy import HardenPolicy


def _user_matches(pattern: str, user: str, address: str | None) -> bool:
    """sshd's AllowUsers pattern USER or USER@HOST (HOST a wildcard or CIDR) against the connecting user."""
    name, _, where = pattern.partition("@")
    if not fnmatch.fnmatchcase(user, name):
        return False
    if not where:
        return True
    if address is None:
        return False
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(where, strict=False)
    except ValueError:
        return fnmatch.fnmatchcase(address, where)


def ssh_refusals(policy: HardenPolicy, facts: dict, user: str, key_type: str | None) -> list[str]:
    """Why the sshd policy would lock gpuprov out ([] when it would not)."""
    found = []
    for choice in policy.algorithms:
        if not choice.with_paramiko():
            found.append(f"{choice.keyword} {','.join(choice.names) or '(none)'} has nothing in common with paramiko, "
                         f"gpuprov's SSH client (it supports {','.join(paramiko_supported(choice.kind))})")
    host_keys = policy.algorithm("host_key_algorithms")
    if key_type and not presents_key(host_keys, key_type):
        found.append(f"HostKeyAlgorithms {','.join(host_keys.names)} drops the {key_type} host key gpuprov verifies "
                     "this host by: give the host an ed25519 host key and record it in known_hosts first")
    ssh = policy.ssh
    address = (facts.get("controller") or {}).get("address")
    if ssh.allow_users and not any(_user_matches(p, user, address) for p in ssh.allow_users):
        found.append(f"AllowUsers {' '.join(ssh.allow_users)} leaves out {user}, the user gpuprov connects as"
                     + (f" from {address}" if address else ""))
    groups = set(facts.get("user_groups") or [])
    if ssh.allow_groups and not any(fnmatch.filter(groups, pattern) for pattern in ssh.allow_groups):
        found.append(f"AllowGroups {' '.join(ssh.allow_groups)} leaves out {user}, the user gpuprov connects as "
                     f"(groups: {' '.join(sorted(groups)) or 'unknown'})")
    if ssh.permit_root_login == "no" and user == "root":
        found.append("PermitRootLogin no while gpuprov connects as root: connect as a sudo user first")
    return found


BOTH_FILTER = ("it owns this host's firewall: its rules and gpuprov's table would both filter, a port opening only "
               "where both allow it")
OTHER_FIREWALLS = {
    "ufw": (BOTH_FILTER, "turn it off (`ufw disable`)"),
    "firewalld.service": (BOTH_FILTER, "turn it off (`systemctl disable --now firewalld`)"),
    "nftables.service": ("it loads /etc/nftables.conf, whose `flush ruleset` (and the unit's stop, `nft flush "
                         "ruleset`) wipes gpuprov's table and Docker's on every restart or reload",
                         "`systemctl disable nftables.service` (not --now: stopping it flushes the whole ruleset; "
                         "gpuprov-firewall.service loads gpuprov's table at boot)"),
}
LEAVE_IT = "or leave the firewall to it (invoke harden --only ssh,updates)"


def other_firewall_refusals(facts: dict) -> list[str]:
    """Why gpuprov will not load its table beside another firewall: one reason per firewall or foreign table."""
    found = []
    for name, state in (facts.get("other_firewalls") or {}).items():
        why, fix = OTHER_FIREWALLS[name]
        found.append(f"{name} is {state}: {why}; gpuprov refuses rather than integrate: {fix}, {LEAVE_IT}")
    for ruleset in facts.get("other_rulesets") or []:
        found.append(f"another ruleset filters this host ({ruleset}): gpuprov refuses to filter beside it rather "
                     f"than integrate: remove those rules and what loads them, {LEAVE_IT}")
    return found


def firewall_refusals(policy: HardenPolicy, facts: dict) -> list[str]:
    """Why the firewall would drop gpuprov's own SSH connections, or must not be loaded beside another ([] when
    neither)."""
    others = other_firewall_refusals(facts)
    controller = facts.get("controller")
    if controller is None:
        return [*others, "the host does not show the address gpuprov connects from ($SSH_CONNECTION), so the "
                         "firewall cannot be shown to let gpuprov back in"]
    address, port = controller["address"], controller["port"]
    if reaches(list(policy.rules), address, "tcp", port):
        return others
    ssh = [rule for rule in policy.rules if rule.comment == "ssh" and rule.port == port]
    sources = ", ".join(str(n) for rule in ssh for n in rule.sources or ()) or "none"
    cluster = ", ".join(str(n) for r in policy.rules if r.comment == "cluster" for n in r.sources or ()) or "none"
    return [*others, f"the firewall would drop SSH from {address}, the address this host sees gpuprov connect from, "
                     f"to port {port} (SSH sources: {sources}; cluster: {cluster})"]
