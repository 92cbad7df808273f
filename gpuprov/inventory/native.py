"""gpuprov's own inventory format::

    known_hosts: PATH      (optional: this fleet's known_hosts file)
    defaults: {port, user, identity_file, jump, sudo, address, vars}
    groups:   {NAME: {vars, children: [NAME, ...], port, user, identity_file, jump, sudo}}
    hosts:    {NAME: {address, port, user, identity_file, jump, sudo, groups: [NAME, ...], vars}}
    slurm:    {controller: HOST or local, partitions: [NAME, ...]}   (gpuprov.inventory.slurm reads it)

With `slurm:` the file may list no hosts (or only the controller): Slurm's nodes are its hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuprov.inventory.levels import (
    Level,
    Levels,
    as_mapping,
    group_name_ok,
    host_name_ok,
    known_keys,
    name_list,
    var_mapping,
)
from gpuprov.inventory.located import Located
from gpuprov.inventory.settings import SETTING_KEYS, local_path

TOP_KEYS = ("hosts", "groups", "defaults", "known_hosts", "slurm")
HOST_KEYS = (*SETTING_KEYS, "groups", "vars")
DEFAULT_KEYS = (*SETTING_KEYS, "vars")
GROUP_KEYS = ("vars", "children", "port", "user", "identity_file", "jump", "sudo")


def read_native(doc: Located, data: dict, base: Path) -> Levels:
    """The levels of a native inventory document (its `slurm:` block is read by gpuprov.inventory.slurm); shape
    errors are recorded in `doc`."""
    known_keys(doc, data, (), TOP_KEYS, "top-level")
    levels = Levels(defaults=_level(doc, "defaults", data.get("defaults"), ("defaults",), DEFAULT_KEYS, "defaults"))
    if "known_hosts" in data:
        known_hosts = local_path(doc, data["known_hosts"], ("known_hosts",), "known_hosts", base, must_exist=False)
        levels.known_hosts = Path(known_hosts) if known_hosts else None
    for name, body in (as_mapping(doc, data.get("groups"), ("groups",), "groups") or {}).items():
        if group_name_ok(doc, name, ("groups", name)):
            levels.groups[name] = _level(doc, f"group:{name}", body, ("groups", name), GROUP_KEYS, "group")
    hosts = as_mapping(doc, data.get("hosts"), ("hosts",), "hosts")
    if hosts is not None and not hosts and "slurm" not in data:
        doc.error(("hosts",) if "hosts" in data else (), "no hosts: add a hosts: mapping of host names")
    for name, body in (hosts or {}).items():
        if host_name_ok(doc, name, ("hosts", name)):
            levels.hosts[name] = _level(doc, "host", body, ("hosts", name), HOST_KEYS, "host")
    return levels


def _level(doc: Located, source: str, body: Any, path: tuple, allowed: tuple, what: str) -> Level:
    level = Level(source, path)
    body = as_mapping(doc, body, path, what)
    if not body:
        return level
    known_keys(doc, body, path, allowed, what)
    for key, value in body.items():
        kpath = (*path, key)
        if key == "vars":
            level.vars.update(var_mapping(doc, value, kpath))
        elif key in ("children", "groups") and key in allowed:
            level.links = name_list(doc, value, kpath)
        elif key in SETTING_KEYS and key in allowed:
            level.settings[key] = (value, kpath)
    return level
