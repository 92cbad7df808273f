"""Harden facts: `facts.sh` on the host (as root, one SSH command), parsed here.

    {"os": {...parse_os_release...}, "systemd": bool, "controller": {"address", "port"} | None,
     "user_groups": [...], "sshd": {keyword: [values]} | None, "sshd_error": str | None,
     "ssh_supports": {kind: [names]}, "host_key_types": [...], "sshd_dropins": [...],
     "nft": bool, "nft_table": str | None, "units": {unit: is-enabled}, "packages": {name: version},
     "apt_config": {key: [values]}, "sysctl": {key: value}, "tmp_options": [...] | None, "docker": bool,
     "docker_bridges": [...] | None, "other_firewalls": {unit: state}, "other_rulesets": [...],
     "guards": [...], "files": {path: content | None}}

docker_bridges: the interfaces of Docker's bridge networks (None: Docker did not answer). other_firewalls: ufw,
firewalld and nftables.service where they count (parse_firewall_units). other_rulesets: the tables that filter
besides gpuprov's and Docker's rules (firewall.other_rulesets).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from functools import cache
from importlib import resources

from gpuprov.errors import GpuprovError
from gpuprov.facts.parsers import parse_file, parse_lines, parse_os_release, split_sections
from gpuprov.harden.firewall import INTERFACE, other_rulesets

QUERY_KINDS = {"kex": "kex_algorithms", "cipher": "ciphers", "mac": "macs", "key-sig": "host_key_algorithms"}


@cache
def facts_script() -> str:
    return resources.files("gpuprov.harden").joinpath("facts.sh").read_text()


def facts_command(user: str, files: tuple[str, ...]) -> str:
    """The one command that gathers the harden facts: `sh -c SCRIPT gpuprov-harden-facts USER FILE...`, quoted."""
    args = " ".join(shlex.quote(arg) for arg in (user, *files))
    return f"sh -c {shlex.quote(facts_script())} gpuprov-harden-facts {args}"


def gather(conn, files: tuple[str, ...]) -> dict:
    """The connected host's harden facts (the script on stdin, as root)."""
    args = " ".join(shlex.quote(arg) for arg in (conn.host.user, *files))
    result = conn.run(f"sh -s -- {args}", sudo=True, stdin=facts_script(), timeout=120)
    return parse_gathered(conn, result.stdout, result.stderr)


def parse_gathered(conn, output: str, stderr: str) -> dict:
    """Parsed facts; an error naming the host when the script was cut off."""
    facts = parse_facts(output)
    if not facts["complete"]:
        raise GpuprovError("the harden facts script did not finish", host=conn.host.name, step="facts",
                           command="sh -s <gpuprov harden facts script>", output=stderr or output,
                           hint="check that /bin/sh works for this user on the host")
    return facts


def _rc_split(text: str) -> tuple[str, int | None]:
    """A section's text and the `@@rc=N` it ended with (None: the tool is missing)."""
    body, _, last = text.rpartition("\n")
    if not last.startswith("@@rc="):
        body, last = "", text if text.startswith("@@rc=") else ""
    rc = last[5:]
    return body.strip("\n"), int(rc) if rc.isdigit() else None


def parse_sshd(text: str) -> tuple[dict[str, list[str]] | None, str | None]:
    """`sshd -T` output as {keyword: [values]} (lowercase keywords), or (None, its error)."""
    body, rc = _rc_split(text)
    if rc is None:
        return None, "sshd is not installed"
    if rc != 0:
        return None, body or f"sshd -T exited with {rc}"
    config: dict[str, list[str]] = {}
    for line in body.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            config.setdefault(key.lower(), []).append(value.strip())
    return config, None


def parse_controller(text: str) -> dict | None:
    """`SSH_CONNECTION` (client address, client port, server address, server port) -> where gpuprov comes from."""
    fields = text.split()
    if len(fields) != 4 or not fields[3].isdigit():
        return None
    try:
        ipaddress.ip_address(fields[0])
    except ValueError:
        return None
    return {"address": fields[0], "port": int(fields[3])}


def _pairs(text: str) -> dict[str, str]:
    out = {}
    for line in parse_lines(text):
        key, _, value = line.partition(" ")
        out[key] = value.strip()
    return out


def parse_apt_config(text: str) -> dict[str, list[str]]:
    """`apt-config dump` lines (`Key "value";`, list items as `Key:: "value";`) -> {key: [values]}."""
    config: dict[str, list[str]] = {}
    for line in parse_lines(text):
        key, _, value = line.partition(" ")
        value = value.strip().removesuffix(";").strip().strip('"')
        config.setdefault(key.removesuffix("::"), [])
        if value:
            config[key.removesuffix("::")].append(value)
    return config


def parse_docker_bridges(text: str) -> list[str] | None:
    """`ID NAME` lines of Docker's bridge networks -> their interfaces (the name Docker was given, else br-ID[:12]);
    None when Docker did not answer. A line that is not a network ID and an interface name is left out."""
    body, rc = _rc_split(text)
    if rc != 0:
        return None
    bridges = []
    for line in parse_lines(body):
        fields = line.split(None, 1)
        if len(fields) != 2 or not re.fullmatch(r"[0-9a-f]{64}", fields[0]):
            continue
        name = f"br-{fields[0][:12]}" if fields[1].strip() == "<no value>" else fields[1].strip()
        if INTERFACE.fullmatch(name):
            bridges.append(name)
    return sorted(set(bridges))


def parse_firewall_units(text: str) -> dict[str, str]:
    """ufw and firewalld where enabled or active, nftables.service where enabled: {name: "enabled, active"}.
    (nftables.service flushes the ruleset when it starts, reloads or stops: enabled, it is the operator's way of
    loading rules; merely active, nothing but a hand starts it again.)"""
    found: dict[str, list[str]] = {}
    for line in parse_lines(text):
        name, *states = line.split()
        counted = ("enabled", "enabled-runtime") + (("active", "activating", "reloading")
                                                    if name in ("ufw", "firewalld.service") else ())
        kept = [state for state in states if state in counted]
        if kept and name in ("ufw", "firewalld.service", "nftables.service"):
            found.setdefault(name, []).extend(kept)
    return {name: ", ".join(states) for name, states in found.items()}


def parse_facts(output: str) -> dict:
    """All harden facts from the script's whole output."""
    sec = split_sections(output)
    sshd, sshd_error = parse_sshd(sec.get("sshd-T", ""))
    table, table_rc = _rc_split(sec.get("nft-table", ""))
    packages = {}
    for line in parse_lines(sec.get("packages", "")):
        fields = line.split()
        if len(fields) >= 3:
            packages[fields[1]] = fields[2]
    supports = {QUERY_KINDS[k]: v.split() for k, v in _pairs(sec.get("ssh-Q", "")).items() if k in QUERY_KINDS}
    tmp = sec.get("tmp-mount", "").strip()
    bridges = parse_docker_bridges(sec.get("docker-bridges", ""))
    return {
        "os": parse_os_release(sec.get("os-release", "")),
        "systemd": sec.get("systemd", "").strip() == "yes",
        "controller": parse_controller(sec.get("ssh-connection", "")),
        "user_groups": sec.get("user-groups", "").split(),
        "sshd": sshd, "sshd_error": sshd_error,
        "ssh_supports": {kind: names for kind, names in supports.items() if names},
        "host_key_types": parse_lines(sec.get("host-key-types", "")),
        "sshd_dropins": parse_lines(sec.get("sshd-dropins", "")),
        "nft": bool(sec.get("nft-version", "").strip()),
        "nft_table": table if table_rc == 0 else None,
        "units": _pairs(sec.get("units", "")),
        "packages": packages,
        "apt_config": parse_apt_config(sec.get("apt-config", "")),
        "sysctl": _pairs(sec.get("sysctl", "")),
        "tmp_options": tmp.split(",") if tmp else None,
        "docker": sec.get("docker", "").strip() == "yes",
        "docker_bridges": bridges,
        "other_firewalls": parse_firewall_units(sec.get("firewall-units", "")),
        "other_rulesets": other_rulesets(sec.get("nft-ruleset", ""), sec.get("iptables-legacy", ""), bridges or ()),
        "guards": parse_lines(sec.get("guards", "")),
        "files": {name[5:]: parse_file(body) for name, body in sec.items() if name.startswith("file ")},
        "complete": "end" in sec,
    }
