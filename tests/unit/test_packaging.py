"""The wheel: built with `pip wheel` from a copy of this tree, it holds every file of the package, and installed in a
fresh venv and run from another folder its `gpuprov` lists and renders the shipped images, writes the dashboard and
uses the user's own specs from the working directory. No network: the build uses this interpreter's setuptools
(--no-build-isolation) and the venv sees this interpreter's packages (--system-site-packages) for gpuprov's
dependencies, gpuprov itself coming from the wheel (checked)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
SHIPPED_DASHBOARD = PROJECT / "gpuprov" / "monitoring" / "grafana" / "gpu-fleet.json"
SPEC = """\
name: mine
purpose: infer
gpus: [L40S]
base: {ngc: 25.01-py3}
user: {name: gpuprov, uid: 1000}
ports: [8000]
healthcheck: {test: [python3, -c, "import torch"]}
"""

pytestmark = pytest.mark.tool   # pip and venv in subprocesses (about 10 s)


def run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """A command with no PYTHONPATH and no gpuprov settings from this process's environment."""
    env = {key: value for key, value in os.environ.items()
           if key != "PYTHONPATH" and not key.startswith("INVOKE_")}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of this tree (a build in the tree would leave build/lib behind, stale files included)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    shutil.copytree(PROJECT / "gpuprov", source / "gpuprov", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(PROJECT / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(root / "dist")], cwd=root)
    [built] = (root / "dist").glob("gpuprov-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (gpuprov's dependencies from this interpreter's site-packages)."""
    folder = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(folder)], cwd=folder.parent)
    run([str(folder / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
         str(wheel)], cwd=folder.parent)
    return folder


def test_the_wheel_holds_every_file_of_the_package(wheel):
    """Modules and data alike: specs, templates, rules, the dashboard, the resolver's data, host scripts."""
    source = {path.relative_to(PROJECT).as_posix() for path in (PROJECT / "gpuprov").rglob("*")
              if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}
    with zipfile.ZipFile(wheel) as archive:
        packed = {name for name in archive.namelist() if name.startswith("gpuprov/")}
    assert sorted(source - packed) == [] and sorted(packed - source) == []
    for data in ("gpuprov/images/specs/cuda-pytorch-train.yaml", "gpuprov/images/templates/Dockerfile.j2",
                 "gpuprov/images/templates/files/gpuprov-smoke", "gpuprov/monitoring/prometheus/gpuprov.rules.yml",
                 "gpuprov/monitoring/grafana/gpu-fleet.json"):
        assert data in packed


def test_the_installed_wheel_lists_renders_and_writes_the_dashboard_from_another_folder(venv, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    python, gpuprov = str(venv / "bin" / "python"), str(venv / "bin" / "gpuprov")
    found = run([python, "-c", "import gpuprov; print(gpuprov.__file__)"], cwd=work).stdout.strip()
    assert Path(found).is_relative_to(venv)             # the wheel's gpuprov, not this tree's or another install's

    listed = json.loads(run([gpuprov, "images.list", "--json"], cwd=work).stdout)
    ids = {row["id"] for row in listed}
    assert {"cuda-pytorch-train-2.8.0-cu128", "cuda-pytorch-train-2.8.0-cu129", "lab-pytorch-cpu"} <= ids
    assert all(Path(row["spec"]).is_relative_to(venv) for row in listed)

    run([gpuprov, "images.render", "--name", "cuda-pytorch-train"], cwd=work)
    dockerfile = work / "build" / "images" / "cuda-pytorch-train-2.8.0-cu128" / "Dockerfile"
    text = dockerfile.read_text()
    assert "\nFROM nvidia/cuda:12.8.1-base-ubuntu24.04\n" in text       # the spec's matrix: base.cuda 12.8.1
    assert "from gpuprov/images/specs/cuda-pytorch-train.yaml;" in text
    assert (dockerfile.parent / "gpuprov-smoke").is_file() and (dockerfile.parent / "smoke" / "core.py").is_file()

    run([gpuprov, "monitoring.dashboard"], cwd=work)
    written = work / "build" / "monitoring" / "gpu-fleet.json"
    assert json.loads(written.read_text()) == json.loads(SHIPPED_DASHBOARD.read_text())
    assert sorted(path.name for path in work.iterdir()) == ["build"]     # all it wrote is under build/
    rules = run([python, "-c", "from gpuprov.monitoring.server import rules_text; print(rules_text(), end='')"],
                cwd=work).stdout                                         # what monitoring.server puts on the host
    assert rules == (PROJECT / "gpuprov" / "monitoring" / "prometheus" / "gpuprov.rules.yml").read_text()
    assert not (venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
                / "build").exists()


def test_the_installed_wheel_uses_the_users_specs_from_the_working_directory(venv, tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "mine.yaml").write_text(SPEC)
    gpuprov = str(venv / "bin" / "gpuprov")
    listed = json.loads(run([gpuprov, "images.list", "--json"], cwd=tmp_path).stdout)
    assert [(row["id"], row["spec"], row["tag"]) for row in listed] == [("mine", "images/mine.yaml",
                                                                         "2.6.0a0-cu128-infer")]
    (tmp_path / "images" / "mine.yaml").write_text(SPEC.replace("purpose: infer", "purpose: serve"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH" and not key.startswith("INVOKE_")}
    done = subprocess.run([gpuprov, "images.list"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and "images/mine.yaml:2:10: purpose:" in done.stderr
