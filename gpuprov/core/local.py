"""Programs run on this machine (the controller): without a shell, bounded in time, in a process group of their own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def run_bounded(argv: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """`argv` run to its end with its output captured and stdin closed. At `timeout` seconds its whole process group
    is killed (a child it started would otherwise hold the pipes open, and the wait with them), and
    subprocess.TimeoutExpired is raised with what it printed; OSError when it cannot start. `popen`: Popen's
    other arguments (env, text, errors)."""
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True, **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
