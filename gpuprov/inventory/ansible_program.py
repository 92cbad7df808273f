"""An inventory read by ansible-core itself: `ansible-inventory --list --inventory PATH` run as a program (never
imported), its JSON read into the levels gpuprov.inventory.ansible makes of a file. This brings what a file reader
cannot: dynamic inventories (EC2, NetBox, scripts), inventory plugins and vault (with the vault password file
Ansible's own settings name).

The program runs without a shell, stdin closed, with a timeout, and with Ansible told to fail on a source it cannot
parse (by default it only warns and lists an empty inventory). `_meta.hostvars` holds each host's variables already
merged by Ansible; they become the host's own level, and the groups' `hosts` and `children` its groups. Its values
are data, checked as the file reader checks them (connection settings, ssh args, become, declared variables); a
problem is told at its key path in the output (`_meta.hostvars.gpu01.ansible_port`). A value still encrypted
(`{"__ansible_vault": ...}`) is refused.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.core.local import run_bounded
from gpuprov.core.secrets import register_named
from gpuprov.inventory.ansible import ansible_variables
from gpuprov.inventory.diagnostics import InventoryError, type_name
from gpuprov.inventory.levels import AnsibleOrder, Level, Levels, as_mapping, group_name_ok, host_name_ok
from gpuprov.inventory.located import Located
from gpuprov.inventory.merge import build_inventory
from gpuprov.inventory.model import Inventory

PROGRAM = "ansible-inventory"
TIMEOUT_S = 300
MAX_OUTPUT = 256 * 1024 * 1024
# fail on a source no inventory plugin parses, instead of a warning and an empty inventory
STRICT_ENV = {"ANSIBLE_INVENTORY_UNPARSED_FAILED": "True", "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
              "ANSIBLE_NOCOLOR": "True"}


def load_with_ansible(path: Path, timeout: float = TIMEOUT_S) -> Inventory:
    """The Inventory ansible-inventory lists for `path`; InputError when it is missing or refuses the inventory
    (its stderr shown), InventoryError when a value is bad, GpuprovError when it does not answer in time."""
    output, warnings = run_ansible_inventory(path, timeout)
    label = Path(f"{PROGRAM} --list --inventory {path}")
    try:
        data = json.loads(output)
    except ValueError as exc:
        raise InputError(f"{PROGRAM}'s output for {literal(str(path))} is not JSON: {exc}", step="inventory",
                         hint=f"run {PROGRAM} --list --inventory {shlex.quote(str(path))} and check its output"
                         ) from None
    register_named(data)   # vault-decrypted secrets (ansible_become_pass...) masked wherever they show
    doc = Located(label, aliases=False)
    if not isinstance(data, dict):
        doc.error((), f"expected a JSON object with _meta and groups, not {type_name(data)}")
        raise InventoryError(label, doc.problems())
    inventory = build_inventory(doc, read_listing(doc, data), "ansible-inventory", path.parent.absolute())
    inventory.warnings[:0] = warnings
    return inventory


def run_ansible_inventory(path: Path, timeout: float = TIMEOUT_S) -> tuple[str, list[str]]:
    """ansible-inventory's JSON listing of `path`, and its warnings (stderr lines, shown literally)."""
    program = shutil.which(PROGRAM)
    if program is None:
        raise InputError(f"--inventory-plugin ansible runs {PROGRAM}, which is not installed (not on PATH)",
                         step="inventory", hint="pip install ansible-core (it brings ansible-inventory), or leave "
                                                "out --inventory-plugin to use gpuprov's own reader")
    argv = [program, "--list", "--inventory", str(path.absolute())]
    command = shlex.join(argv)
    try:
        done = run_bounded(argv, timeout, env={**os.environ, **STRICT_ENV})
    except subprocess.TimeoutExpired:
        raise GpuprovError(f"{PROGRAM} gave no listing of {literal(str(path))} within {timeout:g} s",
                           step="inventory", command=command,
                           hint="run the command by hand to see where it waits (a dynamic inventory's API?)") from None
    except OSError as exc:
        raise InputError(f"cannot run {PROGRAM}: {exc.strerror}", step="inventory", command=command,
                         hint="pip install ansible-core, or leave out --inventory-plugin") from None
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode != 0:
        raise InputError(f"{PROGRAM} could not list {literal(str(path))} (exit {done.returncode})",
                         step="inventory", command=command, output=stderr or "(no output on stderr)",
                         hint="fix what it says, then run the command again")
    if len(done.stdout) > MAX_OUTPUT:
        raise InputError(f"{PROGRAM}'s listing of {literal(str(path))} has {len(done.stdout)} bytes; gpuprov reads "
                         f"up to {MAX_OUTPUT}", step="inventory", command=command, hint="list fewer hosts")
    warnings = [f"{PROGRAM}: {literal(line)}" for line in stderr.splitlines() if line.strip()]
    return done.stdout.decode("utf-8", "replace"), warnings


def read_listing(doc: Located, data: dict) -> Levels:
    """The levels of an `ansible-inventory --list` document: each host's merged variables its own level, the
    groups' children and hosts the links, `all` the defaults."""
    levels = Levels(defaults=Level("defaults", ("all",)), ansible=AnsibleOrder())
    meta = as_mapping(doc, data.get("_meta"), ("_meta",), "_meta") or {}
    hostvars = as_mapping(doc, meta.get("hostvars"), ("_meta", "hostvars"), "_meta.hostvars") or {}
    groups = {name: body for name, body in data.items() if name != "_meta"}
    members: dict[str, list[tuple[str, tuple]]] = {}
    children: dict[str, list[str]] = {}
    for name, body in groups.items():
        path = (name,)
        if name != "all" and not group_name_ok(doc, name, path):
            continue
        level = levels.defaults if name == "all" else levels.groups.setdefault(name, Level(f"group:{name}", path))
        body = as_mapping(doc, body, path, "a group") or {}
        _refuse_vaulted(doc, body.get("vars"), (*path, "vars"))
        ansible_variables(doc, levels, body.get("vars"), (*path, "vars"), level)
        children[name] = _names(doc, body.get("children"), (*path, "children"))
        if name != "all":
            level.links.extend((child, (*path, "children", i)) for i, child in enumerate(children[name])
                               if child != "all")
        members[name] = [(host, (*path, "hosts", i))
                         for i, host in enumerate(_names(doc, body.get("hosts"), (*path, "hosts")))]
    order = [*_tree_order("all", members, children),
             *(pair for name in members for pair in members[name]),
             *((host, ("_meta", "hostvars", host)) for host in hostvars)]
    refused: set[str] = set()
    for host, where in order:
        if host in refused:
            continue
        if host not in levels.hosts:
            if not host_name_ok(doc, host, where):
                refused.add(host)
                continue
            path = ("_meta", "hostvars", host)
            level = levels.hosts[host] = Level(PROGRAM, path)
            _refuse_vaulted(doc, hostvars.get(host), path)
            ansible_variables(doc, levels, hostvars.get(host), path, level)
        if where[-2:-1] == ("hosts",) and where[0] != "all":
            _link(levels.hosts[host], where)
    if not levels.hosts:
        doc.error((), f"{PROGRAM} lists no hosts")
    return levels


def _tree_order(top: str, members: dict, children: dict) -> list[tuple[str, tuple]]:
    """The hosts under `top` as ansible-inventory lists them: a group's own, then each child's, depth first."""
    found: list[tuple[str, tuple]] = []
    seen: set[str] = set()
    stack = [top]
    while stack:
        group = stack.pop()
        if group not in seen:
            seen.add(group)
            found.extend(members.get(group, ()))
            stack.extend(reversed(children.get(group, ())))
    return found


def _link(level: Level, where: tuple) -> None:
    if all(where[0] != group for group, _ in level.links):
        level.links.append((where[0], where))


def _names(doc: Located, value: Any, path: tuple) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    doc.error(path, f"expected a list of names, not {type_name(value)}")
    return []


def _refuse_vaulted(doc: Located, value: Any, path: tuple) -> None:
    """An error at each value ansible-inventory printed still encrypted (`{"__ansible_vault": ...}`)."""
    if isinstance(value, dict):
        if "__ansible_vault" in value:
            doc.error(path, "a vault-encrypted value, listed still encrypted: gpuprov does not decrypt it; give "
                            "Ansible the vault password (ANSIBLE_VAULT_PASSWORD_FILE) or move the value out of vault")
            return
        for key, item in value.items():
            _refuse_vaulted(doc, item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_vaulted(doc, item, (*path, index))
