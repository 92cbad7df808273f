"""The registry of inventory variables, Ansible `argument_spec` style: every variable a capability reads is
declared once, by that capability, and checked once, at load, where it is written (`FILE:LINE:COL: key: message`,
exit 2), before any host is touched. What a capability reads afterwards is a value the loader accepted.

A declaration is a `Spec`: the variable's dotted name under `vars:` (`validate.threshold_pct`; `*` for any key
of a mapping or any item of a list: `firewall.allow.*.port`), its kind (`schema.KINDS` names each kind's
checker), whether it is required in its mapping, the default the loader fills in when it is missing (only where
the readers rely on one), its choices, bounds, pattern, the message that refuses it (`{value}`, `{type}` and
`{problem}`: the value shown, its type in words and the checker's own words), whether null stands for unset, and
a description. Each
capability lists its specs in its own `variables` module (CAPABILITIES); `declare` stamps them with the
capability's name.

    registry()            {dotted name: Spec} of every capability (built once)
    spec(name)            the Spec of a dotted name (list indexes and free keys match `*`), or None
    children(name)        the specs one level below `name`, in declaration order
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from dataclasses import dataclass
from typing import Any

# the modules that declare variables, one per capability; each has VARIABLES, a tuple of Specs made by `declare`
CAPABILITIES = ("gpuprov.provision.variables", "gpuprov.harden.variables", "gpuprov.monitoring.variables",
                "gpuprov.validation.variables", "gpuprov.images.variables",
                "gpuprov.rollout.variables")
ANY = "*"


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()


@dataclass(frozen=True)
class Spec:
    """One declared variable (or a part of one)."""

    name: str                         # dotted under vars:, `*` for any key or item
    kind: str                         # a key of gpuprov.inventory.schema.KINDS
    description: str
    owner: str = ""                   # the capability that declares it (stamped by `declare`)
    required: bool = False            # its mapping must have it
    default: Any = NO_DEFAULT         # filled into its mapping by the loader when missing
    null: bool = False                # null is accepted, as if it were not set
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    above: bool = False               # low is exclusive (a number above low, not at least low)
    pattern: re.Pattern | None = None
    message: str = ""                 # the refusal, `{value}` standing for the value as written
    label: str = ""                   # what messages call it (default: the last part of its name)

    @property
    def key(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def parent(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def what(self) -> str:
        return self.label or self.key


def declare(owner: str, *specs: Spec) -> tuple[Spec, ...]:
    """`specs`, each stamped as declared by the capability `owner`."""
    return tuple(dataclasses.replace(item, owner=owner) for item in specs)


@functools.cache
def registry() -> dict[str, Spec]:
    """Every declared variable by dotted name; ValueError when two capabilities declare the same one, or a part is
    declared without its parent (a programming error, found by the tests)."""
    out: dict[str, Spec] = {}
    for module in CAPABILITIES:
        for item in importlib.import_module(module).VARIABLES:
            if item.name in out:
                raise ValueError(f"variable {item.name} is declared by {out[item.name].owner} and {item.owner}")
            if item.parent and item.parent not in out:
                raise ValueError(f"variable {item.name} ({item.owner}) is declared before {item.parent}")
            out[item.name] = item
    return out


def spec(name: str) -> Spec | None:
    """The Spec of dotted `name`; a part that is not declared by name matches `*` (list items, free keys)."""
    specs = registry()
    found = ""
    for part in name.split("."):
        named = f"{found}.{part}" if found else part
        wild = f"{found}.{ANY}" if found else ANY
        if named in specs:
            found = named
        elif wild in specs:
            found = wild
        else:
            return None
    return specs[found]


def children(name: str) -> tuple[Spec, ...]:
    """The specs one level below `name`, in declaration order."""
    return _children().get(name, ())


@functools.cache
def _children() -> dict[str, tuple[Spec, ...]]:
    out: dict[str, list[Spec]] = {}
    for item in registry().values():
        out.setdefault(item.parent, []).append(item)
    return {name: tuple(items) for name, items in out.items()}
