"""perf.matmul: dense matmul throughput of every GPU in bf16, fp16 and tf32 (fp32 inputs on TF32 tensor cores),
measured the way the published maxima are ("maximum achievable matmul FLOPS", mamf-finder.py): the best of a small
sweep of shapes (SHAPES: 8192^3 and the best shapes published for common GPUs), bounded in time, TFLOP/s =
2 m n k / time (CUDA events, median of repeats after warm-up, random data). Each GPU's best is judged against the
model's expected figure (the config's `expected` block: the published best of that model, or a marked fallback)
at threshold_pct; `per_gpu` has each GPU's best and the shape that reached it, the top-level figures are the
slowest GPU's. At burn-in every GPU also runs a sustained matmul load at once for the config's burn_in_seconds,
judged by gpuprov.smoke.burnin; the check's timeout grows by that time (burn_in_load).

On the CPU one 512^3 matmul per dtype (bf16, fp16, fp32) is measured and reported, not judged.
"""

from __future__ import annotations

import math
import statistics
import time

from . import burnin, nvsmi
from .core import Result, check
from .torchutil import (
    FIGURES,
    burn_in_seconds,
    cuda_bf16,
    expected_thresholds,
    judge_figures,
    perf_result,
    randn,
    threshold_pct,
    time_calls,
    torch_check,
)

NAME = "perf.matmul"
TIMEOUT = 300
SUSTAINED_N, CPU_N = 8192, 512     # on the CPU a smoke test: fp16 runs there at ~1 GFLOP/s
# (M, N, K): the cube, then best shapes published for H100 SXM (mamf-stas00: 2048x2048x13312; mamf-mag:
# 6144x17920x2816), B200 (1792x16128x3072), H100 PCIe (6912x16384x2048), L40S (4416x3776x3072) and L4
# (1024x6016x1792) in gpus.yaml's sources; the sweep keeps the best
SHAPES = ((8192, 8192, 8192), (2048, 2048, 13312), (6144, 17920, 2816), (1792, 16128, 3072), (6912, 16384, 2048),
          (4416, 3776, 3072), (1024, 6016, 1792))
SWEEP_SECONDS = 15.0       # the whole sweep of one GPU, every dtype; shapes not reached in time are left out
SUSTAINED_SETUP = 60       # seconds the sustained load needs besides its burn-in time (allocation, telemetry)
REPEATS = {"cuda": (5, 10, 3), "cpu": (1, 5, 1)}      # warm-up, repeats, matmuls a repeat (each shape)


def dtypes(torch, target, config: dict) -> dict[str, object]:
    """figure -> input dtype of the matmuls to measure (tf32: fp32 inputs with TF32 allowed)."""
    if not target.cuda:
        return {"bf16_tflops": torch.bfloat16, "fp16_tflops": torch.float16, "fp32_tflops": torch.float32}
    chosen = {"fp16_tflops": torch.float16}
    if (config.get("expect") or {}).get("bf16") is not False and cuda_bf16(torch):
        chosen = {"bf16_tflops": torch.bfloat16, **chosen}
    if torch.cuda.get_device_capability(0)[0] >= 8:
        chosen["tf32_tflops"] = torch.float32
    return chosen


def matmul_tflops(torch, device: str, shape: tuple, dtype, seed: int) -> float:
    """TFLOP/s of (m x k) @ (k x n) on the device (current device for a GPU)."""
    m, n, k = shape
    a, b = randn(torch, (m, k), seed, device, dtype), randn(torch, (k, n), seed + 1, device, dtype)
    out = torch.empty((m, n), device=device, dtype=dtype)
    warmup, repeats, inner = REPEATS["cuda" if device.startswith("cuda") else "cpu"]
    times = time_calls(torch, lambda: torch.matmul(a, b, out=out), "cuda" if device.startswith("cuda") else "cpu",
                       warmup=warmup, repeats=repeats, inner=inner)
    return 2.0 * m * n * k / statistics.median(times) / 1e12


def sweep(measure, shapes: tuple, deadline: float) -> tuple[float, str, int]:
    """The best TFLOP/s of `measure(shape)` over `shapes`, its shape as "MxNxK" and how many shapes ran; the
    first shape always runs, the others while time is left before `deadline` (time.monotonic())."""
    best, best_shape, ran = 0.0, "", 0
    for shape in shapes:
        if ran and time.monotonic() >= deadline:
            break
        value = measure(shape)
        ran += 1
        if value > best:
            best, best_shape = value, "x".join(map(str, shape))
    return best, best_shape, ran


def gpu_best(torch, index: int, chosen: dict, seconds: float) -> dict:
    """One GPU's best TFLOP/s of each dtype over the sweep, with the shape of each and the shapes measured."""
    figures: dict = {}
    shapes: dict = {}
    measured: dict = {}
    previous = torch.get_float32_matmul_precision()
    try:
        with torch.cuda.device(index):
            for figure, dtype in chosen.items():
                torch.set_float32_matmul_precision("high" if figure == "tf32_tflops" else "highest")
                best, shape, ran = sweep(lambda s, d=dtype: matmul_tflops(torch, f"cuda:{index}", s, d, index),
                                         SHAPES, time.monotonic() + seconds / len(chosen))
                figures[figure], shapes[figure], measured[figure] = round(best, 2), shape, ran
    finally:
        torch.set_float32_matmul_precision(previous)
    return {**figures, "best_shape": shapes, "shapes_measured": min(measured.values())}


def _shape_of(per_gpu: dict, figure: str, value: float) -> str:
    """" at MxNxK": the best shape of the GPU whose best was `value` (nothing on the CPU)."""
    shapes = [row["best_shape"][figure] for row in per_gpu.values() if row[figure] == value and "best_shape" in row]
    return f" at {shapes[0]}" if shapes else ""


def burn_in_load(config: dict) -> float:
    """Seconds of sustained load the config asks at the burn-in level (the check's timeout grows by as much, so a
    burn-in of any length is never cut by TIMEOUT); none at quick."""
    return burn_in_seconds(config, math.inf) if config.get("level") == "burn-in" else 0.0


@check(NAME, timeout=TIMEOUT, load=burn_in_load)
@torch_check(NAME, problem_fails=False)
def run(ctx, torch, target, start: float) -> Result:
    mig = nvsmi.mig_judgement(ctx, target.names)  # a MIG instance: judged against its share of the GPU, or skipped
    if mig.skip:
        return mig.skipped(NAME, start)
    ctx.config = mig.config(ctx.config)
    expected, threshold = ctx.config.get("expected") or {}, threshold_pct(ctx.config)
    chosen = dtypes(torch, target, ctx.config)
    judged_names = [figure for figure in chosen if figure in FIGURES]
    thresholds = expected_thresholds(judged_names, ctx.config)
    failures: list[str] = []
    per_gpu: dict[str, dict] = {}
    if target.cuda:
        burn = ctx.level == "burn-in"
        budget = min(SWEEP_SECONDS, (TIMEOUT - 90 - (SUSTAINED_SETUP if burn else 0)) / target.gpus)
        for index in range(target.gpus):
            per_gpu[str(index)] = gpu_best(torch, index, chosen, budget)
            failures += judge_figures({f: per_gpu[str(index)][f] for f in judged_names}, expected, threshold,
                                      f"GPU {index}: ")[0]
        where = f"best of up to {len(SHAPES)} shapes"
    else:
        per_gpu["cpu"] = {figure: round(matmul_tflops(torch, "cpu", (CPU_N,) * 3, dtype, 0), 4)
                          for figure, dtype in chosen.items()}
        where = f"{CPU_N}x{CPU_N} matmul"
    slowest = {figure: min(gpu[figure] for gpu in per_gpu.values()) for figure in chosen}
    failures_min, judged = judge_figures({name: slowest[name] for name in judged_names}, expected, threshold)
    if not target.cuda:
        failures = failures_min
    figures = {**slowest, "per_gpu": per_gpu, "device": target.describe()}
    if target.cuda:
        figures["shapes"] = ["x".join(map(str, shape)) for shape in SHAPES]
    if ctx.level == "burn-in" and target.cuda:
        figure = "bf16_tflops" if "bf16_tflops" in chosen else "fp16_tflops"
        seconds = burn_in_load(ctx.config)
        report, problems = burnin.sustained(ctx, torch, target.gpus, SUSTAINED_N, chosen[figure], seconds, randn)
        figures["sustained"] = {"figure": figure, "n": SUSTAINED_N, **report}
        failures += problems
        for index, row in sorted(report["per_gpu"].items()):
            failures += judge_figures({figure: row["last_third_tflops"]}, expected, threshold,
                                      f"GPU {index} sustained over {seconds:g} s (last third, {SUSTAINED_N}^3): ")[0]
    summary = ", ".join(f"{name.split('_')[0]} {value:.4g} TFLOP/s{_shape_of(per_gpu, name, value)}"
                        for name, value in slowest.items())
    summary = f"{target.describe()}, {where}: {summary}" + (f" ({mig.note})" if mig.note else "")
    return perf_result(NAME, target, summary=summary, figures=figures, failures=failures, judged=judged,
                       wanted=judged_names, thresholds=thresholds, start=start)
