"""A lab host's files under a temporary root and the lab's stand-in nvidia-smi run over them; the real captures
(tests/fixtures/) the simulation is judged against; lab stacks as the mirror builds packages for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuprov.lab import faults as lab_faults
from gpuprov.lab import standins
from gpuprov.lab.smi_answers import gpu_profiles_table

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CSV = FIXTURES / "nvidia-smi-query-csv"
H100 = "h100-sxm5-80gb_query-gpu-allfields_590.48.01_idle.csv"
L40S = "l40s_query-gpu-allfields_595.80_idle.csv"
NVLINK_H100 = FIXTURES / "nvidia-smi-nvlink/h100-sxm5-80gb_nvlink-s_590.48.01.txt"


def capture(name: str) -> tuple[list[str], list[str]]:
    """(header titles, values) of a real allfields capture."""
    header, row = (CSV / name).read_text().splitlines()[:2]
    return header.split(", "), row.split(", ")


def field_of(title: str) -> str:
    return title.split(" [")[0]


def make_root(tmp_path: Path, profile: str, driver: str, *, persistence: bool = False, fabric: bool = False,
              cuda: str = "13.1") -> Path:
    """A lab host's files for the simulated tools: the profile, a driver installed and loaded."""
    root = tmp_path / "host"
    lib = root / "usr/lib/gpuprov-lab"
    lib.mkdir(parents=True)
    (lib / "driver-version").write_text(driver + "\n")
    (lib / "driver-cuda-version").write_text(cuda + "\n")
    (lib / "gpu-profiles.json").write_text(json.dumps(gpu_profiles_table()))
    (root / "etc/gpuprov-lab").mkdir(parents=True)
    (root / "etc/gpuprov-lab/profile").write_text(profile + "\n")
    (root / "etc/hostname").write_text("gpuprov-lab-01\n")
    run = root / "run/gpuprov-lab"
    run.mkdir(parents=True)
    (run / "loaded-driver").write_text(driver + "\n")
    if persistence:
        (run / "persistenced").write_text("")
    if fabric:
        (run / "fabric-completed").write_text("")
    return root


def smi(root: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(root)}
    proc = subprocess.run([sys.executable, str(standins.FILES / "nvidia-smi"), *args], capture_output=True,
                          text=True, env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def ok(root: Path, *args: str) -> str:
    rc, out = smi(root, *args)
    assert rc == 0, out
    return out


def query(root: Path, fields: list[str], fmt: str = "csv,noheader") -> list[dict[str, str]]:
    """Every GPU's values of `fields` (csv, split as nvidia-smi joins them)."""
    out = ok(root, "--query-gpu=" + ",".join(fields), "--format=" + fmt)
    return [dict(zip(fields, line.split(", "), strict=True)) for line in out.splitlines()]


def set_faults(root: Path, *lines: str) -> None:
    (root / "etc/gpuprov-lab/faults").write_text(lab_faults.render(lines))


ALL_FIELDS = [field_of(t) for t in capture(H100)[0]]
VOLATILE = {"timestamp"}


def snapshot(root: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in query(root, ALL_FIELDS)]


def changes(before: list[dict], after: list[dict]) -> dict[tuple[int, str], str]:
    assert len(before) == len(after)
    return {(i, k): a[k] for i, (b, a) in enumerate(zip(before, after, strict=True)) for k in a if a[k] != b[k]}


KERNEL = "6.1.0-18-amd64"


def mirror_stack(branch: str, version: str, *, pinning: bool = False, fabric: bool = True, cuda: str = "12.8.1",
                 nccl: str = "2.26.2") -> dict:
    driver_pkgs = ([{"name": f"nvidia-driver-pinning-{branch}", "version": f"{version}-1"},
                    {"name": "nvidia-open", "version": f"{version}-1"}] if pinning
                   else [{"name": f"nvidia-open-{branch}", "version": f"{version}-1"}])
    dash = "-".join(cuda.split(".")[:2])
    return {
        "gpu": {"model": "H100-SXM"}, "os": "debian-12",
        "driver": {"branch": branch, "version": version, "kernel_modules": "open", "packages": driver_pkgs},
        "cuda": {"version": cuda, "packages": [{"name": f"cuda-toolkit-{dash}", "version": f"{cuda}-1"}]},
        "forward_compat": False,
        "nccl": {"version": nccl, "packages": [{"name": "libnccl2", "version": f"{nccl}-1+cuda12.8"},
                                               {"name": "libnccl-dev", "version": f"{nccl}-1+cuda12.8"}]},
        "container_toolkit": {"version": "1.17.8", "packages": [
            {"name": "nvidia-container-toolkit", "version": "1.17.8-1"},
            {"name": "nvidia-container-toolkit-base", "version": "1.17.8-1"}]},
        "fabricmanager": ({"version": version, "packages": [
            {"name": f"nvidia-fabricmanager-{branch}" if not pinning else "nvidia-fabricmanager",
             "version": f"{version}-1"}]} if fabric else None),
        "dcgm": {"version": "4.2.3", "packages": [{"name": "datacenter-gpu-manager-4-core", "version": "1:4.2.3-1"}]},
        "ngc_pytorch": None, "pytorch": None,
    }

