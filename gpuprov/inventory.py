"""Load and validate YAML inventories (native and Ansible), select hosts, merge variables.

Native shape::

    known_hosts: PATH      (optional: this fleet's known_hosts file)
    defaults: {port, user, identity_file, jump, sudo, address, vars}
    groups:   {NAME: {vars, children: [NAME, ...], port, user, identity_file, jump, sudo}}
    hosts:    {NAME: {address, port, user, identity_file, jump, sudo, groups: [NAME, ...], vars}}

An Ansible YAML inventory (top-level ``all:``) loads as it is: its groups become groups, ``all.vars``
becomes the defaults, ``ansible_host``/``ansible_port``/``ansible_user``/``ansible_ssh_private_key_file``
become connection settings (``gpuprov_jump`` and ``gpuprov_sudo`` give the other two), every other
``ansible_*`` key is dropped, and passwords (``ansible_become_password`` and friends) are never read.

Precedence, lowest first: defaults, then the host's groups, then the host. The groups apply in the order
the host lists them, each one preceded by its ancestors (parents before children, a group applies once),
so a later group wins over an earlier one and a child always wins over its parents. Settings and
variables merge by top-level key: a level that sets ``stack`` replaces the whole ``stack`` mapping.

Paths (known_hosts, identity_file, mirror key_file and ca_file) expand `~`; relative paths are relative to
the inventory's folder. identity_file and ca_file must exist.

Every problem found is collected, each as ``FILE:LINE:COL: key path: message``, and raised together as
one ``InventoryError``.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpuprov.errors import InputError

TOP_KEYS = ("hosts", "groups", "defaults", "known_hosts")
SETTING_KEYS = ("address", "port", "user", "identity_file", "jump", "sudo")
HOST_KEYS = (*SETTING_KEYS, "groups", "vars")
DEFAULT_KEYS = (*SETTING_KEYS, "vars")
GROUP_KEYS = ("vars", "children", "port", "user", "identity_file", "jump", "sudo")
SUDO_KEYS = ("password_env", "nopasswd")
ANSIBLE_GROUP_KEYS = ("hosts", "children", "vars")
ANSIBLE_SETTINGS = {
    "ansible_host": "address",
    "ansible_port": "port",
    "ansible_user": "user",
    "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "identity_file",
    "ansible_private_key_file": "identity_file",
    "gpuprov_jump": "jump",
    "gpuprov_sudo": "sudo",
}
ANSIBLE_SECRETS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass",
                   "ansible_password", "ansible_ssh_pass", "ansible_ssh_password")
KNOWN_VARS = ("hardware", "stack", "mirror", "firewall", "container_engine")
CONTAINER_ENGINES = ("docker",)

MAX_DEPTH = 64
MAX_NODES = 100_000

_HOSTNAME_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_HOST_NAME = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,252}")
_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEX40 = re.compile(r"[0-9A-Fa-f]{40}")
_COLLECTION_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "omap", "pairs", "set")}
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BAD = object()


class InventoryError(InputError):
    """An inventory that cannot be used; `.errors` holds every problem as `FILE:LINE:COL: key: message`."""

    def __init__(self, path: str | Path, errors: list[str]):
        self.errors = list(errors)
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        super().__init__(f"{path}: {count}:\n  " + "\n  ".join(self.errors),
                         step="inventory",
                         hint=f"fix the inventory, then run: invoke inventory.check --inventory {path}")


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
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
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
            raise InputError(f"unknown host {name!r} in {self.path}{_suggest(name, self.hosts)}",
                             step="inventory",
                             hint=f"list them with: invoke inventory.check --inventory {self.path}")
        return self.hosts[name]

    def select(self, hosts: list[str], groups: list[str], all_: bool) -> list[Host]:
        """Hosts named, plus hosts in the groups named, or every host; in inventory order."""
        problems = [f"unknown host {n!r}{_suggest(n, self.hosts)}" for n in hosts if n not in self.hosts]
        problems += [f"unknown group {n!r}{_suggest(n, self.groups)}" for n in groups if n not in self.groups]
        if problems:
            raise InputError(f"{'; '.join(problems)} in {self.path}", step="select hosts",
                             hint=f"list them with: invoke inventory.check --inventory {self.path}")
        if all_:
            return list(self.hosts.values())
        if not hosts and not groups:
            raise InputError("no hosts selected", step="select hosts", hint="give --host, --group or --all")
        wanted = set(hosts)
        for name in groups:
            wanted.update(self.groups[name].hosts)
        if not wanted:
            raise InputError(f"group {', '.join(groups)} has no hosts in {self.path}", step="select hosts",
                             hint="give --host, --group or --all")
        return [h for name, h in self.hosts.items() if name in wanted]

    def jump_host(self, host: Host) -> Host | None:
        """The host to jump through: an inventory host, or one parsed from `user@address[:port]`.

        A jump host given as `user@address:port` uses the target host's identity file.
        """
        if host.jump is None:
            return None
        if host.jump in self.hosts:
            return self.hosts[host.jump]
        user, address, port = parse_jump(host.jump)
        return Host(name=host.jump, address=address, port=port, user=user, identity_file=host.identity_file)


def parse_jump(text: str) -> tuple[str, str, int]:
    """`user@address[:port]` (IPv6: `user@[addr]:port`) -> (user, address, port); ValueError if bad."""
    user, sep, rest = text.partition("@")
    if not sep or not rest:
        raise ValueError("expected user@address[:port] or the name of an inventory host")
    if not _USER.fullmatch(user):
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
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"bad port {port_text!r} in jump host")
        port = int(port_text)
    if not is_valid_address(address):
        raise ValueError(f"bad address {address!r} in jump host")
    return user, address, port


def is_valid_address(text: str) -> bool:
    """An IP address or an RFC 1123 host name (no spaces, no shell metacharacters)."""
    if not isinstance(text, str) or not text or len(text) > 253:
        return False
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    # an all-numeric last label is a mistyped IP address (10.0.0.256), not a host name (RFC 3696 2)
    return all(_HOSTNAME_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


def load_inventory(path: str | Path) -> Inventory:
    """Load and validate an inventory file; InputError if it is missing, InventoryError if it is bad."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"inventory {path} not found", step="inventory",
                         hint="give --inventory PATH or set gpuprov.inventory in invoke.yaml "
                              "(inventories/example.yaml shows the format)")
    if not path.is_file():
        raise InputError(f"inventory {path} is not a file", step="inventory", hint="give --inventory PATH")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read inventory {path}: {exc.strerror}", step="inventory",
                         hint="check the file's permissions") from None
    return _Reader(path).read(data)


def _suggest(word: Any, choices) -> str:
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type(value: Any) -> str:
    return {dict: "a mapping", list: "a list", bool: "a boolean", type(None): "empty (null)"}.get(
        type(value), type(value).__name__)


@dataclass
class _Level:
    """One place settings and variables come from: the defaults, a group or a host."""

    source: str
    path: tuple
    settings: dict = field(default_factory=dict)  # key -> (value, path)
    vars: dict = field(default_factory=dict)  # key -> (value, path)
    links: list = field(default_factory=list)  # a group's children or a host's groups: (name, path)


class _Reader:
    """Turns inventory bytes into an Inventory, collecting every error with its place in the file."""

    def __init__(self, path: Path):
        self.path = path
        self.base = path.parent.absolute()
        self.errors: list[tuple[int, int, str]] = []
        self.seen_errors: set[str] = set()
        self.warnings: list[str] = []
        self.marks: dict[tuple, tuple[int, int]] = {}
        self.key_marks: dict[tuple, tuple[int, int]] = {}
        self.raw: dict[tuple, str] = {}
        self.tagged: dict[tuple, str] = {}
        self.dropped: list[tuple] = []
        self.nodes = 0
        self.active: set[int] = set()
        self.ctor = yaml.SafeLoader("")
        self.defaults = _Level("defaults", ("defaults",))
        self.groups: dict[str, _Level] = {}
        self.hosts: dict[str, _Level] = {}
        self.known_hosts: Path | None = None

    # ---------- errors and places ----------

    def error(self, path: tuple, message: str, *, at_key: bool = False) -> None:
        line, col = self.place(path, at_key)
        text = f"{self.path}:{line}:{col}: {self.keypath(path)}: {message}"
        if text not in self.seen_errors:
            self.seen_errors.add(text)
            self.errors.append((line, col, text))

    def place(self, path: tuple, at_key: bool = False) -> tuple[int, int]:
        if at_key and path in self.key_marks:
            return self.key_marks[path]
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return (1, 1)

    @staticmethod
    def keypath(path: tuple) -> str:
        text = ""
        for part in path:
            text += f"[{part}]" if isinstance(part, int) and not isinstance(part, bool) else f".{part}"
        return text.lstrip(".") or "(top level)"

    def fail(self, line: int, col: int, message: str) -> InventoryError:
        return InventoryError(self.path, [f"{self.path}:{line}:{col}: (file): {message}"])

    # ---------- YAML -> data with marks ----------

    def read(self, data: bytes) -> Inventory:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data[:exc.start].count(b"\n") + 1
            col = exc.start - data.rfind(b"\n", 0, exc.start)
            raise self.fail(line, col, "not UTF-8 text (save the inventory as UTF-8)") from None
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            problem = " ".join(p for p in (exc.context, exc.problem) if p) or "bad YAML"
            raise self.fail(line, col, f"YAML syntax error: {problem}") from None
        except yaml.reader.ReaderError as exc:
            line = text[:exc.position].count("\n") + 1
            col = exc.position - text.rfind("\n", 0, exc.position)
            raise self.fail(line, col, f"character {exc.character!r} is not allowed in YAML") from None
        except yaml.YAMLError as exc:
            raise self.fail(1, 1, f"YAML error: {exc}") from None
        except RecursionError:
            raise self.fail(1, 1, "the YAML is nested too deeply") from None
        if root is None:
            raise self.fail(1, 1, "the file is empty; an inventory needs a hosts: mapping "
                                  "(inventories/example.yaml shows the format)")
        doc = self.construct(root, (), 0)
        if not isinstance(doc, dict):
            self.error((), f"the top level must be a mapping with hosts:, groups:, defaults: "
                           f"(or an Ansible inventory with all:), not {_type(doc)}")
            return self.finish("native")
        fmt = "ansible" if "all" in doc else "native"
        if fmt == "ansible":
            self.read_ansible(doc)
        else:
            self.read_native(doc)
        return self.finish(fmt)

    def construct(self, node: yaml.Node, path: tuple, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            if self.nodes == MAX_NODES + 1:
                self.error(path, f"more than {MAX_NODES} YAML values (an alias expanding too far?)")
            return None
        if depth > MAX_DEPTH or id(node) in self.active:
            why = "nested too deeply" if depth > MAX_DEPTH else "an alias refers to itself"
            self.error(path, f"cannot read this value: {why}")
            return None
        self.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        if node.tag not in _COLLECTION_TAGS:
            self.tagged.setdefault(path, node.tag)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.construct(item, (*path, i), depth + 1) for i, item in enumerate(node.value)]
            return self.mapping(node, path, depth)
        finally:
            self.active.discard(id(node))

    def scalar(self, node: yaml.ScalarNode, path: tuple) -> Any:
        if node.tag not in yaml.SafeLoader.yaml_constructors:
            self.tagged.setdefault(path, node.tag)
            return node.value
        if node.style is None:
            self.raw.setdefault(path, node.value)
        try:
            return self.ctor.construct_object(node)
        except Exception as exc:  # noqa: BLE001 - any constructor failure is a bad value in the file
            self.error(path, f"cannot read value {_show(node.value)}: {str(exc).splitlines()[0]}")
            return None

    def mapping(self, node: yaml.MappingNode, path: tuple, depth: int) -> dict:
        result: dict = {}
        seen: dict = {}
        merges = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.extend(value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node])
                continue
            key_mark = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if not isinstance(key_node, yaml.ScalarNode):
                self.marks.setdefault(path, key_mark)
                self.error(path, f"a mapping key at line {key_mark[0]} must be a plain value, "
                                 f"not a {'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}")
                continue
            key = self.scalar(key_node, (*path, "(key)"))
            kpath = (*path, key)
            if key in seen:
                what = "host" if path[-1:] == ("hosts",) else "key"
                self.key_marks[kpath] = key_mark
                self.error(kpath, f"duplicate {what} {str(key)!r} (first at line {seen[key][0]})",
                           at_key=True)
                continue
            seen[key] = key_mark
            self.key_marks[kpath] = key_mark
            result[key] = self.construct(value_node, kpath, depth + 1)
        for source in merges:  # explicit keys win; among merged mappings the first one wins
            value = self.construct(source, path, depth + 1)
            if not isinstance(value, dict):
                self.error(path, "a merge key (<<) needs a mapping or a list of mappings")
                continue
            for k, v in value.items():
                result.setdefault(k, v)
        return result

    # ---------- native inventories ----------

    def known_keys(self, mapping: dict, path: tuple, allowed: tuple, what: str) -> None:
        for key in mapping:
            if key in allowed:
                continue
            if what == "sudo" and key == "password":
                message = ("the sudo password is never stored in an inventory: put it in an environment "
                           "variable and name it with password_env")
            elif what == "defaults" and key == "groups":
                message = "defaults cannot list groups: list them on each host, or use a group's children"
            else:
                message = (f"unknown {what} key {str(key)!r}{_suggest(key, allowed)}; "
                           f"expected one of: {', '.join(allowed)}")
            self.error((*path, key), message, at_key=True)

    def as_mapping(self, value: Any, path: tuple, what: str) -> dict | None:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"{what} must be a mapping, not {_type(value)}")
            return None
        return value

    def level(self, source: str, body: Any, path: tuple, allowed: tuple, what: str) -> _Level:
        level = _Level(source, path)
        body = self.as_mapping(body, path, what)
        if not body:
            return level
        self.known_keys(body, path, allowed, what)
        for key, value in body.items():
            kpath = (*path, key)
            if key == "vars":
                level.vars.update(self.var_mapping(value, kpath))
            elif key in ("children", "groups") and key in allowed:
                level.links = self.name_list(value, kpath)
            elif key in SETTING_KEYS and key in allowed:
                level.settings[key] = (value, kpath)
        return level

    def var_mapping(self, value: Any, path: tuple) -> dict:
        mapping = self.as_mapping(value, path, "vars")
        out = {}
        for key, item in (mapping or {}).items():
            if not isinstance(key, str):
                self.error((*path, key), f"variable names must be strings, not {_type(key)}", at_key=True)
            else:
                out[key] = (item, (*path, key))
        return out

    def name_list(self, value: Any, path: tuple) -> list:
        if value is None:
            return []
        if not isinstance(value, list):
            self.error(path, f"must be a list of group names, not {_type(value)}")
            return []
        names = []
        for i, name in enumerate(value):
            if isinstance(name, str) and name:
                names.append((name, (*path, i)))
            else:
                self.error((*path, i), f"a group name must be a string, not {_type(name)}")
        return names

    def read_native(self, doc: dict) -> None:
        self.known_keys(doc, (), TOP_KEYS, "top-level")
        if "known_hosts" in doc:
            known_hosts = self.local_path(doc["known_hosts"], ("known_hosts",), "known_hosts", must_exist=False)
            self.known_hosts = Path(known_hosts) if known_hosts else None
        self.defaults = self.level("defaults", doc.get("defaults"), ("defaults",), DEFAULT_KEYS, "defaults")
        for name, body in (self.as_mapping(doc.get("groups"), ("groups",), "groups") or {}).items():
            if self.check_group_name(name, ("groups", name)):
                self.groups[name] = self.level(f"group:{name}", body, ("groups", name), GROUP_KEYS, "group")
        hosts = self.as_mapping(doc.get("hosts"), ("hosts",), "hosts")
        if hosts is not None and not hosts:
            self.error(("hosts",) if "hosts" in doc else (), "no hosts: add a hosts: mapping of host names")
        for name, body in (hosts or {}).items():
            if self.check_host_name(name, ("hosts", name)):
                self.hosts[name] = self.level("host", body, ("hosts", name), HOST_KEYS, "host")

    def check_host_name(self, name: Any, path: tuple) -> bool:
        if isinstance(name, str) and _HOST_NAME.fullmatch(name):
            return True
        hint = ("; host ranges like [01:04] are not expanded, list each host"
                if isinstance(name, str) and re.search(r"\[[^\]]*:[^\]]*\]", name) else "")
        self.error(path, f"bad host name {_show(name)}: use letters, digits, '.', '_', ':' and '-'{hint}",
                   at_key=True)
        return False

    def check_group_name(self, name: Any, path: tuple) -> bool:
        if isinstance(name, str) and _GROUP_NAME.fullmatch(name):
            return True
        self.error(path, f"bad group name {_show(name)}: use letters, digits, '.', '_' and '-'", at_key=True)
        return False

    # ---------- Ansible inventories ----------

    def read_ansible(self, doc: dict) -> None:
        self.defaults = _Level("defaults", ("all",))
        for name, body in doc.items():
            if name == "all":
                self.ansible_group(None, body, ("all",), None)
            elif self.check_group_name(name, (name,)):
                self.ansible_group(name, body, (name,), None)
        if not self.hosts and not self.errors:
            self.error(("all",), "no hosts: add hosts: under all: or one of its children")

    def ansible_group(self, name: str | None, body: Any, path: tuple, parent: str | None) -> None:
        level = self.defaults if name is None else self.groups.setdefault(name, _Level(f"group:{name}", path))
        if parent is not None and all(name != n for n, _ in self.groups[parent].links):
            self.groups[parent].links.append((name, path))
        body = self.as_mapping(body, path, "an Ansible group")
        if not body:
            return
        self.known_keys(body, path, ANSIBLE_GROUP_KEYS, "Ansible group")
        self.ansible_vars(body.get("vars"), (*path, "vars"), level)
        hosts = self.as_mapping(body.get("hosts"), (*path, "hosts"), "hosts") or {}
        for host, host_vars in hosts.items():
            hpath = (*path, "hosts", host)
            if not self.check_host_name(host, hpath):
                continue
            hlevel = self.hosts.setdefault(host, _Level("host", hpath))
            if name is not None and all(name != n for n, _ in hlevel.links):
                hlevel.links.append((name, hpath))
            self.ansible_vars(host_vars, hpath, hlevel)
        children = self.as_mapping(body.get("children"), (*path, "children"), "children") or {}
        for child, child_body in children.items():
            cpath = (*path, "children", child)
            if self.check_group_name(child, cpath):
                self.groups.setdefault(child, _Level(f"group:{child}", cpath))
                self.ansible_group(child, child_body, cpath, name)

    def ansible_vars(self, value: Any, path: tuple, level: _Level) -> None:
        for key, (item, kpath) in self.var_mapping(value, path).items():
            if key in ANSIBLE_SETTINGS:
                if key == "ansible_port" and isinstance(item, str) and item.isdigit():
                    item = int(item)
                level.settings[ANSIBLE_SETTINGS[key]] = (item, kpath)
            elif key.startswith("ansible_"):
                self.dropped.append(kpath)
                if key in ANSIBLE_SECRETS:
                    line, col = self.place(kpath, True)
                    self.warnings.append(
                        f"{self.path}:{line}:{col}: {self.keypath(kpath)}: not read (secrets never come from "
                        "a file); set gpuprov_sudo: {password_env: NAME} and export the password in NAME")
            else:
                level.vars[key] = (item, kpath)

    # ---------- validation and merging ----------

    def finish(self, fmt: str) -> Inventory:
        levels = [self.defaults, *self.groups.values(), *self.hosts.values()]
        for level in levels:
            level.settings = self.check_settings(level)
            level.vars = {k: (self.check_var(k, v, p), p) for k, (v, p) in level.vars.items()}
            level.vars = {k: vp for k, vp in level.vars.items() if vp[0] is not _BAD}
        for tpath, tag in self.tagged.items():
            if not any(tpath[:len(d)] == d for d in self.dropped):
                self.error(tpath, f"unsupported YAML tag {tag!r}: gpuprov reads plain values only "
                                  "(no encrypted or custom-tagged values)")
        parents = self.check_groups()
        hosts = {name: self.merge_host(name, level, parents) for name, level in self.hosts.items()}
        self.check_jumps(hosts)
        if self.errors:
            self.errors.sort(key=lambda e: (e[0], e[1]))
            raise InventoryError(self.path, [e[2] for e in self.errors])
        groups = {
            name: Group(name=name, vars={k: v for k, (v, _) in level.vars.items()},
                        children=tuple(n for n, _ in level.links), parents=tuple(parents[name]),
                        hosts=tuple(h.name for h in hosts.values() if name in h.groups))
            for name, level in self.groups.items()
        }
        return Inventory(path=self.path, hosts=hosts, groups=groups, format=fmt, warnings=self.warnings,
                         known_hosts=self.known_hosts)

    def check_settings(self, level: _Level) -> dict:
        out = {}
        for key, (value, path) in level.settings.items():
            checked = getattr(self, f"setting_{key}")(value, path)
            if checked is not _BAD:
                out[key] = (checked, path)
        return out

    def setting_address(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and is_valid_address(value):
            return value
        self.error(path, f"bad address {_show(value)}: give a host name (RFC 1123) or an IP address")
        return _BAD

    def setting_port(self, value: Any, path: tuple) -> Any:
        return self.port_number(value, path)

    def setting_user(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and _USER.fullmatch(value):
            return value
        self.error(path, f"bad user {_show(value)}: letters, digits, '_', '.', '-' (up to 32, not starting "
                         "with a digit or '-')")
        return _BAD

    def setting_identity_file(self, value: Any, path: tuple) -> Any:
        if value is None:
            return None
        resolved = self.local_path(value, path, "identity file", must_exist=True)
        return _BAD if resolved is None else resolved

    def setting_jump(self, value: Any, path: tuple) -> Any:
        if value is None or (isinstance(value, str) and value in self.hosts):
            return value
        if not isinstance(value, str):
            self.error(path, f"jump must be a host name or user@address[:port], not {_type(value)}")
            return _BAD
        if "@" not in value:
            self.error(path, f"unknown jump host {value!r}{_suggest(value, self.hosts)}: name an inventory "
                             "host or give user@address[:port]")
            return _BAD
        try:
            parse_jump(value)
        except ValueError as exc:
            self.error(path, f"bad jump {_show(value)}: {exc}")
            return _BAD
        return value

    def setting_sudo(self, value: Any, path: tuple) -> Any:
        body = self.as_mapping(value, path, "sudo")
        if body is None:
            return _BAD
        self.known_keys(body, path, SUDO_KEYS, "sudo")
        env = body.get("password_env")
        nopasswd = body.get("nopasswd", False)
        ok = True
        if env is not None and not (isinstance(env, str) and _ENV_NAME.fullmatch(env)):
            self.error((*path, "password_env"), f"bad environment variable name {_show(env)}")
            ok = False
        if not isinstance(nopasswd, bool):
            self.error((*path, "nopasswd"), f"nopasswd must be true or false, not {_show(nopasswd)}")
            ok = False
        elif nopasswd and env is not None:
            self.error(path, "give either password_env or nopasswd: true, not both")
            ok = False
        return {"password_env": env, "nopasswd": nopasswd} if ok else _BAD

    def local_path(self, value: Any, path: tuple, what: str, must_exist: bool) -> str | None:
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            self.error(path, f"{what} must be a path, not {_show(value)}")
            return None
        resolved = Path(os.path.expanduser(value))
        if not resolved.is_absolute():
            resolved = Path(os.path.normpath(self.base / resolved))
        if must_exist and not resolved.is_file():
            self.error(path, f"{what} {resolved} not found (relative paths are relative to the "
                             f"inventory's folder {self.base})")
            return None
        return str(resolved)

    # ---------- validated variables ----------

    def check_var(self, key: str, value: Any, path: tuple) -> Any:
        checker = {"hardware": self.var_hardware, "stack": self.var_stack,
                   "mirror": self.var_mirror, "firewall": self.var_firewall,
                   "container_engine": self.var_container_engine}.get(key)
        return checker(value, path) if checker else value

    def struct(self, value: Any, path: tuple, what: str, fields: dict, required: tuple = ()) -> Any:
        body = self.as_mapping(value, path, what)
        if body is None:
            return _BAD
        self.known_keys(body, path, tuple(fields), what)
        out, ok = {}, True
        for key in required:
            if key not in body:
                self.error(path, f"{what} needs {key}")
                ok = False
        for key, item in body.items():
            if key in fields:
                checked = fields[key](item, (*path, key))
                ok = ok and checked is not _BAD
                out[key] = checked
        return out if ok else _BAD

    def var_hardware(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "hardware", {
            "gpu": self.non_empty_string, "count": self.positive_int, "nvswitch": self.boolean})

    def var_stack(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "stack", {
            "cuda": self.version(r"\d+\.\d+", '"12.8"'),
            "driver": self.version(r"[1-9]\d{2}", '"570" (a driver branch)'),
            "pytorch": self.version(r"\d+\.\d+", '"2.7"'),
            "ngc": self.version(r"\d{2}\.(0[1-9]|1[0-2])", '"25.04" (YY.MM)'),
            "nccl": self.version(r"\d+\.\d+(\.\d+)?", '"2.26" or "2.26.5"'),
            "forward_compat": self.boolean,
        })

    def var_mirror(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "mirror", {
            "url": self.url, "proxy": self.url, "fingerprint": self.fingerprint,
            "key_file": lambda v, p: self.local_path(v, p, "key_file", must_exist=False) or _BAD,
            "ca_file": lambda v, p: self.local_path(v, p, "ca_file", must_exist=True) or _BAD,
            "label": self.release_label,
        }, required=("url",))

    def release_label(self, value: Any, path: tuple) -> Any:
        """The mirror's Release `Label:` (apt pins the repository by it)."""
        from gpuprov.ops.repo import RELEASE_LABEL

        if isinstance(value, str) and RELEASE_LABEL.fullmatch(value):
            return value
        self.error(path, f"bad label {_show(value)}: the Label: line of the mirror's Release file, letters, "
                         "digits, spaces and ._+:~/- only (NVIDIA's is \"NVIDIA CUDA\")")
        return _BAD

    def var_firewall(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "firewall", {"allow": self.allow_list}, required=("allow",))

    def var_container_engine(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and value in CONTAINER_ENGINES:
            return value
        self.error(path, f"bad container_engine {_show(value)}: give {' or '.join(CONTAINER_ENGINES)}"
                         f"{_suggest(value, CONTAINER_ENGINES)}")
        return _BAD

    def allow_list(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, list):
            self.error(path, f"allow must be a list of rules ({{port, proto, sources}}), not {_type(value)}")
            return _BAD
        rules = []
        for i, item in enumerate(value):
            rule = self.struct(item, (*path, i), "firewall rule", {
                "port": self.port_number, "proto": self.proto, "sources": self.cidrs},
                required=("port", "sources"))
            if rule is not _BAD:
                rules.append({"port": rule["port"], "proto": rule.get("proto", "tcp"),
                              "sources": rule["sources"]})
        return rules if len(rules) == len(value) else _BAD

    def non_empty_string(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and value.strip():
            return value
        self.error(path, f"expected a non-empty string, not {_show(value)}")
        return _BAD

    def positive_int(self, value: Any, path: tuple) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        self.error(path, f"expected an integer >= 1, not {_show(value)}")
        return _BAD

    def port_number(self, value: Any, path: tuple) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
            return value
        self.error(path, f"bad port {_show(value)}: give an integer from 1 to 65535")
        return _BAD

    def boolean(self, value: Any, path: tuple) -> Any:
        if isinstance(value, bool):
            return value
        self.error(path, f"expected true or false, not {_show(value)}")
        return _BAD

    def proto(self, value: Any, path: tuple) -> Any:
        if value in ("tcp", "udp"):
            return value
        self.error(path, f"bad proto {_show(value)}: give tcp or udp{_suggest(value, ('tcp', 'udp'))}")
        return _BAD

    def version(self, pattern: str, example: str):
        def check(value: Any, path: tuple) -> Any:
            text = None
            if isinstance(value, str):
                text = value
            elif isinstance(value, int | float) and not isinstance(value, bool):
                text = self.raw.get(path, str(value))
            if text is not None and re.fullmatch(pattern, text):
                return text
            self.error(path, f"bad version {_show(value)}: expected a string like {example}")
            return _BAD
        return check

    def url(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and not re.search(r"[\s\"'`\\<>]", value):
            try:
                parts = urlsplit(value)
                parts.port  # noqa: B018 - raises ValueError for a bad port
                host = parts.hostname if parts.netloc else None
            except ValueError:  # a bad port, or a bad IPv6 literal ("http://[fe80::1/")
                parts, host = urlsplit(""), None
            if parts.scheme in ("http", "https") and host and is_valid_address(host):
                return value
        self.error(path, f"bad URL {_show(value)}: give an http:// or https:// URL with a host name")
        return _BAD

    def fingerprint(self, value: Any, path: tuple) -> Any:
        text = value.replace(" ", "") if isinstance(value, str) else None
        if text and _HEX40.fullmatch(text):
            return text.upper()
        self.error(path, f"bad fingerprint {_show(value)}: give the key's 40 hex digits")
        return _BAD

    def cidrs(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, list) or not value:
            self.error(path, f"sources must be a non-empty list of CIDRs like 10.0.0.0/8, not {_show(value)}")
            return _BAD
        out, ok = [], True
        for i, item in enumerate(value):
            try:
                out.append(str(ipaddress.ip_network(item)))
                continue
            except (ValueError, TypeError):
                pass
            try:
                hint = f" (host bits set; did you mean {ipaddress.ip_network(item, strict=False)}?)"
            except (ValueError, TypeError):
                hint = ""
            self.error((*path, i), f"bad CIDR {_show(item)}{hint}")
            ok = False
        return out if ok else _BAD

    # ---------- groups, hosts, jumps ----------

    def check_groups(self) -> dict[str, list[str]]:
        parents: dict[str, list[str]] = {name: [] for name in self.groups}
        for name, level in self.groups.items():
            for child, cpath in level.links:
                if child in self.groups:
                    parents[child].append(name)
                else:
                    self.error(cpath, f"unknown group {child!r}{_suggest(child, self.groups)}")
        state: dict[str, int] = {}
        reported: set[frozenset] = set()

        def visit(name: str, stack: list[str]) -> None:
            state[name] = 1
            stack.append(name)
            for child, cpath in self.groups[name].links:
                if child not in self.groups:
                    continue
                if state.get(child) == 1:
                    cycle = [*stack[stack.index(child):], child]
                    if frozenset(cycle) not in reported:
                        reported.add(frozenset(cycle))
                        self.error(cpath, f"group cycle: {' -> '.join(cycle)}")
                elif child not in state:
                    visit(child, stack)
            stack.pop()
            state[name] = 2

        for name in self.groups:
            if name not in state:
                visit(name, [])
        return parents

    def group_order(self, listed: list[str], parents: dict[str, list[str]]) -> list[str]:
        order: list[str] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if name in order or name in visiting:
                return
            visiting.add(name)
            for parent in parents[name]:
                visit(parent)
            order.append(name)

        for name in listed:
            visit(name)
        return order

    def merge_host(self, name: str, level: _Level, parents: dict[str, list[str]]) -> Host:
        listed = []
        for group, gpath in level.links:
            if group in self.groups:
                listed.append(group)
            else:
                self.error(gpath, f"unknown group {group!r}{_suggest(group, self.groups)}")
        order = self.group_order(listed, parents)
        settings: dict = {}
        setting_sources: dict = {}
        variables: dict = {}
        sources: dict = {}
        for lvl in [self.defaults, *(self.groups[g] for g in order), level]:
            for key, (value, _) in lvl.settings.items():
                settings[key] = value
                setting_sources[key] = lvl.source
            for key, (value, _) in lvl.vars.items():
                variables[key] = value
                sources[key] = lvl.source
        if "address" not in settings:
            if not is_valid_address(name):
                self.error(level.path, f"host {name!r} has no address and its name is not a host name or "
                                       "IP address: give address:", at_key=True)
            settings["address"] = name
            setting_sources["address"] = "host name"
        sudo = settings.pop("sudo", None) or {}
        return Host(name=name, groups=tuple(order), vars=variables, sources=sources,
                    setting_sources=setting_sources, sudo_password_env=sudo.get("password_env"),
                    sudo_nopasswd=sudo.get("nopasswd", False), **settings)

    def check_jumps(self, hosts: dict[str, Host]) -> None:
        reported: set[frozenset] = set()
        for name, host in hosts.items():
            chain = [name]
            current = host
            while current.jump in hosts:
                if current.jump in chain:
                    cycle = [*chain[chain.index(current.jump):], current.jump]
                    if frozenset(cycle) not in reported:
                        reported.add(frozenset(cycle))
                        hint = (f"; set jump: null on {name!r}" if len(cycle) == 2 else "")
                        self.error(self.jump_path(hosts[cycle[0]]), f"jump cycle: {' -> '.join(cycle)}{hint}")
                    break
                chain.append(current.jump)
                current = hosts[current.jump]

    def jump_path(self, host: Host) -> tuple:
        """Where the host's jump setting was given (the host, one of its groups, or the defaults)."""
        source = host.setting_sources.get("jump")
        level = {"host": self.hosts[host.name], "defaults": self.defaults}.get(source)
        if level is None and source and source.startswith("group:"):
            level = self.groups.get(source[len("group:"):])
        if level is not None and "jump" in level.settings:
            return level.settings["jump"][1]
        return self.hosts[host.name].path
