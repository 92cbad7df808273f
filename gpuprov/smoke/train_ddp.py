"""train.ddp: DistributedDataParallel across every local GPU with `torchrun --nproc-per-node=<GPUs>` (NCCL; on
the CPU two processes with gloo): the all-reduce result is checked exactly, a few DDP steps leave the same
parameters on every rank, and the loss falls.

torchrun runs ddp_worker.py in a process group of its own, killed whole at the timeout, with a c10d rendezvous
on 127.0.0.1 at a free port. `torchrun_argv` and `parse_worker_output` are also what the controller uses for the
multi-node run (torchrun on every host of a group, one rendezvous over the cluster addresses).

On a host whose GPUs are in MIG mode it is skipped: a CUDA process enumerates a single MIG device (NVIDIA MIG user
guide, "CUDA Device Enumeration"), so torchrun would run one rank on one slice; DDP across the GPUs needs MIG off.
"""

from __future__ import annotations

import json
import os
import sys
import time

from . import nvsmi
from .core import FAIL, PASS, REGISTRY, SKIP, Result, check
from .ddp_worker import MARK, PARAM_TOLERANCE
from .torchutil import (
    LOSS_THRESHOLDS,
    Target,
    free_port,
    loss_verdict,
    run_group,
    tail,
    torch_check,
)

NAME = "train.ddp"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_worker.py")
CPU_RANKS = 2          # processes of the gloo run on a host without GPUs
TRAIN_STEPS = 10
BENCH_MB = {"cuda": 64.0, "cpu": 1.0}


def torchrun_argv(nproc: int, worker_args: list[str], *, rdzv_endpoint: str, nnodes: int = 1,
                  node_rank: int | None = None, local_addr: str | None = None, run_id: str = "gpuprov-smoke",
                  join_timeout: int = 60, python: str = sys.executable, worker: str = WORKER) -> list[str]:
    """The torchrun command line of one host: `nproc` ranks here, `nnodes` hosts meeting at the c10d rendezvous
    on `rdzv_endpoint` (host:port, served by the host that owns the address) within `join_timeout` seconds.
    With c10d the rendezvous assigns the ranks, so rank 0 (the one that prints the report) may be on any host."""
    argv = [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=join_timeout={join_timeout}", "--max-restarts=0"]
    if node_rank is not None:
        argv.append(f"--node-rank={node_rank}")
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return [*argv, worker, *worker_args]


def parse_worker_output(stdout: str) -> dict | None:
    """The worker's report (the last JSON line marked "ddp_worker") in a torchrun's stdout, or None."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and report.get(MARK) == 1:
            return report
    return None


def local_run(target: Target, worker_args: list[str], timeout: float) -> tuple[dict | None, str]:
    """Run the worker on this host: one rank per GPU with NCCL, or CPU_RANKS ranks with gloo over the loopback.
    The worker's report, or None and why none came."""
    nproc = target.gpus if target.cuda else CPU_RANKS
    args = [*worker_args, "--expect-world-size", str(nproc), "--timeout", f"{min(120.0, timeout):g}",
            "--deadline", f"{max(10.0, timeout - 5):g}", "--backend", "nccl" if target.cuda else "gloo",
            "--bind-addr", "127.0.0.1"]
    argv = torchrun_argv(nproc, args, rdzv_endpoint=f"127.0.0.1:{free_port()}", local_addr="127.0.0.1")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rc, out, err = run_group(argv, timeout, env)
    report = parse_worker_output(out)
    if report is not None:
        return report, ""
    if rc == 124:
        return None, f"torchrun ({nproc} ranks) timed out after {timeout:g} s: {tail(err, 4)}"
    return None, f"torchrun ({nproc} ranks) exited {rc} without the worker's report: {tail(err) or tail(out)}"


def subprocess_timeout(name: str) -> float:
    """What the torchrun of a check may take: its registered timeout less a margin to report in."""
    return max(20.0, REGISTRY[name].timeout - 20.0)


def mig_skip(ctx, start: float) -> Result | None:
    """A skip when MIG is on: a CUDA process sees one MIG instance, so DDP across the GPUs cannot run."""
    mig = nvsmi.mig_gpus(ctx)
    if mig:
        return Result(NAME, SKIP, f"MIG is enabled on {', '.join(mig)}: a CUDA process sees one MIG instance, so "
                      "DDP across the GPUs cannot run (disable MIG to judge it); not run", {"mig_enabled": mig},
                      seconds=time.monotonic() - start)
    return None


@check(NAME, timeout=180)
@torch_check(NAME, first=mig_skip)
def run(ctx, torch, target: Target, start: float) -> Result:
    if not torch.distributed.is_available():
        return Result(NAME, FAIL, f"torch {torch.__version__} is built without torch.distributed",
                      seconds=time.monotonic() - start)
    args = ["--train-steps", str(TRAIN_STEPS), "--bench-mb", f"{BENCH_MB[target.device]:g}", "--bench-iters", "5"]
    report, why = local_run(target, args, subprocess_timeout(NAME))
    if report is None:
        return Result(NAME, FAIL, f"DDP on {target.describe()}: {why}", {"device": target.describe()},
                      seconds=time.monotonic() - start)
    verdict, loss_figures = loss_verdict(report["train"]["losses"])
    problems = [*report["problems"], *([f"rank 0: {verdict}"] if verdict else [])]
    figures = {"device": target.describe(), "backend": report["backend"], "world_size": report["world_size"],
               "hosts": report["hosts"], "allreduce_expected": report["allreduce"]["expected"],
               "max_param_diff": report["train"]["max_param_diff"], **loss_figures,
               "busbw_gbs": report["bench"]["busbw_gbs"], "bench_bytes": report["bench"]["bytes"],
               "worker_s": report["seconds"]}
    thresholds = {**LOSS_THRESHOLDS, "world_size": target.gpus if target.cuda else CPU_RANKS,
                  "allreduce": "exact", "max_param_diff": PARAM_TOLERANCE}
    seconds = time.monotonic() - start
    if problems:
        return Result(NAME, FAIL, f"DDP over {report['world_size']} ranks ({report['backend']}): "
                      + "; ".join(problems), figures, thresholds, seconds)
    return Result(NAME, PASS, f"DDP over {report['world_size']} ranks ({report['backend']}) on "
                  f"{target.describe()}: all-reduce exact (every element {report['allreduce']['expected']:g}), "
                  f"parameters equal on every rank after {TRAIN_STEPS} steps, loss {loss_figures['loss_first']:.4g}"
                  f" -> {loss_figures['loss_last']:.4g}", figures, thresholds, seconds)
