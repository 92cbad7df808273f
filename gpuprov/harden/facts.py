"""Harden facts: what `invoke harden` plans and audits from, as fact providers composed by gpuprov.facts.providers
into one script (one SSH command, as root) with the base facts it needs (`os`, `files`). Schema:
gpuprov.facts.schema.HardenFacts:

    {"os": {...parse_os_release...}, "systemd": bool, "controller": {"address", "port"} | None,
     "user_groups": [...], "sshd": {keyword: [values]} | None, "sshd_error": str | None,
     "ssh_supports": {kind: [names]}, "host_key_types": [...], "sshd_dropins": [...],
     "nft": bool, "nft_table": str | None, "units": {unit: is-enabled}, "packages": {name: version},
     "apt_config": {key: [values]}, "sysctl": {key: value}, "tmp_options": [...] | None, "docker": bool,
     "docker_bridges": [...] | None, "other_firewalls": {unit: state}, "other_rulesets": [...],
     "guards": [...], "files": {path: content | None}, "complete": bool, "notices": [...]}

docker_bridges: the interfaces of Docker's bridge networks (None: Docker did not answer). other_firewalls: ufw,
firewalld and nftables.service where they count (parse_firewall_units). other_rulesets: the tables that filter
besides gpuprov's and Docker's rules (firewall.other_rulesets).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Iterable

from gpuprov.core.errors import GpuprovError
from gpuprov.facts.base import REGISTRY as BASE
from gpuprov.facts.base import text_only
from gpuprov.facts.parsers import parse_lines, with_status
from gpuprov.facts.providers import MISSING, Derived, FactArgs, NoAnswer, Provider, Registry, quoted_word
from gpuprov.facts.schema import Controller, HardenFacts
from gpuprov.harden.firewall import INTERFACE, other_rulesets

QUERY_KINDS = {"kex": "kex_algorithms", "cipher": "ciphers", "mac": "macs", "key-sig": "host_key_algorithms"}


def facts_script(user: str, files: tuple[str, ...], facts: Iterable[str] | None = None) -> str:
    """The one POSIX sh script that gathers the harden facts (default: all) for the inventory's `user`."""
    return REGISTRY.script(REGISTRY.default if facts is None else facts, FactArgs(files=tuple(files), user=user))


def facts_command(user: str, files: tuple[str, ...]) -> str:
    """The one command that gathers the harden facts: `sh -c SCRIPT gpuprov-harden-facts`, quoted (and every value
    in the script); apply runs it at the end of harden's batch."""
    return f"sh -c {shlex.quote(facts_script(user, files))} gpuprov-harden-facts"


def gather(conn, files: tuple[str, ...]) -> HardenFacts:
    """The connected host's harden facts (the script on stdin, as root)."""
    result = conn.run("sh -s", sudo=True, stdin=facts_script(conn.host.user, files), timeout=120)
    return parse_gathered(conn, result.stdout, result.stderr)


def parse_gathered(conn, output: str, stderr: str) -> HardenFacts:
    """Parsed facts; an error naming the host when the script was cut off."""
    facts = parse_facts(output)
    if not facts["complete"]:
        raise GpuprovError("the harden facts script did not finish", host=conn.host.name, step="facts",
                           command="sh -s <gpuprov harden facts script>", output=stderr or output,
                           hint="check that /bin/sh works for this user on the host")
    return facts


def parse_facts(output: str) -> HardenFacts:
    """All harden facts from the script's whole output."""
    return REGISTRY.parse(output)


def sshd_config(text: str, rc: int) -> tuple[dict[str, list[str]] | None, str | None]:
    """`sshd -T` output (stderr joined in) as {keyword: [values]} (lowercase keywords), or (None, its error)."""
    if rc == MISSING:
        return None, "sshd is not installed"
    body = text.strip("\n")
    if rc != 0:
        return None, body or f"sshd -T exited with {rc}"
    config: dict[str, list[str]] = {}
    for line in body.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            config.setdefault(key.lower(), []).append(value.strip())
    return config, None


def parse_sshd(text: str) -> tuple[dict[str, list[str]] | None, str | None]:
    """sshd_config on `sshd -T` output with its status as a last `@@rc=N` line (none: sshd is not installed)."""
    body, rc = with_status(text)
    return sshd_config(body, MISSING if rc is None else rc)


def parse_controller(text: str) -> Controller | None:
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


def parse_docker_bridges(text: str, rc: int) -> list[str] | None:
    """`ID NAME` lines of Docker's bridge networks -> their interfaces (the name Docker was given, else br-ID[:12]);
    None without Docker, NoAnswer when Docker did not answer. A line that is not a network ID and an interface
    name is left out."""
    if rc == MISSING:
        return None
    if rc != 0:
        raise NoAnswer("docker network ls did not answer")
    bridges = []
    for line in parse_lines(text):
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




def _user_groups(args: FactArgs) -> str:
    if args.user is None:
        raise ValueError("the harden facts need the inventory's user (FactArgs.user)")
    return f"id -Gn -- {quoted_word(args.user, 'inventory user')} 2>/dev/null"


def _harden_packages(text: str) -> dict[str, str]:
    packages = {}
    for line in parse_lines(text):
        fields = line.split()
        if len(fields) >= 3:
            packages[fields[1]] = fields[2]
    return packages


def _ssh_supports(text: str) -> dict[str, list[str]]:
    supports = {QUERY_KINDS[kind]: names.split() for kind, names in _pairs(text).items() if kind in QUERY_KINDS}
    return {kind: names for kind, names in supports.items() if names}


def _nft_table(text: str, rc: int) -> str | None:
    return text.strip("\n") if rc == 0 else None


# the address the host sees gpuprov connect from: SSH_CONNECTION of the nearest process that has it (sudo resets the
# environment, so it is read from the login shell's); $$ is the script's shell, also inside a provider's subshell
SSH_CONNECTION = """p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  v=$(tr '\\0' '\\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^SSH_CONNECTION=//p' | head -n 1)
  if [ -n "$v" ]; then echo "$v"; break; fi
  p=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null)
done"""
SSHD_T = "need sshd; mkdir -p /run/sshd; sshd -T 2>&1"
SSH_Q = """need ssh
for q in kex cipher mac key-sig; do echo "$q $(ssh -Q "$q" 2>/dev/null | tr '\\n' ' ')"; done"""
HOST_KEY_TYPES = """need sshd
sshd -T 2>/dev/null | awk '$1 == "hostkey" { print $2 }' | while read -r f; do
  [ -r "$f.pub" ] && cut -d' ' -f1 "$f.pub"
done"""
# legacy rules are visible only where the legacy tables are loaded (reading them loads nothing)
IPTABLES_LEGACY = """for f in ip ip6; do
  if [ -n "$(cat "/proc/net/${f}_tables_names" 2>/dev/null)" ] && have "${f}tables-legacy-save"; then
    "${f}tables-legacy-save" 2>/dev/null | sed "s/^/$f /"
  fi
done"""
# firewalls gpuprov does not own: ufw, firewalld, and nftables.service (it flushes the whole ruleset on restart);
# ufw.service runs (and is enabled) on Ubuntu even while ufw is off: ufw's own status and configuration say
FIREWALL_UNITS = """if have systemctl; then
  for u in firewalld.service nftables.service; do
    e=$(systemctl is-enabled "$u" 2>/dev/null | head -n 1); a=$(systemctl is-active "$u" 2>/dev/null | head -n 1)
    echo "$u ${e:-absent} ${a:-unknown}"
  done
fi
grep -qs '^ENABLED=yes' /etc/ufw/ufw.conf && echo "ufw enabled"
have ufw && [ "$(ufw status 2>/dev/null | sed -n 's/^Status: //p' | head -n 1)" = active ] && echo "ufw active"
exit 0"""
# the bridges of Docker's bridge networks: `ID NAME` (NAME `<no value>`: Docker's br-ID[:12])
DOCKER_BRIDGES = """need docker
ids=$(timeout 30 docker network ls -q --no-trunc --filter driver=bridge 2>/dev/null) || exit 1
[ -z "$ids" ] || timeout 30 docker network inspect -f '{{.Id}} {{index .Options "com.docker.network.bridge.name"}}' \\
  $ids 2>/dev/null
exit 0"""
UNITS = """need systemctl
for u in gpuprov-firewall.service apt-daily.timer apt-daily-upgrade.timer; do
  echo "$u $(systemctl is-enabled "$u" 2>/dev/null || true)"
done"""
SYSCTL = """for k in net/ipv4/ip_forward kernel/yama/ptrace_scope kernel/modules_disabled; do
  printf '%s %s\\n' "$(echo "$k" | tr / .)" "$(cat "/proc/sys/$k" 2>/dev/null)"
done"""

REGISTRY = Registry("harden facts")
REGISTRY.include(BASE, "os")
_add = REGISTRY.register  # `default=False`: a building block of derived facts, gathered when they are asked for
_add(Provider("systemd", "[ -d /run/systemd/system ] && echo yes", text_only(lambda text: text.strip() == "yes"),
              False))
_add(Provider("controller", SSH_CONNECTION, text_only(parse_controller)))
_add(Provider("user_groups", _user_groups, text_only(str.split), []))
_add(Provider("sshd", SSHD_T, lambda text, rc: sshd_config(text, rc)[0]))
_add(Provider("sshd_error", SSHD_T, lambda text, rc: sshd_config(text, rc)[1]))
_add(Provider("ssh_supports", SSH_Q, text_only(_ssh_supports), {}))
_add(Provider("host_key_types", HOST_KEY_TYPES, text_only(parse_lines), []))
_add(Provider("sshd_dropins", "ls -1 /etc/ssh/sshd_config.d 2>/dev/null", text_only(parse_lines), []))
_add(Provider("nft", "need nft; nft --version 2>/dev/null", text_only(lambda text: bool(text.strip())), False))
_add(Provider("nft_table", "need nft; nft list table inet gpuprov 2>/dev/null", _nft_table))
_add(Provider("nft_ruleset", "need nft; nft -t list ruleset 2>/dev/null | head -c 262144", text_only(str)),
     default=False)
_add(Provider("iptables_legacy", IPTABLES_LEGACY, text_only(str)), default=False)
_add(Provider("units", UNITS, text_only(_pairs), {}))
_add(Provider("packages", "need dpkg-query; dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' "
                          "unattended-upgrades nftables openssh-server 2>/dev/null | grep '^[hi]i'",
              text_only(_harden_packages), {}))
_add(Provider("apt_config", "need apt-config; apt-config dump 2>/dev/null | "
                            "grep -E '^(APT::Periodic|Unattended-Upgrade)::'", text_only(parse_apt_config), {}))
_add(Provider("sysctl", SYSCTL, text_only(_pairs), {}))
_add(Provider("tmp_options", "awk '$2 == \"/tmp\" { print $4 }' /proc/mounts 2>/dev/null | tail -n 1",
              text_only(lambda text: text.strip().split(",") if text.strip() else None)))
_add(Provider("docker", "have dockerd && echo yes", text_only(lambda text: text.strip() == "yes"), False))
_add(Provider("docker_bridges", DOCKER_BRIDGES, parse_docker_bridges))
_add(Provider("other_firewalls", FIREWALL_UNITS, text_only(parse_firewall_units), {}))
_add(Derived("other_rulesets", ("nft_ruleset", "iptables_legacy", "docker_bridges"),
             lambda listing, legacy, bridges: other_rulesets(listing or "", legacy or "", bridges or ()), []))
_add(Provider("guards", "ls -1 /run/gpuprov/harden 2>/dev/null", text_only(parse_lines), []))
REGISTRY.include(BASE, "files")
