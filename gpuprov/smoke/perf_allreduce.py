"""perf.allreduce: all-reduce bus bandwidth across every local GPU (NCCL through torchrun, one rank per GPU), the
NCCL-tests way (busbw = bytes / time * 2(n-1)/n, float32, median of repeats after warm-up, the slowest rank's),
judged at threshold_pct of the expected bus bandwidth of the host's topology (the config's `expected` block,
allreduce_busbw_gbs: nccl-tests figures such as ~480 GB/s for 8 H100/H200 with NVSwitch, NVIDIA/nccl-tests#212,
or the PCIe copy figure where the GPUs meet over PCIe; a topology with no figure is a skip). A GiB message, as
peak bandwidth needs large ones ("256M is too small", ibid.); the result is checked exactly too.

On the CPU two gloo ranks measure it and the figure is reported, not judged. One GPU has nothing to all-reduce
with: skip.
"""

from __future__ import annotations

import time

from .core import FAIL, SKIP, Result, check
from .torchutil import (
    expected_thresholds,
    import_torch,
    judge_figures,
    no_torch,
    perf_result,
    setup_target,
    threshold_pct,
)
from .train_ddp import local_run, subprocess_timeout

NAME = "perf.allreduce"

# (device, level) -> message MiB and timed iterations
SIZES = {
    ("cpu", "quick"): (8.0, 5),
    ("cpu", "burn-in"): (64.0, 20),
    ("cuda", "quick"): (1024.0, 20),
    ("cuda", "burn-in"): (1024.0, 200),
}


@check(NAME, timeout=240)
def run(ctx) -> Result:
    start = time.monotonic()
    torch, why = import_torch()
    if torch is None:
        return no_torch(NAME, why, start)
    target = setup_target(torch, ctx.config)
    if target.cuda and target.gpus == 1:
        return Result(NAME, SKIP, f"one GPU ({target.names[0]}): no all-reduce between GPUs to measure",
                      {"gpus": 1}, seconds=time.monotonic() - start)
    if not torch.distributed.is_available():
        return Result(NAME, FAIL, f"torch {torch.__version__} is built without torch.distributed",
                      seconds=time.monotonic() - start)
    megabytes, iters = SIZES[(target.device, ctx.level if ctx.level == "burn-in" else "quick")]
    report, why = local_run(target, ["--bench-mb", f"{megabytes:g}", "--bench-iters", str(iters)],
                            subprocess_timeout(NAME))
    if report is None:
        return Result(NAME, FAIL, f"all-reduce on {target.describe()}: {why}", {"device": target.describe()},
                      seconds=time.monotonic() - start)
    bench = report["bench"]
    expected, threshold = ctx.config.get("expected") or {}, threshold_pct(ctx.config)
    failures, judged = judge_figures({"busbw_gbs": bench["busbw_gbs"]}, expected, threshold)
    failures = [*report["problems"], *failures]
    figures = {"device": target.describe(), "backend": report["backend"], "world_size": report["world_size"],
               "busbw_gbs": bench["busbw_gbs"], "algbw_gbs": bench["algbw_gbs"], "bytes": bench["bytes"],
               "time_ms": bench["time_ms"], "iters": bench["iters"]}
    summary = (f"all-reduce of {bench['bytes'] / (1 << 20):g} MiB over {report['world_size']} ranks "
               f"({report['backend']}): bus bandwidth {bench['busbw_gbs']:.4g} GB/s")
    if report["problems"] and not target.cuda:  # a wrong sum fails on the CPU too
        return Result(NAME, FAIL, "; ".join(report["problems"]), figures,
                      expected_thresholds(["busbw_gbs"], ctx.config), time.monotonic() - start)
    return perf_result(NAME, target, summary=summary, figures=figures, failures=failures, judged=judged,
                       wanted=["busbw_gbs"], thresholds=expected_thresholds(["busbw_gbs"], ctx.config),
                       start=start)
