"""A short GPU load for the checks that must read the GPUs while they work (host.pcie, host.clocks).

An idle GPU lowers its PCIe link generation and clocks to save power, so the link generation and the clock-event
reasons mean something only under load. `GpuLoad` runs a half-precision matmul loop on every GPU torch sees, in
background threads, for as long as the `with` block lasts. Without a /dev/nvidiaN device node, without torch,
or when torch sees no CUDA device, it starts nothing and says why in `reason`; the checks then judge what an
idle read can show and skip the rest.
"""

from __future__ import annotations

import glob
import threading
import time

DEVICE_NODES = "/dev/nvidia[0-9]*"


class GpuLoad:
    """`with GpuLoad() as load:` -> `load.active` (bool), `load.reason` (why not), `load.devices` (count)."""

    def __init__(self, size: int = 4096, start_timeout: float = 60.0):
        self.size = size
        self.start_timeout = start_timeout
        self.active = False
        self.reason = ""
        self.devices = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> GpuLoad:
        if not glob.glob(DEVICE_NODES):  # CUDA cannot open a GPU without its device node: spare the torch import
            self.reason = f"no NVIDIA device node ({DEVICE_NODES.replace('[0-9]*', 'N')})"
            return self
        try:
            import torch
        except ImportError as exc:
            self.reason = f"torch is not importable ({exc})"
            return self
        try:
            available = torch.cuda.is_available()
        except Exception as exc:  # a broken CUDA install raises here
            self.reason = f"torch.cuda.is_available() raised {type(exc).__name__}: {exc}"
            return self
        if not available:
            self.reason = f"torch {torch.__version__} sees no CUDA device"
            return self
        self.devices = torch.cuda.device_count()
        started = [threading.Event() for _ in range(self.devices)]
        for index in range(self.devices):
            thread = threading.Thread(target=self._spin, args=(torch, index, started[index]), daemon=True)
            thread.start()
            self._threads.append(thread)
        deadline = time.monotonic() + self.start_timeout
        for event in started:
            event.wait(max(0.0, deadline - time.monotonic()))
        if self.errors:
            self.reason = "GPU load failed: " + "; ".join(self.errors)
            self._halt()
            return self
        if not all(event.is_set() for event in started):
            self.reason = f"GPU load did not start within {self.start_timeout:g} s"
            self._halt()
            return self
        self.active = True
        return self

    def _spin(self, torch, index: int, started: threading.Event) -> None:
        try:
            device = torch.device("cuda", index)
            a = torch.randn(self.size, self.size, device=device, dtype=torch.float16)
            b = torch.randn(self.size, self.size, device=device, dtype=torch.float16)
            (a @ b).sum().item()
            started.set()
            while not self._stop.is_set():
                for _ in range(8):
                    c = a @ b
                torch.cuda.synchronize(device)
                del c
        except Exception as exc:
            self.errors.append(f"GPU {index}: {type(exc).__name__}: {exc}")
            started.set()

    def _halt(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def __exit__(self, *exc_info) -> None:
        self._halt()


def sample_xml(ctx, settle: float, samples: int, interval: float) -> tuple[list[dict], GpuLoad]:
    """`nvidia-smi -q -x` reports read under a GpuLoad: first one at idle (so a failing nvidia-smi raises before
    anything is loaded), then, when the load runs, `samples` reads `interval` s apart after `settle` s, which
    replace the idle one. Returns (the reports, the load, whose `active` and `reason` say which); raises SmiError."""
    from . import nvsmi

    reports = [nvsmi.query_xml(ctx)]
    with GpuLoad() as gpu_load:
        if gpu_load.active:
            reports = []
            time.sleep(settle)
            for index in range(samples):
                if index:
                    time.sleep(interval)
                reports.append(nvsmi.query_xml(ctx))
    return reports, gpu_load
