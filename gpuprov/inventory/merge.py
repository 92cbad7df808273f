"""From levels to an Inventory: check settings and variables where written, then groups, merge every host,
check jump hosts.

Precedence, lowest first: what Slurm says of the host (an inventory with a `slurm:` source, gpuprov.inventory.slurm),
the defaults, then the host's groups, then the host. The groups apply in the order the host lists them, each one
preceded by its ancestors (parents before children, a group applies once), so a later group wins over an earlier
one and a child always wins over its parents. Settings and variables merge
by top-level key: a level that sets `stack` replaces the whole `stack` mapping.

An Ansible inventory merges as Ansible does ("Understanding variable precedence"; the order of ansible-core's
VariableManager with the default VARIABLE_PRECEDENCE), lowest first: the file's `all` vars, the file's vars of the
host's groups, `group_vars/all`, the host's `group_vars/` files, the file's host vars, the host's `host_vars/`
files. The host's groups (every ancestor of the groups it is in) apply sorted by depth below `all` (the longest
chain of parents), then `ansible_group_priority` (default 1), then name; one group's files in the order Ansible reads
them (gpuprov.inventory.ansible_vars). Each key of a later level replaces the key of an earlier one.

Jump hosts: gpuprov connects through one jump host, so a jump host that has a jump host of its own (a chain)
is refused here, never silently shortened, and so is a cycle.
"""

from __future__ import annotations

from pathlib import Path

from gpuprov.inventory import checks
from gpuprov.inventory.diagnostics import InventoryError, suggest
from gpuprov.inventory.hardening import check_references
from gpuprov.inventory.levels import INVALID, AnsibleOrder, Level, Levels
from gpuprov.inventory.located import Located
from gpuprov.inventory.model import Group, Host, Inventory, is_valid_address
from gpuprov.inventory.schema import VariableSchema
from gpuprov.inventory.settings import SettingChecks


def build_inventory(doc: Located, levels: Levels, fmt: str, base: Path,
                    below: dict[str, Level] | None = None) -> Inventory:
    """The validated Inventory; InventoryError with every problem found (in `doc` too) otherwise. `below`: a level
    per host that merges below the defaults (what Slurm says of it, gpuprov.inventory.slurm)."""
    below = below or {}
    settings, schema = SettingChecks(doc, base, levels.hosts), VariableSchema(doc, base)
    files = [] if levels.ansible is None else [
        *(f for group in levels.ansible.group_files.values() for f in group),
        *(f for host in levels.ansible.host_files.values() for f in host)]
    for level in [*below.values(), levels.defaults, *levels.groups.values(), *levels.hosts.values(), *files]:
        level.settings = settings.check(level)
        checked = {key: (schema.check(key, value, path), path) for key, (value, path) in level.vars.items()}
        level.vars = {key: pair for key, pair in checked.items() if pair[0] is not INVALID}
    _refuse_tags(doc, levels.dropped)
    parents = _check_groups(doc, levels.groups)
    merger = _Merger(doc, levels, parents, below)
    hosts = {name: merger.host(name, level) for name, level in levels.hosts.items()}
    _check_jumps(doc, levels, hosts)
    if doc.errors:
        raise InventoryError(doc.file, doc.problems())
    members: dict[str, list[str]] = {name: [] for name in levels.groups}
    for host in hosts.values():
        for group in host.groups:
            members[group].append(host.name)
    groups = {
        name: Group(name=name, vars={k: v for k, (v, _) in level.vars.items()},
                    children=tuple(n for n, _ in level.links), parents=tuple(parents[name]),
                    hosts=tuple(members[name]))
        for name, level in levels.groups.items()
    }
    return Inventory(path=doc.file, hosts=hosts, groups=groups, format=fmt, warnings=doc.warnings,
                     known_hosts=levels.known_hosts)


def _refuse_tags(doc: Located, dropped: list[tuple]) -> None:
    """An error for each value with a tag gpuprov does not read (`!vault`), unless its key is not read at all."""
    skipped = set(dropped)
    for path, tag in doc.tagged.items():
        if not any(path[:end] in skipped for end in range(1, len(path) + 1)):
            doc.error(path, f"unsupported YAML tag {tag!r}: gpuprov reads plain values only (no encrypted or "
                            "custom-tagged values)")


def _check_groups(doc: Located, groups: dict[str, Level]) -> dict[str, list[str]]:
    """Each group's parents; an error for every unknown child and every cycle."""
    parents: dict[str, list[str]] = {name: [] for name in groups}
    for name, level in groups.items():
        for child, cpath in level.links:
            if child in groups:
                parents[child].append(name)
            else:
                doc.error(cpath, f"unknown group {child!r}{suggest(child, groups)}")
    state: dict[str, int] = {}
    reported: set[frozenset] = set()

    def visit(name: str, stack: list[str]) -> None:
        state[name] = 1
        stack.append(name)
        for child, cpath in groups[name].links:
            if child not in groups:
                continue
            if state.get(child) == 1:
                cycle = [*stack[stack.index(child):], child]
                if frozenset(cycle) not in reported:
                    reported.add(frozenset(cycle))
                    doc.error(cpath, f"group cycle: {' -> '.join(cycle)}")
            elif child not in state:
                visit(child, stack)
        stack.pop()
        state[name] = 2

    for name in groups:
        if name not in state:
            visit(name, [])
    return parents


class _Merger:
    """Merges each host's levels: Slurm's (when below has one), defaults, its groups (ancestors first), the host."""

    def __init__(self, doc: Located, levels: Levels, parents: dict[str, list[str]], below: dict[str, Level]):
        self.doc, self.levels, self.parents, self.below = doc, levels, parents, below
        self.orders: dict[tuple[str, ...], list[str]] = {}
        self.depths: dict[str, int] = {}

    def host(self, name: str, level: Level) -> Host:
        listed = []
        for group, gpath in level.links:
            if group in self.levels.groups:
                listed.append(group)
            else:
                self.doc.error(gpath, f"unknown group {group!r}{suggest(group, self.levels.groups)}")
        ansible = self.levels.ansible
        if ansible is None:
            order = self.order(tuple(listed))
            first = [self.below[name]] if name in self.below else []
            merged = [*first, self.levels.defaults, *(self.levels.groups[g] for g in order), level]
        else:
            order = self.ansible_order(tuple(listed), ansible)
            merged = [self.levels.defaults, *(self.levels.groups[g] for g in order),
                      *ansible.group_files.get("all", ()), *(f for g in order for f in ansible.group_files.get(g, ())),
                      level, *ansible.host_files.get(name, ())]
        settings: dict = {}
        setting_sources: dict = {}
        variables: dict = {}
        var_paths: dict = {}
        sources: dict = {}
        for lvl in merged:
            for key, (value, _) in lvl.settings.items():
                settings[key] = value
                setting_sources[key] = lvl.source
            for key, (value, path) in lvl.vars.items():
                variables[key] = value
                var_paths[key] = path
                sources[key] = lvl.source
        if "address" not in settings:
            if not is_valid_address(name):
                self.doc.error(level.path, f"host {name!r} has no address and its name is not a host name or "
                                           "IP address: give address:", at_key=True)
            settings["address"] = name
            setting_sources["address"] = "host name"
        check_references(self.doc, variables, var_paths)
        warning = checks.hardware_warning(variables.get("hardware"))
        if warning:
            self.doc.warn(var_paths["hardware"], f"host {name}: {warning}")
        sudo = settings.pop("sudo", None) or {}
        return Host(name=name, groups=tuple(order), vars=variables, sources=sources,
                    setting_sources=setting_sources, sudo_password_env=sudo.get("password_env"),
                    sudo_nopasswd=sudo.get("nopasswd", False), **settings)

    def order(self, listed: tuple[str, ...]) -> list[str]:
        """The groups a host lists, each preceded by its ancestors (once); the same for every host listing them."""
        if listed not in self.orders:
            order: list[str] = []
            visiting: set[str] = set()

            def visit(name: str) -> None:
                if name in visiting:
                    return
                visiting.add(name)
                for parent in self.parents[name]:
                    visit(parent)
                order.append(name)

            for name in listed:
                visit(name)
            self.orders[listed] = order
        return self.orders[listed]


    def ansible_order(self, listed: tuple[str, ...], ansible: AnsibleOrder) -> list[str]:
        """The listed groups and all their ancestors, sorted as Ansible sorts a host's groups: by depth below
        `all`, then ansible_group_priority, then name."""
        if listed not in self.orders:
            found: set[str] = set()
            todo = list(listed)
            while todo:
                group = todo.pop()
                if group not in found:
                    found.add(group)
                    todo.extend(self.parents[group])
            self.orders[listed] = sorted(found, key=lambda g: (self.depth(g), ansible.priorities.get(g, 1), g))
        return self.orders[listed]

    def depth(self, group: str, visiting: set[str] | None = None) -> int:
        """The longest chain of parents from `all` down to `group` (a top-level group is 1; a cycle, an error
        already, stops the count)."""
        if group not in self.depths:
            visiting = visiting if visiting is not None else set()
            if group in visiting:
                return 0
            visiting.add(group)
            self.depths[group] = 1 + max((self.depth(p, visiting) for p in self.parents[group]), default=0)
            visiting.discard(group)
        return self.depths[group]


def _check_jumps(doc: Located, levels: Levels, hosts: dict[str, Host]) -> None:
    """An error for each jump cycle, and for each jump host that has a jump host of its own (a chain)."""
    reported: set[frozenset] = set()
    chains: dict[tuple, list[str]] = {}
    for name, host in hosts.items():
        chain, current, cyclic = [name], host, False
        while current.jump is not None:
            hop = current.jump
            if hop in chain:
                cycle = [*chain[chain.index(hop):], hop]
                if frozenset(cycle) not in reported:
                    reported.add(frozenset(cycle))
                    hint = f"; set jump: null on {name!r}" if len(cycle) == 2 else ""
                    doc.error(_jump_path(levels, hosts[cycle[0]]), f"jump cycle: {' -> '.join(cycle)}{hint}")
                cyclic = True
                break
            chain.append(hop)
            if hop not in hosts:
                break
            current = hosts[hop]
        if not cyclic and len(chain) > 2:
            chains.setdefault((_jump_path(levels, host), tuple(chain[1:])), []).append(name)
    for (path, hops), names in chains.items():
        others = len(names) - 1
        more = f" (and {others} more host{'s' if others > 1 else ''} through the same setting)" if others else ""
        doc.error(path, f"jump chain {' -> '.join([names[0], *hops])}{more}: the jump host {hops[0]!r} has a jump "
                        "host of its own, and gpuprov connects through one jump host, never skipping a hop; set "
                        f"jump: null on {hops[0]!r} if gpuprov can reach it directly, or jump through a host it can")


def _jump_path(levels: Levels, host: Host) -> tuple:
    """Where the host's jump setting was given (the host, one of its groups, or the defaults)."""
    source = host.setting_sources.get("jump")
    level = {"host": levels.hosts[host.name], "defaults": levels.defaults}.get(source)
    if level is None and source and source.startswith("group:"):
        level = levels.groups.get(source[len("group:"):])
    if level is None and levels.ansible is not None:
        files = [*levels.ansible.host_files.get(host.name, ()), *(f for g in host.groups
                                                                  for f in levels.ansible.group_files.get(g, ())),
                 *levels.ansible.group_files.get("all", ())]
        level = next((f for f in files if f.source == source), None)
    if level is not None and "jump" in level.settings:
        return level.settings["jump"][1]
    return levels.hosts[host.name].path
