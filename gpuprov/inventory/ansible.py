"""Ansible inventories, read as they are: the YAML form (`all:` / `children:` / `hosts:` / `vars:`) and the INI
form once gpuprov.inventory.ini has turned it into the same shape.

Groups become groups and `all.vars` the defaults; a host in no group is in `ungrouped`, as in Ansible. Host keys
are Ansible host patterns (`gpu[01:08]`, `gpu01:2222`). `ansible_host`, `ansible_port`, `ansible_user` and
`ansible_ssh_private_key_file` become connection settings (`gpuprov_jump` and `gpuprov_sudo` give the other two).

`ansible_ssh_common_args` and `ansible_ssh_extra_args` give the jump host when they hold `-o ProxyJump=HOST` or
`-J HOST` (HOST: `[user@]address[:port]` or an inventory host; `ProxyJump=none`: no jump host). A chain of jump hosts,
`ProxyCommand` and two different jump hosts are refused; their other ssh options are not read (a warning names them).
Args without a jump host leave the jump host that applies unchanged. gpuprov runs its steps as root, through sudo
when the user is not root: `ansible_become`, `ansible_become_user: root` and `ansible_become_method: sudo` say the
same and are accepted; another become user or method is refused. `ansible_group_priority` (in the file, as in
Ansible) orders groups of one depth (gpuprov.inventory.merge). Every other `ansible_*` key is dropped, and
passwords (`ansible_become_password` and friends) are never read.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from gpuprov.core.secrets import register
from gpuprov.inventory.diagnostics import show, type_name
from gpuprov.inventory.levels import (
    AnsibleOrder,
    Level,
    Levels,
    as_mapping,
    group_name_ok,
    host_name_ok,
    known_keys,
    var_mapping,
)
from gpuprov.inventory.located import Located
from gpuprov.inventory.model import ascii_digits
from gpuprov.inventory.patterns import MAX_RANGE_HOSTS, PatternError, expand_host_pattern

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
SSH_ARGS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
BECOME = ("ansible_become", "ansible_become_user", "ansible_become_method")
_TRUE = ("true", "yes", "on", "1", "y", "t")
_FALSE = ("false", "no", "off", "0", "n", "f")
_SSH_OPTION = re.compile(r"\s*([A-Za-z]+)\s*(?:=|\s)\s*(.*)", re.DOTALL)
ANSIBLE_SECRETS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass",
                   "ansible_password", "ansible_ssh_pass", "ansible_ssh_password")


def read_ansible(doc: Located, data: dict, no_hosts: str) -> Levels:
    """The levels of an Ansible inventory document (top-level keys are groups, `all` the defaults);
    `no_hosts` is the error for an inventory without hosts."""
    reader = _Reader(doc)
    for name, body in data.items():
        if name == "all":
            reader.group(None, body, ("all",), None)
        elif group_name_ok(doc, name, (name,)):
            reader.group(name, body, (name,), None)
    if not reader.levels.hosts and not doc.errors:
        doc.error(("all",), no_hosts)
    _ungrouped(reader.levels)
    return reader.levels


def _ungrouped(levels: Levels) -> None:
    """Ansible's `ungrouped`: the hosts in no other group (one listed there and in another group leaves it)."""
    for level in levels.hosts.values():
        links = [link for link in level.links if link[0] != "ungrouped"]
        if links:
            level.links[:] = links
        elif not level.links:
            level.links.append(("ungrouped", level.path))
        if level.links[0][0] == "ungrouped":
            levels.groups.setdefault("ungrouped", Level("group:ungrouped", ("ungrouped",)))


def ansible_variables(doc: Located, levels: Levels, value: Any, path: tuple, level: Level) -> None:
    """Read one Ansible `vars` mapping into `level`: connection settings, the jump host of the ssh args, the
    become keys checked, other `ansible_*` keys dropped, the rest variables."""
    for key, (item, kpath) in var_mapping(doc, value, path).items():
        if key in ANSIBLE_SETTINGS:
            if key == "ansible_port" and isinstance(item, str) and ascii_digits(item):
                item = int(item)
            level.settings[ANSIBLE_SETTINGS[key]] = (item, kpath)
        elif key.startswith("ansible_"):
            levels.dropped.append(kpath)
            if key in SSH_ARGS:
                _ssh_args(doc, item, kpath, level)
            elif key in BECOME:
                _become(doc, key, item, kpath)
            elif key == "ansible_group_priority" and level.source.startswith("group:"):
                _priority(doc, levels, level.source[len("group:"):], item, kpath)
            elif key in ANSIBLE_SECRETS:
                register(item if isinstance(item, str) else None)   # never read, but masked wherever it shows
                doc.warn(kpath, "not read (secrets never come from a file); set gpuprov_sudo: "
                                "{password_env: NAME} and export the password in NAME")
        else:
            level.vars[key] = (item, kpath)


def _ssh_args(doc: Located, value: Any, path: tuple, level: Level) -> None:
    """The jump host in ssh arguments (`-o ProxyJump=X`, `-J X`) set on `level`; an error for what gpuprov cannot
    do as ssh would, a warning naming the options it does not read."""
    if value is None:
        return
    if not isinstance(value, str):
        doc.error(path, f"ssh arguments must be text, not {type_name(value)}")
        return
    try:
        words = shlex.split(value)
    except ValueError as exc:
        doc.error(path, f"cannot split the ssh arguments {show(value)}: {exc}")
        return
    jumps: list[str] = []
    ignored: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        flag, attached = word[:2], word[2:]
        if flag in ("-o", "-J") and not attached and index + 1 < len(words):
            index += 1
            attached = words[index]
        if flag == "-J" and attached:
            jumps.append(attached)
        elif flag == "-o" and attached:
            match = _SSH_OPTION.fullmatch(attached)
            name, option = (match.group(1).lower(), match.group(2).strip()) if match else ("", attached)
            if name == "proxyjump":
                jumps.append(option)
            elif name == "proxycommand" and option.lower() != "none":
                doc.error(path, f"ProxyCommand {show(option)} is not read: gpuprov runs no local command to "
                                "connect; give -o ProxyJump=user@host[:port] instead (what `ssh -W %h:%p "
                                "user@host` does), or gpuprov_jump")
                return
            else:
                ignored.append(f"-o {attached}")
        else:
            ignored.append(word)
        index += 1
    if ignored:
        doc.warn(path, f"not read by gpuprov (it connects with its own SSH client): {show(' '.join(ignored))}")
    if not jumps:
        return
    if len(set(jumps)) > 1:
        doc.error(path, f"two jump hosts ({', '.join(show(j) for j in jumps)}): give one")
        return
    jump = jumps[0].removeprefix("ssh://")
    if "," in jump:
        doc.error(path, f"a chain of jump hosts {show(jump)}: gpuprov connects through one jump host; name the "
                        "last one and make it reachable directly")
        return
    level.settings["jump"] = (None if jump.lower() == "none" else jump, path)


def _become(doc: Located, key: str, value: Any, path: tuple) -> None:
    """The become keys: what gpuprov does anyway (sudo to root) is accepted, anything else refused."""
    if key == "ansible_become":
        if not isinstance(value, bool) and str(value).lower() not in (*_TRUE, *_FALSE):
            doc.error(path, f"ansible_become must be true or false, not {show(value)}")
    elif key == "ansible_become_user" and value not in (None, "root"):
        doc.error(path, f"become user {show(value)} is not supported: gpuprov runs its steps as root (through "
                        "sudo when the user is not root); remove it or set it to root")
    elif key == "ansible_become_method" and value not in (None, "sudo"):
        doc.error(path, f"become method {show(value)} is not supported: gpuprov becomes root with sudo only; "
                        "remove it or set it to sudo")


def _priority(doc: Located, levels: Levels, group: str, value: Any, path: tuple) -> None:
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        doc.error(path, f"ansible_group_priority must be an integer, not {show(value)}")
        return
    if levels.ansible is not None:
        levels.ansible.priorities[group] = value


class _Reader:
    def __init__(self, doc: Located):
        self.doc = doc
        self.levels = Levels(defaults=Level("defaults", ("all",)), ansible=AnsibleOrder())
        self.range_hosts_left = MAX_RANGE_HOSTS

    def group(self, name: str | None, body: Any, path: tuple, parent: str | None) -> None:
        """Group `name` (None: `all`, the defaults) with its variables, hosts and children."""
        groups = self.levels.groups
        level = self.levels.defaults if name is None else groups.setdefault(name, Level(f"group:{name}", path))
        if parent is not None and all(name != linked for linked, _ in groups[parent].links):
            groups[parent].links.append((name, path))
        body = as_mapping(self.doc, body, path, "an Ansible group")
        if not body:
            return
        known_keys(self.doc, body, path, ANSIBLE_GROUP_KEYS, "Ansible group")
        self.variables(body.get("vars"), (*path, "vars"), level)
        for pattern, host_vars in (as_mapping(self.doc, body.get("hosts"), (*path, "hosts"), "hosts") or {}).items():
            self.hosts(pattern, host_vars, (*path, "hosts", pattern), name)
        children = as_mapping(self.doc, body.get("children"), (*path, "children"), "children") or {}
        for child, child_body in children.items():
            cpath = (*path, "children", child)
            if group_name_ok(self.doc, child, cpath):
                self.group(child, child_body, cpath, name)

    def hosts(self, pattern: str, host_vars: Any, path: tuple, group: str | None) -> None:
        """The hosts of one host pattern, in `group` (None: no group), each with the pattern's variables."""
        try:
            names, port = expand_host_pattern(pattern, self.range_hosts_left)
        except PatternError as exc:
            self.doc.error(path, str(exc), at_key=True)
            return
        self.range_hosts_left -= len(names) - 1
        for name in names:
            if not host_name_ok(self.doc, name, path, ranges_hint=False):
                continue
            level = self.levels.hosts.setdefault(name, Level("host", path))
            if group is not None and all(group != linked for linked, _ in level.links):
                level.links.append((group, path))
            if port is not None:
                level.settings["port"] = (port, path)
            self.variables(host_vars, path, level)

    def variables(self, value: Any, path: tuple, level: Level) -> None:
        ansible_variables(self.doc, self.levels, value, path, level)
