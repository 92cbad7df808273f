"""How a problem in an inventory is told: `FILE:LINE:COL: key path: message` on one line.

Every line is printed literally: control characters in user text (a newline in a host name) are escaped by
gpuprov.core.errors.literal, so no input can forge an extra line, and credentials (a proxy or mirror login) are
masked by gpuprov.core.errors.mask_credentials. All problems of one file are raised together as one InventoryError.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuprov.core.errors import InputError, literal, mask_credentials

FILE_KEY = "(file)"  # the key path of a problem with the file as a whole (not UTF-8, not YAML)
_SHOWN = 60  # characters of a value quoted back in a message


class InventoryError(InputError):
    """An inventory that cannot be used; `.errors` holds every problem as `FILE:LINE:COL: key: message`."""

    def __init__(self, path: str | Path, errors: list[str]):
        self.errors = list(errors)
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        shown = literal(str(path))
        super().__init__(f"{shown}: {count}:\n  " + "\n  ".join(self.errors), step="inventory",
                         hint=f"fix the inventory, then run: invoke inventory.check --inventory {shown}")


def problem_line(file: str | Path, line: int, col: int, key: str, message: str) -> str:
    """One problem as one printable line, credentials masked."""
    return literal(mask_credentials(f"{file}:{line}:{col}: {key}: {message}"))


def key_path(path: tuple) -> str:
    """`("hosts", "gpu01", "vars", "firewall", "allow", 0)` -> `hosts.gpu01.vars.firewall.allow[0]`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) and not isinstance(part, bool) else f".{part}"
    return text.lstrip(".") or "(top level)"


def show(value: Any) -> str:
    """A value quoted back in a message: its repr (control characters escaped), long ones cut."""
    text = repr(value[:_SHOWN + 1] if isinstance(value, str) else value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def type_name(value: Any) -> str:
    """What a value is, in words: "a mapping", "a list", "a boolean", "empty (null)", else its type's name."""
    return {dict: "a mapping", list: "a list", bool: "a boolean", type(None): "empty (null)"}.get(
        type(value), type(value).__name__)


def suggest(word: Any, choices: Iterable) -> str:
    """` (did you mean 'x'?)` for the closest choice, or nothing."""
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""
