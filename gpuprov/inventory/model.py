"""The loaded inventory: hosts with their connection settings and merged variables, groups, host selection."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov.core.errors import InputError, literal
from gpuprov.inventory.checks import ip_address
from gpuprov.inventory.diagnostics import suggest

USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_HOSTNAME_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Host:
    """One host with its connection settings and merged variables."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    jump: str | None = None
    sudo_password_env: str | None = None
    sudo_nopasswd: bool = False
    groups: tuple[str, ...] = ()
    vars: dict = field(default_factory=dict, hash=False)
    sources: dict = field(default_factory=dict, hash=False)
    setting_sources: dict = field(default_factory=dict, hash=False, compare=False)

    def var(self, dotted: str, default: Any = None) -> Any:
        """A merged variable by dotted path: `host.var("stack.cuda")`; list items by index."""
        value: Any = self.vars
        for part in dotted.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and ascii_digits(part) and int(part) < len(value):
                value = value[int(part)]
            else:
                return default
        return value

    def to_dict(self) -> dict:
        """Connection settings, groups, variables and where each came from (no secrets: there are none)."""
        return {
            "name": self.name, "address": self.address, "port": self.port, "user": self.user,
            "identity_file": self.identity_file, "jump": self.jump,
            "sudo": {"password_env": self.sudo_password_env, "nopasswd": self.sudo_nopasswd},
            "groups": list(self.groups), "vars": self.vars, "sources": self.sources,
            "setting_sources": self.setting_sources,
        }


@dataclass(frozen=True)
class Group:
    """A group: its own variables, child groups, parent groups and every host in it (via children too)."""

    name: str
    vars: dict = field(default_factory=dict, hash=False)
    children: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()


@dataclass
class Inventory:
    """A loaded, validated inventory."""

    path: Path
    hosts: dict[str, Host]
    groups: dict[str, Group]
    format: str = "native"
    warnings: list[str] = field(default_factory=list)
    known_hosts: Path | None = None

    def host(self, name: str) -> Host:
        """One host by name; InputError with a did-you-mean when there is none."""
        if name not in self.hosts:
            raise InputError(f"unknown host {name!r} in {self.path}{suggest(name, self.hosts)}",
                             step="inventory",
                             hint=f"list them with: invoke inventory.check --inventory {self.path}")
        return self.hosts[name]

    def select(self, hosts: list[str], groups: list[str], all_: bool) -> list[Host]:
        """Hosts selected by the host patterns (Ansible's --limit: gpuprov.inventory.limit), plus hosts in the groups
        named, or every host; in inventory order. InputError (exit 2) for a pattern that selects no host (each
        part, and the whole), an unknown group, or no selection."""
        from gpuprov.inventory.limit import Matcher, split_patterns

        patterns, problems = [], []
        for value in hosts:
            try:
                found = split_patterns(value)
            except ValueError as exc:
                problems.append(f"--host {literal(repr(value))} {exc}")
                continue
            if not found:
                problems.append(f"--host {literal(repr(value))} holds no pattern")
            patterns += found
        problems += [f"unknown group {n!r}{suggest(n, self.groups)}" for n in groups if n not in self.groups]
        # --group's hosts first: `--group hgx --host '!gpu03'` is hgx without gpu03, as `hgx:!gpu03` is
        wanted: set[str] = {name for group in groups if group in self.groups for name in self.groups[group].hosts}
        if patterns:
            matcher = Matcher({n: h.groups for n, h in self.hosts.items()},
                              {n: (g.children, g.hosts) for n, g in self.groups.items()})
            wanted, found = matcher.evaluate(patterns, start=[n for n in self.hosts if n in wanted])
            problems += found
            if not wanted and not problems:
                problems.append(f"--host {literal(repr(','.join(hosts)))} selects no host")
        if problems:
            raise InputError(f"{'; '.join(problems)} in {self.path}", step="select hosts",
                             hint=f"list them with: invoke inventory.check --inventory {self.path}")
        if all_:
            return list(self.hosts.values())
        if not patterns and not groups:
            raise InputError("no hosts selected", step="select hosts", hint="give --host, --group or --all")
        if not wanted:
            raise InputError(f"group {', '.join(groups)} has no hosts in {self.path}", step="select hosts",
                             hint="give --host, --group or --all")
        return [h for name, h in self.hosts.items() if name in wanted]

    def jump_host(self, host: Host) -> Host | None:
        """The host to jump through: an inventory host, or one parsed from `user@address[:port]`.

        A jump host given as `user@address:port` uses the target host's identity file. gpuprov connects
        through one jump host: inventory.check refuses a jump host that has a jump host of its own.
        """
        if host.jump is None:
            return None
        if host.jump in self.hosts:
            return self.hosts[host.jump]
        user, address, port = parse_jump(host.jump)
        return Host(name=host.jump, address=address, port=port, user=user, identity_file=host.identity_file)


def ascii_digits(text: str) -> bool:
    """Digits 0-9 only (str.isdigit also accepts "²" and "２", which are not port or range numbers)."""
    return text.isascii() and text.isdigit()


def parse_port(text: str) -> int:
    """A port number written as text; ValueError saying what is wrong."""
    if not text.isascii() and any(ch.isdigit() or ch.isnumeric() for ch in text):
        raise ValueError(f"bad port {text!r}: it has digits that are not ASCII; write it with the digits 0-9")
    if not ascii_digits(text) or not 1 <= int(text) <= 65535:
        raise ValueError(f"bad port {text!r}: give an integer from 1 to 65535")
    return int(text)


def parse_jump(text: str) -> tuple[str, str, int]:
    """`user@address[:port]` (IPv6: `user@[addr]:port`) -> (user, address, port); ValueError if bad."""
    user, sep, rest = text.partition("@")
    if not sep or not rest:
        raise ValueError("expected user@address[:port] or the name of an inventory host")
    if not USER.fullmatch(user):
        raise ValueError(f"bad user {user!r} in jump host")
    port = 22
    if rest.startswith("["):
        address, bracket, tail = rest[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError("bad bracketed IPv6 address in jump host")
        port_text = tail[1:] if tail else None
    elif rest.count(":") == 1:
        address, _, port_text = rest.partition(":")
    else:
        address, port_text = rest, None
    if port_text is not None:
        port = parse_port(port_text)
    if not is_valid_address(address):
        raise ValueError(f"bad address {address!r} in jump host")
    return user, address, port


def is_valid_address(text: str, zone: bool = True) -> bool:
    """An IP address or an RFC 1123 host name (no spaces, no shell metacharacters). An IPv6 zone (`%eth0`) only
    as an interface name, and only with `zone` (gpuprov.inventory.checks.ip_address)."""
    if not isinstance(text, str) or not text or len(text) > 253 or not text.isascii():
        return False
    if ip_address(text, zone=zone) is not None:
        return True
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    # an all-numeric last label is a mistyped IP address (10.0.0.256), not a host name (RFC 3696 2)
    return all(_HOSTNAME_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()
