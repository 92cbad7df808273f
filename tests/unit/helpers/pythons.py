"""The Pythons hosts ship (3.9 to 3.13; 3.6 to 3.8 to be refused), found on this machine (PATH, /usr/bin, pyenv);
vermin (PyPI) as the judge of the release a feature needs; a lab host whose stand-in tools a given Python runs."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpuprov.lab import standins
from gpuprov.lab.smi_answers import gpu_profiles_table

OLDEST = "3.9"
MINORS = (9, 10, 11, 12, 13)
OLDER = (6, 7, 8)   # RHEL 8's python3 is 3.6


def vermin(paths: list[Path], *options: str) -> list[str]:
    """vermin's findings that need a Python newer than OLDEST, as `FILE:LINE:COL:PY2:PY3:FEATURE` lines."""
    done = subprocess.run([sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", f"--target={OLDEST}-",
                           "--violations", "--no-tips", "--no-config-file", "--format", "parsable", *options, "--",
                           *map(str, paths)],
                          capture_output=True, text=True, timeout=300, check=False)
    findings = [line for line in done.stdout.splitlines() if line.count(":") >= 5 and line.split(":")[1].isdigit()]
    assert done.returncode in (0, 1) and (done.returncode == 1) == bool(findings), done.stdout + done.stderr
    return findings


def interpreter(minor: int) -> str | None:
    """A Python 3.`minor` on this machine (PATH, the system's, pyenv's), or None."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = [shutil.which(f"python3.{minor}"), f"/usr/bin/python3.{minor}", f"/usr/local/bin/python3.{minor}",
                  *sorted(glob.glob(f"{pyenv}/versions/3.{minor}.*/bin/python3.{minor}"))]
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        try:
            done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == f"3.{minor}":
            return candidate
    return None


INTERPRETERS = {minor: interpreter(minor) for minor in (*OLDER, *MINORS)}


def lab_host(tmp_path: Path, python: str) -> tuple[dict, Path]:
    """A host as the lab simulates one (an HGX H100, driver 590.48.01 loaded, persistence on, fabric up), its
    nvidia-smi and dcgmi the lab's stand-ins run by `python`; returns (environment, config file)."""
    root = tmp_path / "host"
    lib = root / "usr/lib/gpuprov-lab"
    lib.mkdir(parents=True)
    (lib / "driver-version").write_text("590.48.01\n")
    (lib / "driver-cuda-version").write_text("13.1\n")
    (lib / "gpu-profiles.json").write_text(json.dumps(gpu_profiles_table()))
    (root / "etc/gpuprov-lab").mkdir(parents=True)
    (root / "etc/gpuprov-lab/profile").write_text("hgx-h100\n")
    (root / "etc/hostname").write_text("gpuprov-lab-01\n")
    state = root / "run/gpuprov-lab"
    state.mkdir(parents=True)
    (state / "loaded-driver").write_text("590.48.01\n")
    (state / "persistenced").write_text("")
    (state / "fabric-completed").write_text("")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("nvidia-smi", "dcgmi"):
        (tools / tool).write_text(f'#!/bin/sh\nexec {python} {standins.FILES / tool} "$@"\n')
        (tools / tool).chmod(0o755)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"host": "gpuprov-lab-01", "expect": {"gpu": "H100", "count": 8, "driver": "590.48.01",
                                                                       "form_factor": "sxm", "nvswitch": True}}))
    environment = {"PATH": f"{tools}:/usr/sbin:/usr/bin:/sbin:/bin", "GPUPROV_LAB_STANDIN_ROOT": str(root),
                   "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return environment, config

