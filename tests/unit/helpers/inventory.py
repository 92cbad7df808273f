"""Inventory files as the tests write them, and `inventory.check` on a bad one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

from gpuprov.tasks import inventory as inventory_tasks


def write(tmp_path: Path, text: str, name: str = "inv.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def check_fails(path, capsys) -> list[str]:
    """stderr lines of `inventory.check` on a bad file; exit 2 and the file unchanged."""
    before = path.read_bytes()
    with pytest.raises(Exit) as info:
        inventory_tasks.check(Context(), inventory=str(path))
    assert info.value.code == 2 and path.read_bytes() == before
    return capsys.readouterr().err.splitlines()

