"""The lab's stand-in dcgmi: `dcgmi diag -r N -j` in DCGM 4's JSON layout, read by the suite's tools.dcgm.

The layout expected here is DCGM's own (NVIDIA/DCGM testing/python3/dcgm_diag_schema.json: the root
"DCGM Diagnostic" with test_categories[].tests[] of name, results[] (entity_group, entity_group_id, entity_id,
status) and test_summary.status; entity_groups[].entities[] of entity_id and device_id; metadata.version;
dcgmi/Diag.cpp: GPU results in entity group "GPU", id 1 (DCGM_FE_GPU), device_id the PCI device id as 4 hex
digits), and the run levels of DCGM's documentation; the H100's PCI device id 2330 is the capture's
(pci.device_id 0x233010DE).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.lab import make_root

from gpuprov.lab import standins
from gpuprov.smoke import tools_dcgm
from gpuprov.smoke.core import Context

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures/nvidia-smi-query-csv/" \
    "h100-sxm5-80gb_query-gpu-allfields_590.48.01_idle.csv"
LEVELS = {1: {"Deployment": ["software"]},
          2: {"Deployment": ["software"], "Integration": ["pcie"], "Hardware": ["memory"]},
          3: {"Deployment": ["software"], "Integration": ["pcie"], "Hardware": ["memory", "diagnostic"],
              "Stress": ["targeted_stress", "targeted_power", "memory_bandwidth"]}}


def tools(tmp_path: Path, root: Path) -> dict:
    """PATH with the stand-in dcgmi (version 4.4.1) and nvidia-smi reading the lab host files at `root`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dcgmi = bin_dir / "dcgmi"
    dcgmi.write_text((standins.FILES / "dcgmi").read_text().replace("@VERSION@", "4.4.1"))
    dcgmi.chmod(0o755)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {standins.FILES / 'nvidia-smi'} \"$@\"\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GPUPROV_LAB_STANDIN_ROOT": str(root)}


def dcgmi(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(Path(env["PATH"].split(os.pathsep)[0]) / "dcgmi"), *args],
                          capture_output=True, text=True, env=env, check=False)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_diag_json_has_dcgms_layout_for_each_level(tmp_path, level):
    env = tools(tmp_path, make_root(tmp_path, "hgx-h100", "590.48.01", persistence=True, fabric=True))
    done = dcgmi(env, "diag", "-r", str(level), "-j")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('{\n   "DCGM Diagnostic" : {')   # jsoncpp's styled output
    document = json.loads(done.stdout)
    assert set(document) == {"DCGM Diagnostic", "entity_groups", "metadata"}
    categories = document["DCGM Diagnostic"]["test_categories"]
    assert {c["category"]: [t["name"] for t in c["tests"]] for c in categories} == LEVELS[level]
    for test in (t for c in categories for t in c["tests"]):
        assert test["test_summary"] == {"status": "Pass"}
        assert test["results"] == [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": i, "status": "Pass"}
                                   for i in range(8)]
    (group,) = document["entity_groups"]
    assert (group["entity_group"], group["entity_group_id"]) == ("GPU", 1)
    assert [e["entity_id"] for e in group["entities"]] == list(range(8))
    assert CAPTURE.read_text().splitlines()[1].count("0x233010DE") == 1     # the H100's PCI device id
    assert {e["device_id"] for e in group["entities"]} == {"2330"}
    assert all(len(e["serial_num"]) == 13 for e in group["entities"])
    assert document["metadata"] == {"version": "4.4.1", "Driver Version Detected": "590.48.01"}


def test_the_suite_passes_a_healthy_lab_host(tmp_path, monkeypatch):
    env = tools(tmp_path, make_root(tmp_path, "hgx-h100", "590.48.01", persistence=True, fabric=True))
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("GPUPROV_LAB_STANDIN_ROOT", env["GPUPROV_LAB_STANDIN_ROOT"])
    result = tools_dcgm.run(Context({"level": "quick"}))
    assert (result.status, result.reason) == ("pass", "dcgmi diag -r 1: 1 tests passed")
    assert result.figures["dcgm_version"] == "4.4.1" and result.figures["pass"] == ["software"]


def test_a_driver_mismatch_is_dcgms_runtime_error_and_fails_the_check(tmp_path, monkeypatch):
    root = make_root(tmp_path, "hgx-h100", "590.48.01")
    (root / "etc/gpuprov-lab/faults").write_text("driver-mismatch\n")
    env = tools(tmp_path, root)
    done = dcgmi(env, "diag", "-r", "1", "-j")
    assert json.loads(done.stdout) == {"DCGM Diagnostic": {
        "version": "4.4.1", "runtime_error": "Error: Failed to initialize NVML: Driver/library version mismatch"}}
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("GPUPROV_LAB_STANDIN_ROOT", str(root))
    result = tools_dcgm.run(Context({"level": "quick"}))
    assert result.status == "fail"
    assert result.reason == ("dcgmi diag -r 1 could not run: Error: Failed to initialize NVML: Driver/library "
                             "version mismatch")


def test_version_and_unsimulated_commands(tmp_path):
    env = tools(tmp_path, make_root(tmp_path, "hgx-h100", "590.48.01"))
    assert dcgmi(env, "--version").stdout == "dcgmi  version: 4.4.1\n"
    done = dcgmi(env, "diag", "-r", "9", "-j")
    assert done.returncode == 2 and "only -r 1|2|3|4 is simulated" in done.stderr
