"""What a format reader (native, Ansible YAML, Ansible INI) makes of a file: one Level for each place settings
and variables come from (the defaults, each group, each host), plus the shape checks the readers share."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.located import Located

HOST_NAME = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,252}")
# a file name holds 255 bytes (NAME_MAX); a host's lock file is NAME.lock.yaml
MAX_HOST_NAME = 255 - len(".lock.yaml")
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass
class Level:
    """One place settings and variables come from: the defaults, a group or a host."""

    source: str  # "defaults", "group:NAME" or "host"
    path: tuple  # where it is in the file
    settings: dict = field(default_factory=dict)  # key -> (value, path)
    vars: dict = field(default_factory=dict)  # key -> (value, path)
    links: list = field(default_factory=list)  # a group's children or a host's groups: (name, path)


@dataclass
class Levels:
    """Every level a file defines, and the fleet's known_hosts file when it names one."""

    defaults: Level
    groups: dict[str, Level] = field(default_factory=dict)
    hosts: dict[str, Level] = field(default_factory=dict)
    known_hosts: Path | None = None
    dropped: list[tuple] = field(default_factory=list)  # paths of keys gpuprov does not read (most ansible_*)
    ansible: AnsibleOrder | None = None  # an Ansible inventory's precedence (None: gpuprov's, gpuprov.inventory.merge)


@dataclass
class AnsibleOrder:
    """What Ansible's precedence needs beyond the file's levels: the levels of each `group_vars/` and `host_vars/`
    file, in the order Ansible reads them, under "all", the group's name or the host's name; and each group's
    `ansible_group_priority`."""

    group_files: dict[str, list[Level]] = field(default_factory=dict)
    host_files: dict[str, list[Level]] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)


def as_mapping(doc: Located, value: Any, path: tuple, what: str) -> dict | None:
    """The value as a mapping (empty for null); None, with an error, when it is something else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        doc.error(path, f"{what} must be a mapping, not {type_name(value)}")
        return None
    return value


def known_keys(doc: Located, mapping: dict, path: tuple, allowed: tuple, what: str) -> None:
    """An error at each key of `mapping` that is not in `allowed`, with a did-you-mean."""
    for key in mapping:
        if key in allowed:
            continue
        if what == "sudo" and key == "password":
            message = ("the sudo password is never stored in an inventory: put it in an environment "
                       "variable and name it with password_env")
        elif what == "defaults" and key == "groups":
            message = "defaults cannot list groups: list them on each host, or use a group's children"
        else:
            message = f"unknown {what} key {key!r}{suggest(key, allowed)}; expected one of: {', '.join(allowed)}"
        doc.error((*path, key), message, at_key=True)


def var_mapping(doc: Located, value: Any, path: tuple) -> dict:
    """`vars:` as {name: (value, path)}."""
    return {key: (item, (*path, key)) for key, item in (as_mapping(doc, value, path, "vars") or {}).items()}


def name_list(doc: Located, value: Any, path: tuple) -> list[tuple[str, tuple]]:
    """A list of group names as [(name, path)]; an error for anything that is not a name."""
    if value is None:
        return []
    if not isinstance(value, list):
        doc.error(path, f"must be a list of group names, not {type_name(value)}")
        return []
    names = []
    for i, name in enumerate(value):
        if isinstance(name, str) and name:
            names.append((name, (*path, i)))
        else:
            doc.error((*path, i), f"a group name must be a string, not {type_name(name)}")
    return names


def host_name_ok(doc: Located, name: Any, path: tuple, ranges_hint: bool = True) -> bool:
    """Whether `name` can be a host name; an error at its key when it cannot."""
    if isinstance(name, str) and HOST_NAME.fullmatch(name):
        if len(name) <= MAX_HOST_NAME:
            return True
        doc.error(path, f"host name of {len(name)} characters: gpuprov names files after hosts "
                        f"(locks/NAME.lock.yaml), which allows up to {MAX_HOST_NAME}; give a shorter name and the "
                        "long one as address:", at_key=True)
        return False
    hint = ("; host ranges like [01:04] are expanded in Ansible inventories only: list each host"
            if ranges_hint and isinstance(name, str) and re.search(r"\[[^\]]*:[^\]]*\]", name) else "")
    doc.error(path, f"bad host name {show(name)}: use letters, digits, '.', '_', ':' and '-'{hint}", at_key=True)
    return False


def group_name_ok(doc: Located, name: Any, path: tuple) -> bool:
    """Whether `name` can be a group name; an error at its key when it cannot."""
    if isinstance(name, str) and GROUP_NAME.fullmatch(name):
        return True
    doc.error(path, f"bad group name {show(name)}: use letters, digits, '.', '_' and '-'", at_key=True)
    return False


INVALID = object()  # what a check returns for a value it refused (the error is recorded where it was found)
