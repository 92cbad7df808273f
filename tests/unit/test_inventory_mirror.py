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


def test_a_broken_ipv6_mirror_url_is_a_located_error_not_a_traceback(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text('hosts:\n  gpu01:\n    address: 10.0.0.1\n    vars:\n      mirror: {url: "http://[fe80::1/x/"}\n')
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.errors == [f"{path}:5:21: hosts.gpu01.vars.mirror.url: bad URL 'http://[fe80::1/x/': "
                                 "give an http:// or https:// URL with a host name"]


def test_inventory_show_masks_mirror_credentials(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "inv.yaml"
    path.write_text('hosts:\n  gpu01:\n    address: 10.0.0.1\n    vars:\n'
                    '      mirror: {url: "http://bob:s3cret@mirror.internal/nvidia/"}\n')
    for extra in ([], ["--json"]):
        proc = subprocess.run([sys.executable, "-m", "invoke", "inventory.show", "--host", "gpu01", "--inventory",
                               str(path), *extra], capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).resolve().parents[2])
        assert proc.returncode == 0 and "mirror.internal" in proc.stdout and "s3cret" not in proc.stdout
