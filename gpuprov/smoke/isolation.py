"""How the runner runs a check: in a child forked from it (or a fresh interpreter when the runner has loaded the
CUDA driver), in a process group of its own, under a timeout, the whole group killed at the end; the child's
result comes back as a JSON file and its output's last lines."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from select import select as _readable

from .core import PACKAGE, ROOT


def kill_group(pid: int) -> None:
    """Kill a check's whole process group (it and anything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-600:]


_current: list[int] = []   # the process group of the check running now (the SIGTERM handler kills it)


def _exited(pid: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for the child to exit, without reaping it (so its pid, which names its
    process group, stays reserved until the group is killed). True when it exited."""
    deadline = time.monotonic() + timeout
    opener = getattr(os, "pidfd_open", None)
    if opener is not None:
        try:
            fd = opener(pid)
        except OSError:
            fd = None
        if fd is not None:
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    with contextlib.suppress(InterruptedError):
                        if _readable([fd], [], [], left)[0]:
                            return True
            finally:
                os.close(fd)
    while time.monotonic() < deadline:   # no pidfd (kernel before 5.3): poll
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.02)
    return False


# Set when the runner's own process has loaded the CUDA driver (see fork_is_safe): a CUDA context does not
# survive fork, so each check then runs in a fresh interpreter, `python -m PACKAGE ARGS --result FILE`.
_exec_argv: list[str] | None = None


def cuda_driver_loaded() -> bool:
    """Whether this process has the CUDA driver library mapped (torch.cuda.is_available() and any CUDA call
    load it; importing torch does not)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            return any("libcuda.so" in line for line in handle)
    except OSError:
        return False


def _child(target, result_path: str, log_path: str, argv_tail: list[str] | None = None) -> None:
    """In the forked child: its own process group, stdin from /dev/null, output into the log, the result
    written by `target(result_path)` (or by a fresh interpreter running `argv_tail` when the runner may not be
    forked into checks); never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        if _exec_argv is not None and argv_tail is not None:
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
            os.execv(sys.executable, [sys.executable, "-m", PACKAGE, *_exec_argv, *argv_tail,
                                      "--result", result_path])
        target(result_path)
        code = 0
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the runner
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            remove_process_folder()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


_PROCESS_FOLDERS: dict[int, str] = {}   # pid -> the private temporary folder of that process


def process_folder() -> str:
    """A temporary folder of this process alone (mkdtemp: 0700), removed when the process ends: at a check child's
    exit (its os._exit skips exit handlers) or at the interpreter's exit. A forked child that inherits its parent's
    folder gets one of its own and leaves the parent's alone."""
    pid = os.getpid()
    if pid not in _PROCESS_FOLDERS:
        _PROCESS_FOLDERS[pid] = tempfile.mkdtemp(prefix="gpuprov-private-")
        atexit.register(remove_process_folder, pid)
    return _PROCESS_FOLDERS[pid]


def remove_process_folder(pid: int | None = None) -> None:
    """Remove this process's private folder (only the process that made it removes it)."""
    pid = os.getpid() if pid is None else pid
    if pid == os.getpid() and pid in _PROCESS_FOLDERS:
        shutil.rmtree(_PROCESS_FOLDERS.pop(pid), ignore_errors=True)


def run_isolated(target, timeout: float, argv_tail: list[str] | None = None) -> tuple[dict | None, int | None, str,
                                                                                 float]:
    """Run `target(result_path)` in a forked child, in a process group of its own, under `timeout`.

    The child is a fork of the runner, so what the runner imported (torch, once) is there without importing
    it again; a hung child is killed at the timeout with everything it started. When forking is not safe
    (`_exec_argv` set), the child runs `python -m PACKAGE ... argv_tail` instead. Returns (the JSON the child
    wrote at result_path or None, its exit code or None when it was killed at the timeout, its output's tail,
    seconds)."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-smoke-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        log_path = os.path.join(tmp, "output.log")
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(target, result_path, log_path, argv_tail)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # also here, so the group exists before the parent could kill it
        _current.append(pid)
        try:
            rc = None
            if _exited(pid, timeout):
                status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                rc = status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
        finally:
            kill_group(pid)   # also what the check left running
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            _current.remove(pid)
        seconds = time.monotonic() - start
        data = None
        try:
            with open(result_path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            data = None
        return data, rc, _tail(log_path), seconds


def on_term(signum, frame):  # the controller gave up: take the running check's process group down with us
    for pid in list(_current):
        kill_group(pid)
    raise SystemExit(128 + signum)


def fork_is_safe(config_path: str, level: str) -> bool:
    """After the preload: fork checks from this process unless it has loaded the CUDA driver (then each check
    runs in a fresh interpreter, as a CUDA context does not survive fork)."""
    global _exec_argv
    if not cuda_driver_loaded():
        return True
    _exec_argv = ["--config", config_path, "--level", level]
    return False
