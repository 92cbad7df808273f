"""`mirror.label`: the mirror's Release `Label:`, which apt pins the repository by; bad values are located."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuprov.inventory import InventoryError, load_inventory


def inventory(tmp_path: Path, label: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(f"""\
        hosts:
          gpu01:
            address: 10.0.0.1
            vars:
              mirror:
                url: http://mirror.internal/nvidia/
                label: {label}
        """))
    return path


def test_a_label_with_spaces_is_kept(tmp_path):
    host = load_inventory(inventory(tmp_path, '"NVIDIA CUDA"')).hosts["gpu01"]
    assert host.vars["mirror"]["label"] == "NVIDIA CUDA"


@pytest.mark.parametrize("label", ['"a, b"', '"line\\nbreak"', "''", "[x]"])
def test_a_label_apt_cannot_pin_by_is_a_located_error(tmp_path, label):
    with pytest.raises(InventoryError) as info:
        load_inventory(inventory(tmp_path, label))
    [error] = info.value.errors
    assert error.startswith(f"{tmp_path / 'inv.yaml'}:7:") and "hosts.gpu01.vars.mirror.label: bad label" in error
