"""bench/plots.py: a recorded bench result drawn as a PNG beside its JSON (same base name), read back by a PNG
decoder (matplotlib's imread, the outside judge): 1000 x 700 pixels, not blank; the ratios drawn are those the bench
itself wrote in the result; and no bench imports matplotlib unless asked to plot."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plots():
    spec = importlib.util.spec_from_file_location("bench_plots", ROOT / "bench" / "plots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded(tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copyfile(RESULTS / name, copy)
    return copy


@pytest.mark.parametrize("name", ["provision-20261202T175833Z.json", "controller_scale-20261203T114228Z.json",
                                  "images-20261202T061054Z.json", "inventory-20261201T154317Z.json",
                                  "rollout-20261203T080831Z.json", "validate-20261202T061722Z.json"])
def test_a_recorded_result_becomes_a_png_beside_it(plots, tmp_path, name):
    from matplotlib.image import imread

    result = recorded(tmp_path, name)
    png = plots.plot_result(result)
    assert png == result.with_suffix(".png") and png.parent == tmp_path
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (1000, 700)
    pixels = imread(png)
    assert pixels.shape[:2] == (700, 1000)
    colours = {tuple(row) for row in pixels.reshape(-1, pixels.shape[2])[::97].round(2).tolist()}
    assert len(colours) > 5   # bars, text and axes, not a blank page


def test_the_ratios_drawn_are_the_ones_the_bench_wrote(plots, tmp_path):
    provision = recorded(tmp_path, "provision-20261202T175833Z.json")
    drawn = {title: {label: round(value, 2) for label, value, _ in bars} for title, bars in plots.panels(provision)}
    # the bench's own verdict lines: "gpuprov 8.69 s, ssh 10.50 s (gpuprov/ssh = 0.83)"
    targets = {t["target"]: t["detail"] for t in json.loads(provision.read_text())["targets"]}
    assert "(gpuprov/ssh = 0.83)" in targets["no-op, 32 hosts: within 0.9x the plain ssh floor"]
    assert drawn["provision no-op re-run, gpuprov / peer (wall)"]["32 hosts / ssh"] == 0.83
    assert "(gpuprov/pyinfra = 0.53)" in targets["no-op, 32 hosts: faster than pyinfra"]
    assert drawn["provision no-op re-run, gpuprov / peer (wall)"]["32 hosts / pyinfra"] == 0.53
    assert "(gpuprov/ssh = 1.00)" in targets["first run, 32 hosts: within 1.1x the plain ssh floor"]
    assert drawn["provision first run, gpuprov / peer (wall)"]["32 hosts / ssh"] == 1.0

    rollout = recorded(tmp_path, "rollout-20261203T080831Z.json")
    data = json.loads(rollout.read_text())
    (_, bars), = plots.panels(rollout)
    assert [(label, value) for label, value, _ in bars] == [
        ("wall", data["median_wall_ratio"]), ("without the waits for jobs", data["median_active_ratio"]),
        ("drained -> resumed", data["median_work_ratio"])]


def test_a_result_of_no_known_bench_is_refused(plots, tmp_path):
    other = tmp_path / "unknown-20261203T000000Z.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match="not a result of"):
        plots.plot_result(other)
    assert not other.with_suffix(".png").exists()


def test_no_bench_imports_matplotlib_without_plot():
    code = ("import runpy, sys\n"
            "for name in ('plots', 'facts', 'inventory', 'provision', 'validate', 'rollout', 'controller_scale',"
            " 'images'):\n"
            f"    runpy.run_path({str(ROOT / 'bench')!r} + '/' + name + '.py', run_name='bench_' + name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "bench",
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
