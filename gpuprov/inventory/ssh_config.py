"""OpenSSH's client config (`~/.ssh/config`, or gpuprov.ssh_config in invoke.yaml) applied to a loaded inventory.

Each host is looked up the way `ssh ADDRESS` would look it up: by its address, which is its inventory name when
the inventory gives none (as Ansible runs `ssh ansible_host`). paramiko's SSHConfig reads the file and matches
its `Host` and `Match` blocks (first value wins); gpuprov takes HostName, Port, User, IdentityFile and ProxyJump.
Whatever the inventory sets wins, as options on ssh's command line do (`-l`, `-p`, `-J`, the destination): the
inventory's values are given to the lookup first, so `Match user` and the tokens see them. Every value taken from
the file records where it was written (`~/.ssh/config:12`) in Host.setting_sources, which `inventory.show` prints.

As OpenSSH does: `Include` (globs; relative paths under ~/.ssh; a depth of 16), `ProxyJump none`, the tokens of
HostName (%h %%), IdentityFile (%d %h %i %k %L %l %n %p %r %u %% and a leading `~`, `${VAR}`) and ProxyJump
(%h %n %p %r %%); IdentityFiles that do not exist are skipped. gpuprov uses one key per host: the first
IdentityFile that exists. Refused, with the file and line: `Match exec` (gpuprov runs no command from the file),
ProxyJump with more than one hop, ProxyCommand (write ProxyJump), a jump host that is itself jumped to, and a
jump host outside the inventory whose IdentityFile differs from its target's (gpuprov logs in to a jump host
given as `user@address:port` with the target's key: add it to the inventory).
A missing file is no config, as for ssh, unless it was named in gpuprov.ssh_config.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from gpuprov.core.errors import InputError, literal
from gpuprov.inventory.checks import NotRegular, read_regular
from gpuprov.inventory.model import USER, Host, Inventory, is_valid_address, parse_port

DEFAULT = "~/.ssh/config"
MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 16   # OpenSSH's READCONF_MAX_DEPTH
_KEYWORD = re.compile(r"\s*([A-Za-z]+)(?:\s*=\s*|\s+)(.*?)\s*$")
_TOKEN = re.compile(r"%(.)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HOP = re.compile(r"(?:ssh://)?(?:(?P<user>[^@]+)@)?(?P<host>\[[^]]+\]|[^:]+)(?::(?P<port>[^:]+))?")
_HINT = "fix that line of the ssh_config, or point gpuprov.ssh_config (invoke.yaml) at another file ('' for none)"


@dataclass(frozen=True)
class _Line:
    """One line of the config as paramiko reads it, with where it was written."""

    text: str
    file: str
    number: int


class _Config:
    """The file read with its Includes, parsed by paramiko, and the place of every keyword line."""

    def __init__(self, path: Path):
        from paramiko.config import SSHConfig, SSHConfigDict
        from paramiko.ssh_exception import ConfigParseError

        class Unexpanded(SSHConfig):
            """paramiko's matching; the tokens are expanded by gpuprov, with the values it connects with."""

            def _expand_variables(self, config, target_hostname):
                return config

        self.path = path
        self.lines: list[_Line] = []
        self._read(path, 0, [])
        self.dict_type = SSHConfigDict
        self.places: dict[tuple[str, str], str] = {}   # (keyword, value as paramiko keeps it): its first line
        for line in self.lines:
            found = _KEYWORD.match(line.text)
            if found:
                self.places.setdefault((found.group(1).lower(), found.group(2).strip('"')),
                                       f"{line.file}:{line.number}")
        try:
            self.parsed = Unexpanded.from_text("\n".join(line.text for line in self.lines))
        except ConfigParseError as exc:
            raise InputError(f"{_shown(path)}: ssh_config: {literal(str(exc))}", step="inventory",
                             hint=_HINT) from None

    def _read(self, path: Path, depth: int, chain: list[Path], condition: str | None = None) -> None:
        """The lines of `path`, its Includes read in place. An Include inside a block applies only where the block
        does (ssh reads it only then): `condition` is that block's, as Match criteria, and every Host or Match line
        of the included file becomes a Match that adds its own criteria to it."""
        shown = _shown(path)
        try:
            text = read_regular(path, MAX_BYTES).decode("utf-8")
        except NotRegular as exc:
            raise InputError(f"{shown}: ssh_config: {exc.reason}", step="inventory", hint=_HINT) from None
        except OSError as exc:
            raise InputError(f"{shown}: ssh_config: cannot read: {exc.strerror}", step="inventory",
                             hint=_HINT) from None
        except UnicodeDecodeError:
            raise InputError(f"{shown}: ssh_config: not UTF-8 text", step="inventory", hint=_HINT) from None
        current = condition   # the lines before the first Host or Match: the includer's block (None: every host)
        for number, raw in enumerate(text.splitlines(), 1):
            found = _KEYWORD.match(raw)
            keyword = found.group(1).lower() if found else ""
            where = f"{shown}:{number}"
            if keyword == "host":
                current = " ".join(filter(None, [condition, "originalhost " + ",".join(_words(found.group(2)))]))
                self.lines.append(_Line(raw if condition is None else f"Match {current}", shown, number))
            elif keyword == "match":
                words = _words(found.group(2))
                if any(word.lstrip("!").lower() == "exec" for word in words):
                    raise InputError(f"{where}: ssh_config: Match exec: gpuprov runs no command from the ssh_config",
                                     step="inventory", hint=_HINT)
                current = " ".join(filter(None, [condition, shlex.join(w for w in words if w.lower() != "all")]))
                self.lines.append(_Line(raw if condition is None else f"Match {current or 'all'}", shown, number))
                current = current or None
            elif keyword == "include":
                if depth >= MAX_DEPTH or path in chain:
                    raise InputError(f"{where}: ssh_config: Include nested more than {MAX_DEPTH} deep (or a loop)",
                                     step="inventory", hint=_HINT)
                for pattern in _words(found.group(2)):
                    full = os.path.expanduser(pattern)
                    full = full if os.path.isabs(full) else os.path.expanduser(f"~/.ssh/{full}")
                    for name in sorted(glob.glob(full)):
                        self._read(Path(name), depth + 1, [*chain, path], current)
                # what follows the Include is in its block again
                self.lines.append(_Line("Host *" if current is None else f"Match {current}", shown, number))
            else:
                self.lines.append(_Line(raw, shown, number))

    def where(self, keyword: str, value: str) -> str:
        """`FILE:LINE` of the first line that sets `keyword` to `value` (as paramiko keeps it), else the file."""
        return self.places.get((keyword, value), _shown(self.path))

    def lookup(self, target: str, given: dict[str, str]) -> dict:
        """paramiko's lookup (SSHConfig.lookup) of `target`, the inventory's values given first, unexpanded."""
        from paramiko.ssh_exception import CouldNotCanonicalize

        parsed = self.parsed
        options = parsed._lookup(target, self.dict_type(given))
        options.setdefault("hostname", target)
        try:
            if options.get("canonicalizehostname") in ("yes", "always") and \
                    target.count(".") <= int(options.get("canonicalizemaxdots", 1)):
                options["hostname"] = target = parsed.canonicalize(target, options,
                                                                   options.get("canonicaldomains", "").split())
                return parsed._lookup(target, options, canonical=True, final=True)
        except (ValueError, CouldNotCanonicalize) as exc:
            raise InputError(f"{_shown(self.path)}: ssh_config: {target}: cannot canonicalize the host name "
                             f"({literal(str(exc))})", step="inventory", hint=_HINT) from None
        return parsed._lookup(target, options, canonical=False, final=True)


def apply_ssh_config(inventory: Inventory, path: Path | None) -> Inventory:
    """The inventory with each host's connection settings completed from OpenSSH's client config at `path`
    (None: none); InputError (exit 2), naming the file and line, for what gpuprov cannot follow as ssh would."""
    if path is None:
        return inventory
    path = Path(path)
    if not path.exists():
        if path == Path(os.path.expanduser(DEFAULT)):
            return inventory
        raise InputError(f"{_shown(path)}: ssh_config: no such file", step="inventory",
                         hint="point gpuprov.ssh_config (invoke.yaml) at OpenSSH's client config, or set it to '' "
                              "to read none")
    config = _Config(path)
    hosts = {name: _Resolver(config, inventory, host).host() for name, host in inventory.hosts.items()}
    for host in hosts.values():
        hop = hosts.get(host.jump) if host.jump else None
        if hop is not None and hop.jump is not None:
            chain = " -> ".join([host.name, host.name] if hop is host else [host.name, hop.name, hop.jump])
            taken = [h for h in (hop, host) if h.setting_sources.get("jump") !=
                     inventory.hosts[h.name].setting_sources.get("jump")]   # the inventory alone has no chain
            kind = "loop" if hop is host else "chain"
            raise InputError(f"{taken[0].setting_sources['jump']}: ssh_config: jump {kind} {chain}: gpuprov connects "
                             "through one jump host, never skipping a hop",
                             host=host.name, step="inventory",
                             hint=f"give {hop.name} ProxyJump none (or Host patterns that leave it out) if gpuprov "
                                  "can reach it directly, or jump through a host it can")
    return replace(inventory, hosts=hosts)


class _Resolver:
    """One host's settings from the config, below the inventory's."""

    def __init__(self, config: _Config, inventory: Inventory, host: Host):
        self.config, self.inventory, self.original = config, inventory, host
        self.given = {key for key, source in host.setting_sources.items()
                      if not (key == "address" and source == "host name")}

    def host(self) -> Host:
        host, config = self.original, self.config
        given = {"user": host.user, "port": str(host.port), "hostname": host.address, "proxyjump": host.jump or "none"}
        options = config.lookup(host.address, {key: value for key, value in given.items()
                                               if _SETTING[key] in self.given})
        changes: dict = {}
        sources = dict(host.setting_sources)

        def take(setting: str, keyword: str, value, raw: str) -> None:
            changes[setting] = value
            sources[setting] = config.where(keyword, raw)

        raw = options["hostname"]
        if "address" not in self.given and raw != host.address:
            address = _expand(raw, {"h": host.address}, "HostName", config.where("hostname", raw))
            if not is_valid_address(address):
                raise self.refuse("hostname", raw, f"HostName {address!r}: not an IP address or a host name")
            take("address", "hostname", address, raw)
        if "port" not in self.given and "port" in options:
            try:
                take("port", "port", parse_port(options["port"]), options["port"])
            except ValueError as exc:
                raise self.refuse("port", options["port"], f"Port: {exc}") from None
        if "user" not in self.given and "user" in options:
            if not USER.fullmatch(options["user"]):
                raise self.refuse("user", options["user"], f"User {options['user']!r}: not a user name")
            take("user", "user", options["user"], options["user"])
        now = replace(host, **changes)
        if "identity_file" not in self.given and options.get("identityfile"):
            found = self.identity(now, options)
            if found is not None:
                take("identity_file", "identityfile", *found)
                now = replace(now, identity_file=found[0])
        jump = options.get("proxyjump") or "none"
        if "jump" not in self.given and options.get("proxycommand") and jump.lower() == "none":
            raise self.refuse("proxycommand", options["proxycommand"],
                              "ProxyCommand: gpuprov connects directly or through one jump host; write ProxyJump, or "
                              "give the host a jump in the inventory")
        if "jump" not in self.given and jump.lower() != "none":
            take("jump", "proxyjump", self.jump(now, jump), jump)
        return replace(host, **changes, setting_sources=sources)

    def refuse(self, keyword: str, raw: str, problem: str) -> InputError:
        return InputError(f"{self.config.where(keyword, raw)}: ssh_config: host {self.original.name}: "
                          f"{literal(problem)}", host=self.original.name, step="inventory", hint=_HINT)

    def identity(self, host: Host, options: dict) -> tuple[str, str] | None:
        """The first IdentityFile that exists, its tokens expanded as ssh does (ssh skips a missing one), and the
        value as written; None when none exists."""
        local, home = socket.gethostname(), pwd.getpwuid(os.getuid()).pw_dir   # ssh's home: the password file's
        tokens = {"d": home, "h": host.address, "i": str(os.getuid()),
                  "k": options.get("hostkeyalias", self.original.address), "L": local.split(".")[0], "l": local,
                  "n": self.original.address, "p": str(host.port), "r": host.user,
                  "u": pwd.getpwuid(os.getuid()).pw_name}
        for raw in options["identityfile"]:
            name = _expand(raw, tokens, "IdentityFile", self.config.where("identityfile", raw), environment=True)
            if name == "~" or name.startswith("~/"):
                name = home + name[1:]
            elif name.startswith("~"):
                name = os.path.expanduser(name)   # ~user/...
            if Path(name).is_file():
                return name, raw
        return None

    def jump(self, host: Host, raw: str) -> str:
        """ProxyJump as the inventory writes a jump: an inventory host's name, or `user@address:port`."""
        where, name = self.config.where("proxyjump", raw), self.original.name

        def refuse(problem: str, hint: str = _HINT) -> InputError:
            return InputError(f"{where}: ssh_config: host {name}: {literal(problem)}", host=name, step="inventory",
                              hint=hint)

        value = _expand(raw, {"h": host.address, "n": self.original.address, "p": str(host.port), "r": host.user},
                        "ProxyJump", where)
        if "," in value:
            raise refuse(f"ProxyJump {value!r} has more than one hop, and gpuprov connects through one jump host",
                         "jump through one host that reaches this one, or set the host's jump in the inventory")
        hop = _HOP.fullmatch(value)
        if hop is None:
            raise refuse(f"bad ProxyJump {value!r}: expected [user@]host[:port]")
        user, target, port = hop.group("user"), hop.group("host").strip("[]"), hop.group("port")
        known = self.inventory.hosts.get(target)
        if known is not None:
            if (user and user != known.user) or (port and port != str(known.port)):
                raise refuse(f"ProxyJump {value!r} names the inventory host {target!r} with another user or port",
                             f"write ProxyJump {target}: gpuprov logs in to an inventory host with its settings")
            return target
        if user is not None and not USER.fullmatch(user):
            raise refuse(f"ProxyJump {value!r}: bad user {user!r}")
        try:
            settings = {"user": user or "root", "port": parse_port(port) if port else 22}
        except ValueError as exc:
            raise refuse(f"ProxyJump {value!r}: {exc}") from None
        given = {key: "ProxyJump" for key, text in (("user", user), ("port", port)) if text}
        resolved = _Resolver(self.config, self.inventory,
                             Host(name=target, address=target, setting_sources=given, **settings)).host()
        if not is_valid_address(resolved.address):
            raise refuse(f"ProxyJump {value!r}: {resolved.address!r} is not an IP address or a host name")
        if resolved.jump is not None:
            raise refuse(f"jump chain {name} -> {target} -> {resolved.jump}: gpuprov connects through one jump host, "
                         "never skipping a hop", f"give {target} ProxyJump none if gpuprov can reach it directly")
        if resolved.identity_file not in (None, host.identity_file):
            raise refuse(f"the jump host {target!r} logs in with {resolved.identity_file} and {name} with "
                         f"{host.identity_file or 'no key file'}: gpuprov logs in to a jump host outside the "
                         "inventory with its target's key",
                         f"add {target} to the inventory, so that it logs in with its own key")
        address = f"[{resolved.address}]" if ":" in resolved.address else resolved.address
        return f"{resolved.user}@{address}:{resolved.port}"


_SETTING = {"user": "user", "port": "port", "hostname": "address", "proxyjump": "jump"}


def _expand(value: str, tokens: dict[str, str], keyword: str, where: str, environment: bool = False) -> str:
    """`%x` tokens (and `${VAR}` where `environment`) as ssh expands them; InputError for one it does not know."""

    def one(found: re.Match) -> str:
        if found.group(2) is not None and environment:
            if found.group(2) not in os.environ:
                raise InputError(f"{where}: ssh_config: {keyword}: ${{{found.group(2)}}} is not set",
                                 step="inventory", hint="set the variable, or write the path without it")
            return os.environ[found.group(2)]
        if found.group(2) is not None:
            return found.group(0)
        letter = found.group(1)
        if letter == "%":
            return "%"
        if letter not in tokens:
            raise InputError(f"{where}: ssh_config: {keyword}: the token %{letter} is not one gpuprov expands in "
                             f"{keyword} ({', '.join('%' + t for t in sorted(tokens))}, %%)", step="inventory",
                             hint=_HINT)
        return tokens[letter]

    return _TOKEN.sub(one, value)


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _shown(path: Path) -> str:
    """The path as people write it: `~/.ssh/config` for one under the home folder."""
    home = os.path.expanduser("~")
    text = str(path)
    return literal("~" + text[len(home):] if home != "/" and (text == home or text.startswith(home + "/")) else text)
