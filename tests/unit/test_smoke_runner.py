"""The suite's runner (gpuprov/smoke/runner.py): discovery, selection, isolation, timeouts, --strict, the JSON.

Process-level behaviour is tested on a copy of the suite's core files in a plain folder named `smoke` (how it is
copied to a host), with small check modules written for the test: one that hangs and leaves a grandchild
behind, one that raises, one that does not import, one that returns an invalid result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov.smoke import runner
from gpuprov.smoke.core import REGISTRY, Result

SUITE = Path(runner.__file__).resolve().parent
REPO = SUITE.parents[1]
MINE = ["host.gpus", "host.driver", "host.persistence", "host.ecc", "host.pcie", "host.nvlink", "host.fabric",
        "host.clocks", "host.xid", "host.shm", "host.container", "sizing", "software", "tools.dcgm",
        "tools.nccl_tests"]
RESULT_KEYS = {"check", "status", "reason", "figures", "thresholds", "seconds"}


def validate_document(doc: dict) -> None:
    """The runner's one JSON document, as the controller reads it (runner.py's docstring)."""
    assert set(doc) == {"schema", "host", "level", "strict", "started", "seconds", "versions", "results"}
    assert doc["schema"] == 1
    assert isinstance(doc["host"], str) and doc["host"]
    assert doc["level"] in ("quick", "burn-in")
    assert isinstance(doc["strict"], bool)
    assert doc["started"].endswith("+00:00") and "T" in doc["started"]
    assert isinstance(doc["seconds"], float | int) and doc["seconds"] >= 0
    assert {"python", "torch", "cuda", "cudnn", "nccl", "onnxruntime", "driver"} <= set(doc["versions"])
    assert isinstance(doc["results"], list)
    for result in doc["results"]:
        assert set(result) == RESULT_KEYS, result
        assert result["status"] in ("pass", "fail", "skip", "warn")
        assert isinstance(result["reason"], str) and result["reason"]
        assert isinstance(result["figures"], dict) and isinstance(result["thresholds"], dict)
        assert isinstance(result["seconds"], float | int)


# ---- in process ---------------------------------------------------------------------------------------------------


def test_discovery_lists_every_module_but_the_runners_own():
    names = runner.module_names()
    for module in ("host_gpus", "host_driver", "host_persistence", "host_ecc", "host_pcie", "host_nvlink",
                   "host_fabric", "host_clocks", "host_xid", "host_shm", "host_container", "sizing", "software",
                   "tools_dcgm", "tools_nccl_tests", "nvsmi", "xid", "load"):
        assert module in names
    assert not {"core", "runner", "__main__", "__init__"} & set(names)
    owners, failures = runner.discover()
    mine = {"host_gpus", "host_driver", "host_persistence", "host_ecc", "host_pcie", "host_nvlink", "host_fabric",
            "host_clocks", "host_xid", "host_shm", "host_container", "sizing", "software", "tools_dcgm",
            "tools_nccl_tests", "nvsmi", "xid", "load"}
    assert not [f for f in failures if f.check.split(":", 1)[1] in mine]
    for name in MINE:
        assert name in REGISTRY
    assert owners["host.ecc"] == "host_ecc" and owners["tools.nccl_tests"] == "tools_nccl_tests"


def test_select_by_level_and_only():
    runner.discover()
    quick = [c.name for c in runner.select("quick", None)]
    assert quick.index("host.gpus") < quick.index("sizing") < quick.index("software") < quick.index("tools.dcgm")
    assert [c.name for c in runner.select("quick", "host.ecc,sizing")] == ["host.ecc", "sizing"]
    hosts = [c.name for c in runner.select("quick", "host")]
    assert hosts and all(n.startswith("host.") for n in hosts) and "host.xid" in hosts
    with pytest.raises(runner.UsageError, match="no such check"):
        runner.select("quick", "host.nope")


def test_strict_turns_skip_and_warn_into_fail():
    skip = runner.apply_strict(Result("host.nvlink", "skip", "no NVLink expected", {"a": 1}, {}, 0.1))
    assert (skip.status, skip.reason, skip.figures) == ("fail", "strict: no NVLink expected", {"a": 1})
    assert runner.apply_strict(Result("sizing", "warn", "2 CPUs per GPU")).reason == "strict: 2 CPUs per GPU"
    assert runner.apply_strict(Result("host.shm", "pass", "ok")).status == "pass"


# ---- the real suite, end to end -----------------------------------------------------------------------------------


def run_suite(tmp_path: Path, config: dict, *args: str, timeout: float = 240) -> tuple[int, dict, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "gpuprov.smoke", "--config", str(path), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout + done.stderr  # ONE JSON document on stdout
    return done.returncode, json.loads(lines[0]), done.stderr


def test_suite_json_document_and_exit_code(tmp_path):
    config = {"host": "gpu01", "expect": {"gpu": "L40S", "form_factor": "pcie"}, "shm_min_gib": 0.001,
              "workload": None, "data_dir": None}
    rc, doc, stderr = run_suite(tmp_path, config, "--only", "host.shm,host.nvlink,sizing")
    validate_document(doc)
    assert (doc["host"], doc["level"], doc["strict"]) == ("gpu01", "quick", False)
    assert [(r["check"], r["status"]) for r in doc["results"]] == [
        ("host.nvlink", "skip"), ("host.shm", "pass"), ("sizing", "skip")]
    assert rc == 0
    assert "host.shm: pass" in stderr  # progress goes to stderr


def test_suite_strict_and_level(tmp_path):
    config = {"host": "gpu01", "level": "burn-in", "expect": {"form_factor": "pcie"}}
    rc, doc, _ = run_suite(tmp_path, config, "--only", "host.nvlink", "--strict")
    validate_document(doc)
    assert doc["level"] == "burn-in" and doc["strict"] is True
    (result,) = doc["results"]
    assert result["status"] == "fail" and result["reason"].startswith("strict: ")
    assert rc == 1


def test_suite_usage_errors(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    done = subprocess.run([sys.executable, "-m", "gpuprov.smoke", "--config", str(path), "--only", "host.nope"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and "no such check" in done.stderr
    done = subprocess.run([sys.executable, "-m", "gpuprov.smoke", "--config", str(tmp_path / "absent.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot read the config" in done.stderr


# ---- process isolation on a plain-folder copy of the suite ----------------------------------------------------------

HANG = """
    import os, subprocess, time
    from .core import check

    @check("test.hang", timeout={timeout})
    def run(ctx):
        child = subprocess.Popen(["sleep", "300"])
        with open(ctx.config["pid_file"], "w") as handle:
            handle.write(str(child.pid))
        time.sleep(300)
"""
MODULES = {
    "boom.py": """
        from .core import check

        @check("test.boom", timeout=30)
        def run(ctx):
            raise RuntimeError("boom")
    """,
    "broken.py": "def broken(:\n",
    "liar.py": """
        from .core import Result, check

        @check("test.liar", timeout=30)
        def run(ctx):
            return Result("test.liar", "great", "all good")
    """,
    "fine.py": """
        from .core import Result, check

        @check("test.fine", timeout=30)
        def run(ctx):
            return Result("test.fine", "pass", "fine", {"level": ctx.level})

        @check("test.burnin", timeout=30, levels=("burn-in",))
        def burn(ctx):
            return Result("test.burnin", "pass", "burn-in only")
    """,
    "soak.py": """
        import time

        from .core import Result, check

        def soak_seconds(config):
            return float(config.get("burn_in_seconds") or 0) if config.get("level") == "burn-in" else 0.0

        @check("test.soak", timeout=1, levels=("burn-in",), load=soak_seconds)
        def run(ctx):
            time.sleep(soak_seconds(ctx.config) + ctx.config.get("overrun_s", 0))
            return Result("test.soak", "pass", "soaked")
    """,
}


def plain_suite(tmp_path: Path, hang_timeout: float = 2) -> Path:
    """A folder /…/suite/smoke/ with the suite's core files and the test modules: how a host holds it."""
    folder = tmp_path / "suite" / "smoke"
    folder.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "core.py", "isolation.py", "runner.py", "textfile.py"):
        shutil.copy(SUITE / name, folder / name)
    (folder / "hang.py").write_text(textwrap.dedent(HANG.format(timeout=hang_timeout)))
    for name, text in MODULES.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder.parent


def start_plain(root: Path, config: dict, *args: str) -> subprocess.Popen:
    path = root / "config.json"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.Popen([sys.executable, "-m", "smoke", "--config", str(path), *args], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


def test_hanging_check_is_killed_with_its_children_at_its_timeout(tmp_path):
    root = plain_suite(tmp_path, hang_timeout=2)
    pid_file = tmp_path / "sleep.pid"
    proc = start_plain(root, {"host": "h", "pid_file": str(pid_file)})
    out, err = proc.communicate(timeout=120)   # a runner that waited for the hung check would overrun this
    doc = json.loads(out)
    validate_document(doc)
    results = {r["check"]: r for r in doc["results"]}
    hang = results["test.hang"]
    assert hang["status"] == "fail" and hang["reason"].startswith("timed out after 2 s")
    assert hang["seconds"] >= 2   # it was given its whole timeout
    assert hang["thresholds"] == {"timeout_s": 2}
    assert wait_gone(int(pid_file.read_text())), "the hung check's own child survived it"
    assert results["test.boom"]["status"] == "fail"
    assert results["test.boom"]["reason"].startswith("the check raised RuntimeError: boom (at boom.py:")
    assert results["import:broken"]["status"] == "fail"
    assert results["import:broken"]["reason"].startswith("module broken.py does not import: SyntaxError")
    assert results["test.liar"]["reason"] == "the check returned an invalid result (unknown status 'great')"
    fine = dict(results["test.fine"], seconds=None)
    assert fine == {"check": "test.fine", "status": "pass", "reason": "fine", "figures": {"level": "quick"},
                    "thresholds": {}, "seconds": None}
    assert "test.burnin" not in results
    assert proc.returncode == 1


def test_level_from_the_command_line_and_only(tmp_path):
    root = plain_suite(tmp_path)
    proc = start_plain(root, {"host": "h", "level": "quick"}, "--level", "burn-in", "--only", "test.burnin,test.fine")
    out, _ = proc.communicate(timeout=120)
    doc = json.loads(out)
    assert doc["level"] == "burn-in"
    by_check = {r["check"]: r for r in doc["results"]}
    assert by_check["test.fine"]["figures"] == {"level": "burn-in"}
    assert by_check["test.burnin"]["status"] == "pass"
    assert proc.returncode == 1  # import:broken is always reported


def test_a_burn_in_of_any_length_is_not_cut_by_the_checks_timeout(tmp_path):
    """A check with a load of its own (perf.matmul's burn-in) gets the config's burn-in time on top of its timeout:
    a 3 s soak under a 1 s timeout passes; one that overruns its soak is still killed, at 1 + 3 s."""
    root = plain_suite(tmp_path)
    config = {"host": "h", "level": "burn-in", "burn_in_seconds": 3}
    (tmp_path / "config.json").write_text(json.dumps(config))
    listing = subprocess.run([sys.executable, "-m", "smoke", "--config", str(tmp_path / "config.json"), "--list"],
                             cwd=root, capture_output=True, text=True, timeout=120)
    assert "test.soak\ttimeout 4 s\tlevels burn-in" in listing.stdout.splitlines()
    out, _ = start_plain(root, config, "--only", "test.soak").communicate(timeout=120)
    (soak,) = [r for r in json.loads(out)["results"] if r["check"] == "test.soak"]
    assert (soak["status"], soak["reason"]) == ("pass", "soaked") and soak["seconds"] >= 3
    out, _ = start_plain(root, {**config, "overrun_s": 30}, "--only", "test.soak").communicate(timeout=120)
    (soak,) = [r for r in json.loads(out)["results"] if r["check"] == "test.soak"]
    assert soak["status"] == "fail" and soak["reason"].startswith("timed out after 4 s")


def test_perf_matmul_is_given_the_burn_in_it_advertises():
    """The burn-in time the inventory sets (validate.burn_in_seconds, up to a year) is added to perf.matmul's
    own 300 s; the suite's default burn-in is a minute; quick adds nothing."""
    runner.discover()
    matmul = REGISTRY["perf.matmul"]
    assert matmul.timeout_for({"level": "quick", "burn_in_seconds": 1800}) == 300
    assert matmul.timeout_for({"level": "burn-in", "burn_in_seconds": 1800}) == 300 + 1800
    assert matmul.timeout_for({"level": "burn-in"}) == 300 + 60


def test_the_controller_waits_for_the_burn_in_too():
    """validate's wait for the whole suite on a host grows by the burn-in the host's config asks."""
    from gpuprov.validation.suite import TIMEOUTS, run_suite
    from gpuprov.validation.suite_config import load_seconds

    assert load_seconds({"level": "burn-in", "burn_in_seconds": 1800}) == 1800
    assert load_seconds({"level": "burn-in"}) == 60
    assert load_seconds({"level": "quick", "burn_in_seconds": 1800}) == 0
    asked = {}

    class Remote:
        name = "gpu01"

        def run(self, command, **options):
            asked.update(options)
            return SimpleNamespace(stdout=json.dumps({"schema": 1, "results": []}), stderr="", rc=0,
                                   shown_command=lambda: command)

    run_suite(Remote(), "python -m smoke", "burn-in", None, load_seconds({"level": "burn-in",
                                                                          "burn_in_seconds": 1800.5}))
    assert asked["timeout"] == TIMEOUTS["burn-in"] + 1801


def test_terminating_the_runner_kills_the_running_check(tmp_path):
    root = plain_suite(tmp_path, hang_timeout=120)
    pid_file = tmp_path / "sleep.pid"
    proc = start_plain(root, {"host": "h", "pid_file": str(pid_file)}, "--only", "test.hang")
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the check never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert wait_gone(int(pid_file.read_text()))


# ---- one torch import for the whole run ------------------------------------------------------------------------------

FORKED = """
    import os, sys, time
    from .core import Result, check

    @check("train.forked", timeout=60)
    def run(ctx):
        preloaded = "torch" in sys.modules      # before this check imports anything
        start = time.monotonic()
        import torch
        torch.set_num_threads(2)                # OpenMP in a child forked after the runner imported torch
        a = torch.randn(256, 256)
        total = float((a @ a.t()).trace())
        return Result("train.forked", "pass", "ran", {"preloaded": preloaded, "runner": os.getppid(),
                      "import_s": time.monotonic() - start, "positive": total > 0})

    @check("train.crash", timeout=60)
    def crash(ctx):
        os.kill(os.getpid(), 11)
"""


def test_checks_run_in_children_forked_after_one_torch_import(tmp_path):
    pytest.importorskip("torch")
    root = plain_suite(tmp_path)
    (root / "smoke" / "forked.py").write_text(textwrap.dedent(FORKED))
    proc = start_plain(root, {"host": "h"}, "--only", "train.forked,train.crash")
    out, err = proc.communicate(timeout=180)
    results = {r["check"]: r for r in json.loads(out)["results"]}
    forked = results["train.forked"]
    assert forked["status"] == "pass", forked
    # the check found torch imported already: the runner (its parent) imported it once for every check
    assert forked["figures"]["preloaded"] is True and forked["figures"]["runner"] == proc.pid
    assert forked["figures"]["import_s"] < 0.5 and forked["figures"]["positive"] is True
    crash = results["train.crash"]
    assert (crash["status"], crash["reason"]) == ("fail", "the check's process was killed by signal 11 without "
                                                          "a result"), err


def test_without_torch_checks_still_run_in_children(tmp_path):
    root = plain_suite(tmp_path)
    (root / "smoke" / "forked.py").write_text(textwrap.dedent(FORKED))
    fake = tmp_path / "nottorch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    path = root / "config.json"
    path.write_text(json.dumps({"host": "h"}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(fake)}
    done = subprocess.run([sys.executable, "-m", "smoke", "--config", str(path), "--only", "train.forked"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    (forked,) = [r for r in json.loads(done.stdout)["results"] if r["check"] == "train.forked"]
    assert forked["status"] == "fail" and "ImportError: no torch here" in forked["reason"]


DRIVER = """
    import ctypes, os
    # what a CUDA call in the runner would leave: the CUDA driver library mapped into the runner's process
    ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libcuda.so.1"))
"""
WHERE = """
    import os
    from .core import Result, check
    from .isolation import cuda_driver_loaded

    @check("test.where", timeout=60)
    def run(ctx):
        return Result("test.where", "pass", "ran", {"driver_here": cuda_driver_loaded(), "runner": os.getppid()})
"""


def test_a_runner_that_loaded_the_cuda_driver_runs_checks_in_fresh_interpreters(tmp_path):
    root = plain_suite(tmp_path)
    (root / "smoke" / "where.py").write_text(textwrap.dedent(WHERE))
    proc = start_plain(root, {"host": "h"}, "--only", "test.where")
    out, err = proc.communicate(timeout=120)
    (forked,) = [r for r in json.loads(out)["results"] if r["check"] == "test.where"]
    assert forked["figures"] == {"driver_here": False, "runner": proc.pid} and "forked children" in err
    # the same suite once the runner has a libcuda mapped (a copy of the C math library under its name)
    libm = next(Path(p) for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6",
                                  "/usr/lib64/libm.so.6", "/lib64/libm.so.6") if Path(p).exists())
    shutil.copy(libm, root / "smoke" / "libcuda.so.1")
    (root / "smoke" / "driver.py").write_text(textwrap.dedent(DRIVER))
    proc = start_plain(root, {"host": "h"}, "--only", "test.where")
    out, err = proc.communicate(timeout=120)
    (fresh,) = [r for r in json.loads(out)["results"] if r["check"] == "test.where"]
    # a fork would have inherited the mapping; a fresh interpreter (still the runner's child) has none
    assert fresh["status"] == "pass" and fresh["figures"] == {"driver_here": False, "runner": proc.pid}, err
    assert "fresh interpreters (the runner loaded the CUDA driver)" in err


def test_the_controller_waits_longer_at_burn_in_than_the_longest_dcgm_diagnostic():
    from gpuprov.smoke.tools_dcgm import TIMEOUT_FOR
    from gpuprov.validation.suite import TIMEOUTS

    assert TIMEOUTS["burn-in"] > max(TIMEOUT_FOR.values()) + 600
