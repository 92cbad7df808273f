"""perf.allreduce: all-reduce bus bandwidth across every local GPU (NCCL through torchrun, one rank per GPU), the
NCCL-tests way (busbw = bytes / time * 2(n-1)/n, float32, median of repeats after warm-up, the slowest rank's),
judged at threshold_pct of the expected bus bandwidth of the host's topology (the config's `expected` block,
allreduce_busbw_gbs: nccl-tests figures such as ~480 GB/s for 8 H100/H200 with NVSwitch, NVIDIA/nccl-tests#212,
or the PCIe copy figure where the GPUs meet over PCIe; a topology with no figure is a skip). A GiB message, as
peak bandwidth needs large ones ("256M is too small", ibid.); the result is checked exactly too.

On the CPU two gloo ranks measure it and the figure is reported, not judged. One GPU has nothing to all-reduce
with: skip.

NCCL's network is recorded (`nccl_network`: IB or Socket, from its NCCL_DEBUG=INFO lines, written to files of its
own through NCCL_DEBUG_FILE) with the host's RDMA devices (/sys/class/infiniband) and whether they can be opened
here (`rdma_reachable`: a verbs device file /dev/infiniband/uverbsN; a container has one only when it was given
/dev/infiniband). NCCL picks its network at init on every host, so where the RDMA devices can be opened and NCCL
still falls back to sockets (no libibverbs or provider, no IPC_LOCK, a port down) the check fails, before a
multi-node job would run at a fraction of its bandwidth, unless the operator turned IB off (NCCL_IB_DISABLE=1).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import tempfile
import time
from collections.abc import Iterator

from .core import FAIL, SKIP, Result, check
from .torchutil import (
    expected_thresholds,
    judge_figures,
    perf_result,
    sized,
    threshold_pct,
    torch_check,
)
from .train_ddp import local_run, subprocess_timeout

NAME = "perf.allreduce"
# NCCL's INFO lines naming the network it uses between hosts, as NCCL prints them (NCCL_DEBUG=INFO; seen in
# NVIDIA/nccl-tests#185, NVIDIA/nccl#1357 and Mellanox/nv_peer_memory#56):
#   dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:...
#   dgxh100-4:460770:460842 [0] NCCL INFO Using network IB
#   qh100-gpu19:49355:49414 [1] NCCL INFO Using network IBext          (the IB plugin of HPC-X)
#   master_node:20:289 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>
# "Using network X" is the choice; older NCCL prints only the NET/<X> : Using lines (and NET/Socket's even when it
# then uses IB), so those count only without it, IB first.
USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
NET_USING = re.compile(r"NCCL INFO NET/(IB|Socket) : Using ")
NCCL_LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
RDMA_CLASS = "/sys/class/infiniband"
RDMA_DEV = "/dev/infiniband"

# (device, level) -> message MiB and timed iterations
SIZES = {
    ("cpu", "quick"): (8.0, 5),
    ("cpu", "burn-in"): (64.0, 20),
    ("cuda", "quick"): (1024.0, 20),
    ("cuda", "burn-in"): (1024.0, 200),
}


@check(NAME, timeout=240)
@torch_check(NAME, problem_fails=False)
def run(ctx, torch, target, start: float) -> Result:
    if target.cuda and target.gpus == 1:
        return Result(NAME, SKIP, f"one GPU ({target.names[0]}): no all-reduce between GPUs to measure",
                      {"gpus": 1}, seconds=time.monotonic() - start)
    if not torch.distributed.is_available():
        return Result(NAME, FAIL, f"torch {torch.__version__} is built without torch.distributed",
                      seconds=time.monotonic() - start)
    megabytes, iters = sized(SIZES, target, ctx.level)
    with tempfile.TemporaryDirectory(prefix="gpuprov-nccl-") as folder:
        with nccl_log(folder) if target.cuda else contextlib.nullcontext():
            report, why = local_run(target, ["--bench-mb", f"{megabytes:g}", "--bench-iters", str(iters)],
                                    subprocess_timeout(NAME))
        network = nccl_network(read_logs(folder)) if target.cuda else None
    if report is None:
        return Result(NAME, FAIL, f"all-reduce on {target.describe()}: {why}", {"device": target.describe()},
                      seconds=time.monotonic() - start)
    bench = report["bench"]
    expected, threshold = ctx.config.get("expected") or {}, threshold_pct(ctx.config)
    failures, judged = judge_figures({"busbw_gbs": bench["busbw_gbs"]}, expected, threshold)
    rdma, reachable = rdma_devices() if target.cuda else ([], False)
    transport = transport_problem(network, rdma if reachable else [], os.environ.get("NCCL_IB_DISABLE") == "1")
    failures = [*report["problems"], *failures, *([transport] if transport else [])]
    figures = {"device": target.describe(), "backend": report["backend"], "world_size": report["world_size"],
               "busbw_gbs": bench["busbw_gbs"], "algbw_gbs": bench["algbw_gbs"], "bytes": bench["bytes"],
               "time_ms": bench["time_ms"], "iters": bench["iters"]}
    if target.cuda:
        figures.update(nccl_network=network, rdma_devices=rdma, rdma_reachable=reachable)
    via = f", NCCL network {network}" if network else ""
    summary = (f"all-reduce of {bench['bytes'] / (1 << 20):g} MiB over {report['world_size']} ranks "
               f"({report['backend']}{via}): bus bandwidth {bench['busbw_gbs']:.4g} GB/s")
    if report["problems"] and not target.cuda:  # a wrong sum fails on the CPU too
        return Result(NAME, FAIL, "; ".join(report["problems"]), figures,
                      expected_thresholds(["busbw_gbs"], ctx.config), time.monotonic() - start)
    return perf_result(NAME, target, summary=summary, figures=figures, failures=failures, judged=judged,
                       wanted=["busbw_gbs"], thresholds=expected_thresholds(["busbw_gbs"], ctx.config),
                       start=start)


@contextlib.contextmanager
def nccl_log(folder: str) -> Iterator[None]:
    """NCCL's INIT and NET info lines of the ranks started meanwhile, into files of `folder` (one a process)."""
    wanted = {**NCCL_LOG_ENV, "NCCL_DEBUG_FILE": os.path.join(folder, "nccl.%h.%p")}
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def read_logs(folder: str) -> str:
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "nccl.*"))):
        with open(path, encoding="utf-8", errors="replace") as handle:
            out.append(handle.read(1 << 20))
    return "\n".join(out)


def nccl_network(text: str) -> str | None:
    """The network NCCL's ranks use between hosts, from its info lines: "IB" (InfiniBand or RoCE, the IB plugin
    too), "Socket", both ("IB,Socket": some ranks fell back), or None when no line says."""
    used = {"IB" if name.startswith("IB") else name for name in USING_NETWORK.findall(text)}
    if not used:
        listed = set(NET_USING.findall(text))
        used = {"IB"} if "IB" in listed else listed
    return ",".join(sorted(used)) or None


def rdma_devices(root: str = RDMA_CLASS, dev: str = RDMA_DEV) -> tuple[list[str], bool]:
    """The host's RDMA devices (mlx5_0 ...: InfiniBand and RoCE ports, which NCCL's IB transport uses) and whether
    this process can open them (a verbs device file under /dev/infiniband)."""
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        devices = []
    try:
        reachable = any(name.startswith("uverbs") for name in os.listdir(dev))
    except OSError:
        reachable = False
    return devices, reachable


def transport_problem(network: str | None, devices: list[str], ib_disabled: bool) -> str | None:
    """Why NCCL's network is wrong for the host, or None: sockets where the host has RDMA devices fail (unless IB
    was turned off on purpose)."""
    if not devices or ib_disabled or network is None or "Socket" not in network.split(","):
        return None
    return (f"NCCL uses sockets (NET/Socket) on a host with RDMA devices ({', '.join(devices)}): it fell back from "
            "InfiniBand/RoCE (in a container: pass /dev/infiniband and --cap-add=IPC_LOCK, and install rdma-core's "
            "libibverbs and providers; on the host: check NCCL_IB_HCA and the HCA's state with ibv_devinfo)")
