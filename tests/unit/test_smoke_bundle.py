"""The suite as one file for a bare GPU machine (gpuprov/validation/bundle.py, standalone.py, `invoke
validate.bundle`): reproducible bytes, a stdlib zipapp, run by real interpreters other than the controller's with
no gpuprov and no PyYAML importable, the suite config the controller would send, NVSwitches found without lspci.

The judges: byte equality of two builds and the stdlib's own zipapp reader; pyenv's Python 3.9 (and 2.7 to 3.8 for
the refusal), which must fail to import gpuprov and yaml before the bundle runs there; the controller's strict
document schema (gpuprov/validation/document.py) and its own build_config for every model and topology; a real
`lspci -nn` capture (tests/fixtures/lspci) laid out as sysfs shows it; vermin for the front end's Python.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipapp
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.pythons import INTERPRETERS, MINORS, OLDER, lab_host, vermin

from gpuprov.catalog import models
from gpuprov.inventory import Host
from gpuprov.smoke import runner
from gpuprov.validation import bundle, standalone
from gpuprov.validation.document import suite_document
from gpuprov.validation.suite_config import build_config, validate_vars

REPO = Path(__file__).resolve().parents[2]
AZURE_A100 = REPO / "tests" / "fixtures" / "lspci" / "a100-sxm4-80gb-x8-azure-vm_lspci-nn.txt"
PY39 = INTERPRETERS[9]
# the published figure the catalog carries for 8x H100 with NVSwitch (NVIDIA/nccl-tests#212: "~480GB/s")
NCCL_TESTS_212_BUSBW = 480.0


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    return bundle.build(tmp_path_factory.mktemp("bundle") / "gpuprov-smoke.pyz")


def catalog_of(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("catalog.json"))


def quick_checks() -> set[str]:
    runner.discover()
    return {check.name for check in runner.select("quick", None)}


def bare_env(tmp_path: Path, **extra: str) -> dict:
    """No nvidia-smi, no PYTHONPATH, nothing of this checkout: only the system's tools."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", **extra}


def cannot_import(python: list[str], module: str, cwd: Path, env: dict) -> bool:
    done = subprocess.run([*python, "-c", f"import {module}"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    return done.returncode != 0 and "ModuleNotFoundError" in done.stderr


# ---- the file ------------------------------------------------------------------------------------------------------


def test_the_same_inputs_give_the_same_bytes_by_the_invoke_task_too(pyz, tmp_path):
    again = bundle.build(tmp_path / "again.pyz")
    assert again.read_bytes() == pyz.read_bytes()
    done = subprocess.run([sys.executable, "-m", "invoke", "validate.bundle", "--output", str(tmp_path / "task.pyz")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "task.pyz")
    assert (tmp_path / "task.pyz").read_bytes() == pyz.read_bytes()
    assert zipapp.get_interpreter(str(pyz)) == "/usr/bin/env python3"
    assert os.stat(pyz).st_mode & 0o777 == 0o755


def test_the_file_holds_the_suite_its_front_end_and_the_catalog(pyz):
    with zipfile.ZipFile(pyz) as archive:
        names = archive.namelist()
        assert archive.testzip() is None
    suite = sorted(p.name for p in (REPO / "gpuprov" / "smoke").glob("*.py"))
    assert names == ["__main__.py", "standalone.py", "catalog.json", *(f"smoke/{name}" for name in suite)]
    catalog = catalog_of(pyz)
    assert set(catalog["models"]) == set(models())
    yaml_sha = __import__("hashlib").sha256((REPO / "gpuprov/data/gpus.yaml").read_bytes()).hexdigest()
    assert catalog["source"] == f"gpuprov/data/gpus.yaml sha256 {yaml_sha}"


def test_the_front_end_needs_nothing_newer_than_3_9(tmp_path):
    main = tmp_path / "bundle__main__.py"
    main.write_bytes(bundle.MAIN)
    assert vermin([REPO / "gpuprov/validation/standalone.py", main], "--no-parse-comments") == []


@pytest.mark.interpreters
@pytest.mark.parametrize("minor", [pytest.param(m, marks=pytest.mark.skipif(
    INTERPRETERS[m] is None, reason=f"no Python 3.{m} here")) for m in OLDER])
def test_a_python_before_3_9_is_refused_in_words(pyz, tmp_path, minor):
    done = subprocess.run([INTERPRETERS[minor], str(pyz)], cwd=tmp_path, env=bare_env(tmp_path),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert re.fullmatch(rf"gpuprov-smoke: Python 3\.{minor}\.\d+ is too old: the suite needs Python 3\.9 or "
                        r"newer\n", done.stderr), done.stderr


@pytest.mark.parametrize("args, message", [
    (["--gpu", "H1000"], "--gpu H1000: not a model of the GPU catalog (keys: A10, A100-PCIE-40GB, "),
    (["--image", "img; rm -rf /"], "--image 'img; rm -rf /': must be an image reference like repo/name:tag"),
    (["--threshold-pct", "120"], "--threshold-pct 120: must be above 0 and at most 100"),
    (["--burn-in-seconds", "0"], "--burn-in-seconds 0: must be above 0 and at most a year"),
])
def test_bad_usage_is_exit_2_before_anything_runs(pyz, tmp_path, args, message):
    done = subprocess.run([sys.executable, "-I", str(pyz), *args], cwd=tmp_path,
                          env=bare_env(tmp_path, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"gpuprov-smoke: {message}"), done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.interpreters
@pytest.mark.parametrize("minor", [pytest.param(m, marks=pytest.mark.skipif(
    INTERPRETERS[m] is None, reason=f"no Python 3.{m} here")) for m in MINORS])
def test_every_supported_python_runs_the_front_end_isolated(pyz, tmp_path, minor):
    done = subprocess.run([INTERPRETERS[minor], "-I", str(pyz), "--gpu", "L40S", "--print-config"], cwd=tmp_path,
                          env=bare_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    assert (config["expect"]["gpu"], config["expect"]["form_factor"], config["container"]) == ("L40S", "pcie", None)


# ---- on a bare machine ---------------------------------------------------------------------------------------------


@pytest.mark.interpreters
@pytest.mark.skipif(PY39 is None, reason="no Python 3.9 on this machine (PATH, /usr/bin, pyenv)")
def test_python_3_9_runs_the_whole_quick_suite_without_gpuprov_or_yaml(pyz, tmp_path):
    env = bare_env(tmp_path)
    python = [PY39, "-I"]
    assert cannot_import(python, "gpuprov", tmp_path, env) and cannot_import(python, "yaml", tmp_path, env)
    document_path = tmp_path / "document.json"
    done = subprocess.run([*python, str(pyz), "--json", str(document_path), "--textfile", "metrics.prom"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    document = suite_document(json.loads(document_path.read_text()))   # the controller's strict schema
    assert f'gpuprov_check_ok{{host="{document["host"]}",check="host.shm"}} 1.0' in \
        (tmp_path / "metrics.prom").read_text().splitlines()   # relative to where it was asked, not the suite's
    assert document["versions"]["python"].startswith("3.9.")
    assert {r["check"] for r in document["results"]} == quick_checks()
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"gpuprov-smoke on {document['host']}: no GPU (the CPU fallback) (no NVSwitch), "
                               "level quick, ")
    assert "note: NVSwitch: no (0 NVSwitch PCI device(s) in /sys/bus/pci/devices)" in lines
    for r in document["results"]:
        assert f"{r['status'].upper():4} {r['check']} ({r['seconds']:.1f} s): {r['reason']}" in lines
    by_name = {r["check"]: r for r in document["results"]}
    assert by_name["tools.dcgm"]["reason"] == "dcgmi is not installed (DCGM)"
    assert by_name["tools.nccl_tests"]["reason"].startswith("nccl-tests is not installed")
    assert by_name["perf.matmul"]["reason"].startswith("torch is not importable")


@pytest.mark.interpreters
@pytest.mark.skipif(PY39 is None, reason="no Python 3.9 on this machine (PATH, /usr/bin, pyenv)")
def test_python_3_9_finds_the_gpus_nvidia_smi_lists_and_judges_an_hgx_h100(pyz, tmp_path):
    """The lab's simulated HGX H100 (its nvidia-smi answers as the real captures of an H100 80GB HBM3 do): the
    bundle names the model, counts the GPUs, and with --nvswitch yes (no NVSwitch in this machine's sysfs) judges
    NVLink and the fabric, and expects the all-reduce figure published for 8 H100 with NVSwitch."""
    env, _ = lab_host(tmp_path, PY39)
    python = [PY39, "-I", str(pyz), "--nvswitch", "yes"]
    config = json.loads(subprocess.run([*python, "--print-config"], cwd=tmp_path, env=env, capture_output=True,
                                       text=True, timeout=120, check=True).stdout)
    assert (config["expect"]["gpu"], config["expect"]["count"], config["gpus_visible"]) == ("H100-SXM", 8, True)
    assert config["expected"]["allreduce_busbw_gbs"] == NCCL_TESTS_212_BUSBW
    done = subprocess.run([*python, "--only", "host,tools", "--json", "-"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    document = suite_document(json.loads(done.stdout), config["datasheet"])
    assert document["versions"]["python"].startswith("3.9.")
    by_name = {r["check"]: r for r in document["results"]}
    for name in ("host.gpus", "host.nvlink", "host.fabric", "host.persistence", "host.ecc"):
        assert by_name[name]["status"] == "pass", by_name[name]
    head = f"gpuprov-smoke on {document['host']}: 8 x H100-SXM (with NVSwitch), level quick, "
    assert [line for line in done.stderr.splitlines() if line.startswith(head)]   # after the runner's progress


def torch_only(folder: Path) -> Path:
    """A folder with torch and the distributions it requires (symlinks into this Python's site-packages), so that
    an interpreter started without site (-S) sees torch and nothing else of this machine: no gpuprov, no yaml."""
    folder.mkdir()
    wanted, seen = ["torch"], set()
    while wanted:
        name = wanted.pop()
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        wanted += [re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0] for req in dist.requires or []
                   if "extra ==" not in req]
        for file in dist.files or []:
            top = file.parts[0]
            if top.endswith((".dist-info", ".data")) or top in ("..", "__pycache__") or "/" in top:
                continue
            source = Path(dist.locate_file(top))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    return folder


def test_torch_checks_on_the_cpu_with_torch_and_nothing_of_gpuprov(pyz, tmp_path):
    pytest.importorskip("torch")
    env = bare_env(tmp_path, PYTHONPATH=str(torch_only(tmp_path / "torch-only")))
    python = [sys.executable, "-S"]
    assert cannot_import(python, "gpuprov", tmp_path, env) and cannot_import(python, "yaml", tmp_path, env)
    done = subprocess.run([*python, str(pyz), "--only", "software,perf", "--json", "-"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    document = suite_document(json.loads(done.stdout))
    by_name = {r["check"]: r for r in document["results"]}
    assert set(by_name) == {"software", "perf.matmul", "perf.copy", "perf.allreduce"}
    matmul = by_name["perf.matmul"]
    assert matmul["status"] == "skip" and matmul["reason"].startswith("no GPU: measured on CPU")
    for figure in ("bf16_tflops", "fp16_tflops", "fp32_tflops"):
        assert matmul["figures"][figure] > 0
        assert f"    {figure}: {matmul['figures'][figure]:g} TFLOP/s" in done.stderr
    assert by_name["perf.copy"]["figures"]["d2d_gbs"] > 0
    assert f"    d2d_gbs: {by_name['perf.copy']['figures']['d2d_gbs']:g} GB/s" in done.stderr


# ---- the config the controller would send --------------------------------------------------------------------------


def test_the_config_is_the_controllers_for_every_model_and_topology(pyz):
    catalog = catalog_of(pyz)
    for key in [*models(), None]:
        for count in range(1, bundle.MAX_GPUS + 1):
            for nvswitch in (False, True):
                hardware = {"count": count, "nvswitch": nvswitch, **({"gpu": key} if key else {})}
                host = Host(name="gpu01", address="10.0.0.1", vars={"hardware": hardware})
                facts = {"nvidia_smi": {"gpus": [{"index": 0, "uuid": "GPU-0"}]}, "pci_gpus": []}
                controller = build_config(host, facts, None, validate_vars(host), level="burn-in", strict=True)
                mine = standalone.suite_config(catalog, host="gpu01", model=key, count=count, nvswitch=nvswitch,
                                               level="burn-in", strict=True, gpus_visible=True)
                assert mine == controller, (key, count, nvswitch)
    eight = standalone.suite_config(catalog, host="h", model="H100-SXM", count=8, nvswitch=True, level="quick",
                                    strict=False, gpus_visible=True)
    assert eight["expected"]["allreduce_busbw_gbs"] == NCCL_TESTS_212_BUSBW
    assert "nccl-tests/issues/212" in eight["expected_basis"]["allreduce_busbw_gbs"]
    one = standalone.suite_config(catalog, host="h", model="H200-SXM", count=1, nvswitch=False, level="quick",
                                  strict=False, gpus_visible=True, burn_in_seconds=600, threshold_pct=70,
                                  image="nvcr.io/nvidia/pytorch:25.04-py3")
    assert one["expected"]["allreduce_busbw_gbs"] is None
    assert (one["burn_in_seconds"], one["threshold_pct"]) == (600, 70)
    host = Host(name="h", address="10.0.0.1", vars={"hardware": {"gpu": "H200-SXM", "count": 1, "nvswitch": False},
                                                    "validate": {"image": "nvcr.io/nvidia/pytorch:25.04-py3"}})
    assert one["container"] == build_config(host, {}, None, validate_vars(host))["container"]


# ---- NVSwitch without lspci ----------------------------------------------------------------------------------------

LSPCI_NN = re.compile(r"(?P<address>\S+) (?P<kind>[^[]+) \[(?P<cls>[0-9a-f]{4})\]: .* \[(?P<vendor>[0-9a-f]{4}):"
                      r"(?P<device>[0-9a-f]{4})\]")


def sysfs_from_lspci(text: str, root: Path) -> list[re.Match]:
    """The devices of an `lspci -nn` capture as the kernel shows them in /sys/bus/pci/devices: a folder per
    device with `vendor`, `device` and `class` (class, subclass and programming interface, 0x068000)."""
    devices = [m for m in map(LSPCI_NN.match, text.splitlines()) if m]
    for match in devices:
        folder = root / (match["address"] if match["address"].count(":") == 2 else f"0000:{match['address']}")
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(f"0x{match['vendor']}\n")
        (folder / "device").write_text(f"0x{match['device']}\n")
        (folder / "class").write_text(f"0x{match['cls']}00\n")
    return devices


def test_nvswitches_and_gpus_are_found_in_sysfs_as_lspci_lists_them(pyz, tmp_path, monkeypatch):
    text = AZURE_A100.read_text()
    devices = sysfs_from_lspci(text, tmp_path / "devices")
    bridges = [m for m in devices if m["vendor"] == "10de" and m["kind"] == "Bridge" and m["cls"] == "0680"]
    gpus = [m for m in devices if m["vendor"] == "10de" and m["kind"] == "3D controller"]
    assert (len(bridges), len(gpus)) == (6, 8)   # what the capture shows
    catalog = catalog_of(pyz)
    found = standalone.pci_devices(str(tmp_path / "devices"))
    assert len(standalone.nvswitches(found, catalog)) == len(bridges)
    assert len(standalone.pci_gpus(found)) == len(gpus)
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvidia-smi: the GPUs are known from sysfs alone
    args = SimpleNamespace(gpu=None, nvswitch=None, level="quick", strict=False, burn_in_seconds=None,
                           threshold_pct=None, image=None)
    config, notes = standalone.describe(catalog, args, found)
    assert (config["expect"]["gpu"], config["expect"]["count"], config["expect"]["nvswitch"]) == \
        ("A100-SXM4-80GB", 8, True)
    assert config["gpus_visible"] is False
    assert f"NVSwitch: yes (6 NVSwitch PCI device(s) in {standalone.PCI_DEVICES})" in notes
    overridden, _ = standalone.describe(catalog, SimpleNamespace(**{**vars(args), "nvswitch": "no"}), found)
    assert overridden["expect"]["nvswitch"] is False


# ---- stopped -------------------------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


HANG = b"""import subprocess
import time

from .core import check


@check("test.hang", timeout=600)
def run(ctx):
    subprocess.Popen(["sleep", "600"])
    time.sleep(600)
"""


def test_a_stopped_bundle_takes_the_suite_and_its_running_check_down(pyz, tmp_path):
    """SIGTERM to the front end only (`kill PID`): the runner is told, kills the running check's process group
    (here a check that hangs with a child of its own), and the unpacked suite is removed."""
    hanging = tmp_path / "hanging.pyz"
    hanging.write_bytes(pyz.read_bytes())
    with zipfile.ZipFile(hanging, "a") as archive:
        archive.writestr("smoke/hang.py", HANG)
    front = subprocess.Popen([PY39 or sys.executable, "-I", str(hanging), "--only", "test.hang"], cwd=tmp_path,
                             env=bare_env(tmp_path, TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    check: list[int] = []
    while not check and time.monotonic() < deadline and front.poll() is None:
        suite = children(front.pid)
        forked = [pid for runner_pid in suite for pid in children(runner_pid)]   # the version probe, then the check
        started = [pid for pid in forked for pid in children(pid)]              # `sleep 600`, the check's child
        check = [*forked, *started] if started else []
        time.sleep(0.05)
    assert check, "the check never started"
    unpacked = [p for p in tmp_path.iterdir() if p.name.startswith("gpuprov-bundle-")]
    assert len(unpacked) == 1 and (unpacked[0] / "smoke" / "hang.py").is_file()
    front.send_signal(signal.SIGTERM)
    front.communicate(timeout=120)
    assert front.returncode == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while any(map(alive, [*suite, *check])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in [*suite, *check] if alive(pid)]
    assert not unpacked[0].exists()


# ---- bench/gpu_check.sh ----------------------------------------------------------------------------------------------


def test_the_gpu_script_says_what_the_machine_lacks_before_running(pyz, tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    script = str(REPO / "bench" / "gpu_check.sh")

    def run(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", script], env=bare_env(tmp_path, PYTHON=sys.executable, **env),
                              capture_output=True, text=True, timeout=120, check=False)

    done = run(BUNDLE=str(tmp_path / "none.pyz"))
    assert (done.returncode, done.stderr) == (2, f"gpu_check: no bundle at {tmp_path / 'none.pyz'}: build it with "
                                                 "'invoke validate.bundle' where gpuprov is installed\n")
    done = run(BUNDLE=str(pyz))
    assert (done.returncode, done.stderr) == (2, "gpu_check: no nvidia-smi on PATH: this machine has no NVIDIA "
                                                 "driver\n")
    (tools / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (tools / "nvidia-smi").chmod(0o755)
    done = run(BUNDLE=str(pyz), PATH=f"{tools}:/usr/bin:/bin")
    assert (done.returncode, done.stderr) == (2, f"gpu_check: {sys.executable} has no torch that sees a GPU (install "
                                                 "a CUDA build of torch, or set PYTHON)\n")
