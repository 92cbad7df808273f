"""Ansible inventories, read as they are: the YAML form (`all:` / `children:` / `hosts:` / `vars:`) and the INI
form once gpuprov.inventory.ini has turned it into the same shape.

Groups become groups and `all.vars` the defaults. Host keys are Ansible host patterns (`gpu[01:08]`,
`gpu01:2222`). `ansible_host`, `ansible_port`, `ansible_user` and `ansible_ssh_private_key_file` become
connection settings (`gpuprov_jump` and `gpuprov_sudo` give the other two); every other `ansible_*` key is
dropped, and passwords (`ansible_become_password` and friends) are never read.
"""

from __future__ import annotations

from typing import Any

from gpuprov.inventory.levels import (
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
    return reader.levels


class _Reader:
    def __init__(self, doc: Located):
        self.doc = doc
        self.levels = Levels(defaults=Level("defaults", ("all",)))
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
        for key, (item, kpath) in var_mapping(self.doc, value, path).items():
            if key in ANSIBLE_SETTINGS:
                if key == "ansible_port" and isinstance(item, str) and ascii_digits(item):
                    item = int(item)
                level.settings[ANSIBLE_SETTINGS[key]] = (item, kpath)
            elif key.startswith("ansible_"):
                self.levels.dropped.append(kpath)
                if key in ANSIBLE_SECRETS:
                    self.doc.warn(kpath, "not read (secrets never come from a file); set gpuprov_sudo: "
                                         "{password_env: NAME} and export the password in NAME")
            else:
                level.vars[key] = (item, kpath)
