"""A spec's `matrix:` expanded into entries. Two forms:

    matrix:                         matrix:
      base.cuda: ["12.8.1", "12.9.1"]   - {base.ngc: 24.05-py3}
      pytorch: ["2.8.0"]                - {base.ngc: 25.01-py3, nccl: "2.25.1"}

A mapping of keys to lists is every combination (in the order written); a list gives each entry as it is. Only
the version keys vary (MATRIX_KEYS); an entry's value replaces the spec's. An entry is {key: (value, path)}, the
path being where the value is written, so that a problem with it names the matrix line.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.located import Located

MATRIX_KEYS = ("base.ngc", "base.cuda", "base.cudnn", "base.ubuntu", "base.flavor", "base.digest", "pytorch", "nccl")
MAX_ENTRIES = 64
Entry = dict[str, tuple[Any, tuple]]


def expand(doc: Located, value: Any, path: tuple = ("matrix",)) -> list[Entry]:
    """The entries of a spec's matrix; [] when it is bad (the problems recorded in `doc`)."""
    if isinstance(value, dict):
        return _product(doc, value, path)
    if isinstance(value, list):
        return _listed(doc, value, path)
    doc.error(path, f"matrix must be a mapping of keys to lists of values, or a list of entries, not "
                    f"{type_name(value)}")
    return []


def _product(doc: Located, value: dict, path: tuple) -> list[Entry]:
    if not value:
        doc.error(path, "the matrix is empty: give keys with lists of values, or remove it")
        return []
    axes, ok = [], True
    for key, values in value.items():
        kpath = (*path, key)
        ok = _key_ok(doc, key, kpath) and ok
        if not isinstance(values, list) or not values:
            doc.error(kpath, f"matrix key {key} needs a non-empty list of values, not {type_name(values)}")
            ok = False
            continue
        seen: dict[str, int] = {}
        for i, item in enumerate(values):
            shown = _scalar(doc, item, (*kpath, i))
            if shown is None:
                ok = False
            elif shown in seen:
                doc.error((*kpath, i), f"{shown!r} is listed twice (first at {key}[{seen[shown]}])")
                ok = False
            else:
                seen[shown] = i
        axes.append([(key, item, (*kpath, i)) for i, item in enumerate(values)])
    count = math.prod(len(axis) for axis in axes) if axes else 0
    if ok and count > MAX_ENTRIES:
        doc.error(path, f"the matrix has {count} entries; gpuprov expands up to {MAX_ENTRIES}: split the spec")
        ok = False
    if not ok:
        return []
    return [{key: (item, where) for key, item, where in combination} for combination in itertools.product(*axes)]


def _listed(doc: Located, value: list, path: tuple) -> list[Entry]:
    if not value:
        doc.error(path, "the matrix is empty: give entries, or remove it")
        return []
    if len(value) > MAX_ENTRIES:
        doc.error(path, f"the matrix has {len(value)} entries; gpuprov expands up to {MAX_ENTRIES}: split the spec")
        return []
    entries, ok = [], True
    for i, item in enumerate(value):
        ipath = (*path, i)
        if not isinstance(item, dict) or not item:
            doc.error(ipath, f"a matrix entry must be a mapping such as {{base.cuda: \"12.8.1\"}}, not "
                             f"{show(item) if item == {} else type_name(item)}")
            ok = False
            continue
        entry = {}
        for key, item_value in item.items():
            kpath = (*ipath, key)
            if _key_ok(doc, key, kpath) and _scalar(doc, item_value, kpath) is not None:
                entry[key] = (item_value, kpath)
            else:
                ok = False
        entries.append(entry)
    return entries if ok else []


def _key_ok(doc: Located, key: str, path: tuple) -> bool:
    if key in MATRIX_KEYS:
        return True
    doc.error(path, f"unknown matrix key {key!r}{suggest(key, MATRIX_KEYS)}; a matrix varies "
                    f"{', '.join(MATRIX_KEYS)}", at_key=True)
    return False


def _scalar(doc: Located, value: Any, path: tuple) -> str | None:
    """A matrix value's text (numbers as written); None, with an error, for anything else."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return doc.raw.get(path, str(value))
    doc.error(path, f"a matrix value must be text such as \"12.8.1\", not {type_name(value)}")
    return None
