"""`invoke validate` on provisioned lab hosts over real SSH: the quick suite passes (on CPU, from the wheelhouse
the controller's pip makes), each simulated GPU fault fails exactly its check, a host made slower than its
identical peer is a fleet outlier, the two-host all-reduce runs and a host that cannot join is named, the
reports parse with a JUnit library and prometheus_client, and `--image` runs the suite in a container.

The module brings up two hgx-h100 hosts of its own, provisions them and builds their suite environments once;
every test leaves them healthy. Each validate run writes its reports into its own folder, so that the fleet
comparison sees only the runs a test means it to see. Expected reasons are the suite's documented verdicts on
the real tools' outputs (tests/fixtures/ for the simulated ones), never figures the lab makes up.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from labutil import copy_inventory, invoke, on_host

from gpuprov.lab import faults as lab_faults

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts
PROFILES = ["hgx-h100", "hgx-h100"]
VENV = "/opt/gpuprov/venv"
TEXTFILE = "/var/lib/prometheus/node-exporter/gpuprov_validate.prom"   # validate.textfile_dir's default
# What a healthy, provisioned hgx-h100 lab host passes (the rest are skips with their reason: no GPU device on a
# lab host, CPU torch, no nccl-tests, no kernel log in a container). torch.compile runs with the g++, gcc and Python
# headers validate installs from the lab mirror's Debian packages.
MUST_PASS = {"host.gpus", "host.driver", "host.persistence", "host.ecc", "host.nvlink", "host.fabric", "host.shm",
             "train.cnn", "train.transformer", "train.dataloader", "train.ddp", "train.compile", "infer.parity",
             "infer.latency", "tools.dcgm"}


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    """Two hgx-h100 hosts, provisioned (driver, fabric manager, DCGM, Docker, container toolkit) and with the
    suite's venv built from the wheelhouse; their names."""
    import gpuprov.lab

    state = gpuprov.lab.up(len(PROFILES), PROFILES, paths=lab.paths, fresh=True)
    folder = tmp_path_factory.mktemp("validate-run")
    env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
    started = time.monotonic()
    invoke("provision", "--inventory", str(state.inventory), "--all", env=env)
    print(f"provision of 2 hosts: {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    run = validate(env, "--all", "--only", "host.shm")   # builds the venvs (wheels uploaded, pip install)
    print(f"suite environments of 2 hosts: {time.monotonic() - started:.1f} s")
    assert all(h["env"]["installed"] and h["env"]["uploaded"] for h in run["hosts"]), run["hosts"]
    return state, env, [h.name for h in state.hosts]


def validate(env: dict, *args: str, check_code: int | None = 0, inventory=None) -> dict:
    """`invoke validate ... --json` with its reports in a folder of its own (no fleet history but its own)."""
    import tempfile

    reports = tempfile.mkdtemp(prefix="validate-", dir=env["INVOKE_GPUPROV_REPORTS"].rsplit("/", 1)[0])
    inventory_args = ("--inventory", str(inventory)) if inventory else ()
    proc = invoke("validate", *inventory_args, *args, "--json", check_code=check_code,
                  env={**env, "INVOKE_GPUPROV_REPORTS": reports})
    return json.loads(proc.stdout)


def results(run: dict, host: str) -> dict[str, dict]:
    entry = next(h for h in run["hosts"] if h["host"] == host)
    return {r["check"]: r for r in entry["results"]}


# ----------------------------------------------------------------------------------------------- the suite

@pytest.fixture(scope="module")
def quick(fleet):
    """The whole quick suite on the first host (its textfile placed there), and the clock (Unix time) before and
    after the run: what the run reports as its own time lies between. (How long it takes is bench/validate.py's
    measure, against a floor on the same host: a wall-time bound here would be a flake on a busy machine.)"""
    state, env, (first, _) = fleet
    before = time.time()
    run = validate(env, "--host", first)
    return run, (before, time.time())


def test_the_quick_suite_passes_on_a_provisioned_host(fleet, quick):
    state, _, (first, _) = fleet
    run, (before, after) = quick
    [entry] = run["hosts"]
    assert entry["error"] is None and entry["env"]["mode"] == "venv"
    assert entry["level"] == "quick" and before <= entry["started"] <= after
    assert not entry["env"]["installed"] and not entry["env"]["uploaded"]   # the fixture's venv, untouched
    found = results(run, first)
    statuses = {name: r["status"] for name, r in found.items()}
    assert set(statuses.values()) <= {"pass", "skip"}, {n: found[n]["reason"] for n in found
                                                                if statuses[n] not in ("pass", "skip")}
    assert {name for name, status in statuses.items() if status == "pass"} >= MUST_PASS, statuses
    assert all(r["reason"].strip() for r in found.values())
    # GPU-only judgements are skips that say why, never passes
    assert found["perf.matmul"]["reason"].startswith("no GPU: measured on CPU, not judged against the datasheet")
    assert found["perf.matmul"]["figures"]["fp32_tflops"] > 0
    assert found["tools.dcgm"]["reason"] == "dcgmi diag -r 1: 1 tests passed"
    assert found["infer.parity"]["figures"]["compared"] == ["compile", "onnx"]
    assert entry["versions"]["torch"].startswith("2.13.0") and entry["versions"]["dcgm"]
    # the venv was byte-compiled at install (compileall), so the suite (python -B) imports torch from .pyc files
    on_host(state, first, "ls /opt/gpuprov/venv/lib/python3*/site-packages/torch/__pycache__/__init__.cpython-3*.pyc")


def test_the_junit_report_parses_with_a_junit_library(fleet, quick):
    from junitparser import Failure, JUnitXml, Skipped

    _, _, (first, _) = fleet
    run, _ = quick
    xml = JUnitXml.fromfile(run["junit"])
    [suite] = list(xml)
    assert suite.name == first
    cases = {case.name: case for case in suite}
    assert set(cases) == set(results(run, first))
    for name, result in results(run, first).items():
        kinds = [type(item) for item in cases[name].result]
        assert kinds == ([Skipped] if result["status"] == "skip" else []), name
        assert Failure not in kinds
    assert suite.failures == 0 and suite.errors == 0 and suite.skipped == sum(
        1 for r in results(run, first).values() if r["status"] == "skip")


def test_the_textfile_on_the_host_parses_with_prometheus_client(fleet, quick):
    from prometheus_client.parser import text_string_to_metric_families

    state, _, (first, _) = fleet
    run, (before, after) = quick
    [entry] = run["hosts"]
    assert entry["textfile"] == {"path": TEXTFILE}
    text = on_host(state, first, f"cat {TEXTFILE}")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ok = {s.labels["check"]: s.value for s in families["gpuprov_check_ok"].samples}
    assert ok == {name: 1.0 if r["status"] == "pass" else 0.0 for name, r in results(run, first).items()}
    assert {s.labels["host"] for f in families.values() for s in f.samples} == {first}
    matmul = {s.labels["dtype"]: s.value for s in families["gpuprov_matmul_tflops"].samples}
    assert set(matmul) == {"bf16", "fp16", "fp32"} and all(v > 0 for v in matmul.values())
    # this run's time (the textfile is this run's, not one left from before); whole seconds at most rounded away
    [stamp] = [s.value for s in families["gpuprov_validate_timestamp_seconds"].samples]
    assert int(before) <= stamp <= after + 1
    # written atomically: nothing but the textfile in node_exporter's folder
    assert on_host(state, first, f"ls -A {TEXTFILE.rsplit('/', 1)[0]}").split() == ["gpuprov_validate.prom"]


# ---------------------------------------------------------------------------------------------- torch.compile

def test_torch_compile_passes_with_the_compiler_validate_installs_from_the_mirror(fleet):
    """A lab host has no compiler; validate installs g++, gcc and the headers of the host's own python3 from the lab
    mirror (Debian's packages, as a real host gets them from its repository), and both compile checks then pass
    (TorchInductor compiles C++ with g++ against Python.h). A second run installs nothing."""
    state, env, (_, second) = fleet
    version = on_host(state, second, "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'").strip()
    packages = ["g++", "gcc", f"python{version}-dev"]
    assert on_host(state, second, "command -v g++ gcc || echo none").strip() == "none"
    # --dry-run says what it would install, and how, and installs nothing
    shown = invoke("validate", "--host", second, "--only", "train.compile", "--dry-run", env=env).stdout
    assert shown.splitlines()[-1] == (f"{second}: torch.compile: install {' '.join(packages)}: DEBIAN_FRONTEND="
                                      "noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 install "
                                      f"--no-install-recommends {' '.join(packages)}")
    assert on_host(state, second, "command -v g++ gcc || echo none").strip() == "none"
    run = validate(env, "--host", second, "--only", "train.compile,infer.parity", "--no-textfile")
    [entry] = run["hosts"]
    assert entry["env"]["compiler"]["installed"] == packages and entry["env"]["compiler"]["refused"] == ""
    status = on_host(state, second, "dpkg-query -W -f='${db:Status-Abbrev}${Package}\\n' " + " ".join(packages))
    assert sorted(status.split("\n")[:-1]) == sorted(f"ii {name}" for name in packages)
    include = on_host(state, second, "python3 -c 'import sysconfig; print(sysconfig.get_path(\"include\"))'").strip()
    on_host(state, second, f"test -f {include}/Python.h")
    for again in (run, validate(env, "--host", second, "--only", "train.compile,infer.parity", "--no-textfile")):
        found = results(again, second)
        assert found["train.compile"]["status"] == "pass", found["train.compile"]["reason"]
        assert found["infer.parity"]["status"] == "pass", found["infer.parity"]["reason"]
        assert found["infer.parity"]["figures"]["compared"] == ["compile", "onnx"]
        assert found["train.compile"]["figures"]["first_loss_compiled"] > 0
    [entry] = again["hosts"]
    assert entry["env"]["compiler"] == {"missing": [], "packages": [], "command": "", "refused": "", "installed": []}
    assert not entry["env"]["installed"] and not entry["env"]["uploaded"]
    # TorchInductor's kernels are kept in root's own folder, never in /tmp/torchinductor_root (others can write /tmp)
    assert on_host(state, second, "stat -c '%U %a' /opt/gpuprov/cache").split() == ["root", "700"]
    assert on_host(state, second, "find /opt/gpuprov/cache/torchinductor -name '*.so'").split()
    assert on_host(state, second, "find /tmp -path '/tmp/torchinductor_*' -type f").split() == []


# ------------------------------------------------------------------------------------------------- faults

# (fault, the check that must fail, what its reason says): the suite's verdicts on what the real nvidia-smi
# shows for each fault (tests/fixtures/: the captures' fields and NVML's error messages)
FAULTS = [
    ("gpu-missing", "host.gpus", "7 GPUs on the host, the inventory says 8"),
    ("ecc-uncorrectable 2", "host.ecc", "GPU 2 (00000000:3A:00.0): 1 uncorrectable ECC errors since the driver "
                                        "loaded"),
    ("row-remap-pending 1", "host.ecc", "GPU 1 (00000000:2A:00.0): row remap pending"),
    ("throttle 3", "host.clocks", "clocks held down at idle: 00000000:5D:00.0: HW slowdown"),
    ("pcie-x8 0", "host.pcie", "PCIe link trained below its width: 00000000:18:00.0 at x8 of x16"),
    ("nvlink-down 1", "host.nvlink", "NVLink down: GPU 1: NVML: Unable to retrieve NVLink information as all "
                                     "links are inactive"),
    ("driver-mismatch", "host.driver", "driver/library version mismatch"),
    ("gpu-process 4", "host.gpus", "GPUs are in use, so no measurement here is trustworthy: GPU 4 "
                                   "(00000000:9A:00.0) runs pid 4242 python3 (1024 MiB)"),
]


@pytest.mark.parametrize("fault,check,reason", FAULTS, ids=[f[0].split()[0] for f in FAULTS])
def test_each_fault_fails_exactly_its_check(fleet, fault, check, reason):
    state, env, (first, _) = fleet
    with lab_faults.injected(state.host(first), fault):
        run = validate(env, "--host", first, "--only", "host", "--no-textfile", check_code=1)
    found = results(run, first)
    failed = {name: r["reason"] for name, r in found.items() if r["status"] == "fail"}
    assert list(failed) == [check], failed
    assert failed[check].startswith(reason), failed[check]
    # what the fault hides is a skip naming the check that judges it, never a pass
    if fault == "driver-mismatch":
        assert all(r["status"] == "skip" and r["reason"].endswith("judged by host.driver")
                   for name, r in found.items() if name in ("host.gpus", "host.ecc", "host.nvlink"))


# ----------------------------------------------------------------------------------------- fleet outliers

def test_a_slower_host_with_one_peer_is_not_judged_by_the_fleet(fleet, tmp_path):
    """A CPU quota on the second host's container (a quarter of a CPU, in 10 ms periods, so that even the short
    matmuls of the lab wait for it): its matmul figures may fall far below the first host's, but one peer is no fleet
    (a verdict needs three: gpuprov.validation.fleet.MIN_PEERS; the verdicts are unit-tested in
    tests/unit/test_validation_fleet.py), so neither host is judged, and each says why."""
    state, env, (first, second) = fleet

    def generous(document):   # lab hosts share the controller's CPUs: only a large gap is deterministic
        document["groups"]["lab"]["vars"]["validate"]["outlier_pct"] = 30

    inventory = copy_inventory(state, tmp_path, edit=generous)
    container = state.host(second).container_id
    subprocess.run(["docker", "update", "--cpu-period", "10000", "--cpu-quota", "2500", container], check=True,
                   capture_output=True)
    try:
        run = validate(env, "--all", "--only", "perf.matmul", "--no-textfile", inventory=inventory)
    finally:
        subprocess.run(["docker", "update", "--cpu-quota", "-1", container], check=True, capture_output=True)
    slow, fast = results(run, second)["fleet.perf.matmul"], results(run, first)["fleet.perf.matmul"]
    for judged in (slow, fast):
        assert judged["status"] == "skip" and judged["reason"].startswith(
            "only 1 other H100-SXM (CPU, quick) host to compare with, at least 3 needed"), judged["reason"]
        assert judged["thresholds"] == {"max_below_fleet_median_pct": 30, "hosts": 1, "min_hosts": 3}
    # both measured (whether the quota slows the suite's processes depends on the cgroup they land in, which the
    # host's systemd decides: the size of the gap is not asserted, only that no verdict came from it)
    assert slow["figures"]["fp32_tflops"] > 0 and fast["figures"]["fp32_tflops"] > 0
    # the datasheet alone would not have caught it: on CPU perf.matmul is measured, not judged
    assert results(run, second)["perf.matmul"]["status"] == "skip"


# ---------------------------------------------------------------------------------------------- multi-node

def test_the_two_host_all_reduce_passes(fleet):
    state, env, (first, second) = fleet
    run = validate(env, "--group", "hgx-h100", "--multi-node", "--only", "host.shm", "--no-textfile")
    summary = run["multi_node"]
    assert summary["status"] == "pass", summary
    assert summary["rendezvous"] == f"{state.host(first).internal_ip}:29400"
    for name in (first, second):
        allreduce = results(run, name)["multinode.allreduce"]
        assert allreduce["reason"].startswith("all-reduce over 2 nodes (2 processes, gloo) correct; bus bandwidth ")
        assert allreduce["figures"]["wrong_elements"] == 0 and allreduce["figures"]["busbw_gbs"] > 0


def test_a_host_that_cannot_join_is_named(fleet, tmp_path):
    state, env, (first, second) = fleet
    wrong = state.host(first).internal_ip   # the first host's address is not the second's

    def misaddressed(document):
        document["hosts"][second]["vars"]["cluster_address"] = wrong

    inventory = copy_inventory(state, tmp_path, edit=misaddressed)
    run = validate(env, "--group", "hgx-h100", "--multi-node", "--only", "host.shm", "--no-textfile",
                   check_code=1, inventory=inventory)
    summary = run["multi_node"]
    assert summary["status"] == "fail" and list(summary["not_joined"]) == [second]
    assert summary["not_joined"][second].startswith(f"its cluster_address {wrong} is not an address of this host")
    assert f"did not join the rendezvous at {wrong}:29400: {second} (" in results(run, first)[
        "multinode.allreduce"]["reason"]


# ------------------------------------------------------------------------------------------------- --image

def test_image_runs_the_suite_in_a_container_on_the_host(fleet):
    from gpuprov.lab.nested import ensure_image

    state, env, (first, _) = fleet
    # an image of the host's own Python with the suite's venv first on PATH (lab hosts reach no registry)
    image = ensure_image(state.host(first), extra_paths=[VENV, "/opt/gpuprov/smoke"], path_first=[f"{VENV}/bin"])
    run = validate(env, "--host", first, "--image", image, "--only", "host.gpus,host.container,train.cnn",
                   "--no-textfile")
    [entry] = run["hosts"]
    assert entry["env"] == {"mode": "image", "image": image} and entry["image"] == image
    found = results(run, first)
    assert {name: r["status"] for name, r in found.items()} == {"host.gpus": "pass", "host.container": "pass",
                                                                "train.cnn": "pass"}
    assert found["host.container"]["reason"] == f"docker with {image} sees all 8 GPUs (the suite ran inside it)"
    assert entry["versions"]["torch"].startswith("2.13.0")
