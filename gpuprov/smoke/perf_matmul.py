"""perf.matmul: dense matmul throughput of every GPU in bf16, fp16 and tf32 (fp32 inputs on TF32 tensor cores),
TFLOP/s = 2 n^3 / time (CUDA events, median of repeats after warm-up, random data), each as a percentage of the
datasheet's dense figure; every GPU must reach the threshold. The figures are the slowest GPU's; `per_gpu` has
each one's. At burn-in every GPU also runs a sustained matmul load at once (heat and power limits show there).

On the CPU the same matmuls are measured (bf16, fp16, fp32) and reported, not judged.
"""

from __future__ import annotations

import statistics
import threading
import time

from .core import Result, check
from .torchutil import (
    FIGURES,
    burn_in_seconds,
    cuda_bf16,
    datasheet_thresholds,
    import_torch,
    judge_figures,
    no_torch,
    perf_result,
    randn,
    setup_target,
    threshold_pct,
    time_calls,
)

NAME = "perf.matmul"
TIMEOUT = 300
GPU_N, CPU_N = 8192, 1024
REPEATS = {"cuda": (10, 20, 4), "cpu": (1, 5, 1)}     # warm-up, repeats, matmuls a repeat


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


def matmul_tflops(torch, device: str, n: int, dtype, seed: int) -> float:
    """TFLOP/s of n x n @ n x n on the device (current device for a GPU)."""
    a, b = randn(torch, (n, n), seed, device, dtype), randn(torch, (n, n), seed + 1, device, dtype)
    out = torch.empty((n, n), device=device, dtype=dtype)
    warmup, repeats, inner = REPEATS["cuda" if device.startswith("cuda") else "cpu"]
    times = time_calls(torch, lambda: torch.matmul(a, b, out=out), "cuda" if device.startswith("cuda") else "cpu",
                       warmup=warmup, repeats=repeats, inner=inner)
    return 2.0 * n**3 / statistics.median(times) / 1e12


def sustained(torch, gpus: int, n: int, dtype, seconds: float) -> dict[int, float]:
    """Every GPU at once runs matmuls for `seconds`: each one's TFLOP/s over the last third (median of chunks)."""
    results: dict[int, float] = {}
    errors: list[str] = []

    def load(index: int) -> None:
        try:
            with torch.cuda.device(index):
                device = f"cuda:{index}"
                a, b = randn(torch, (n, n), index, device, dtype), randn(torch, (n, n), index + 100, device, dtype)
                out = torch.empty((n, n), device=device, dtype=dtype)
                chunks: list[tuple[float, float]] = []
                began = time.monotonic()
                while time.monotonic() - began < seconds:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(10):
                        torch.matmul(a, b, out=out)
                    end.record()
                    end.synchronize()
                    chunks.append((time.monotonic() - began, start.elapsed_time(end) / 1000.0 / 10))
                late = [took for at, took in chunks if at >= seconds * 2 / 3] or [took for _, took in chunks]
                results[index] = 2.0 * n**3 / statistics.median(late) / 1e12
        except Exception as exc:
            errors.append(f"GPU {index}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=load, args=(index,), daemon=True) for index in range(gpus)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return results


@check(NAME, timeout=TIMEOUT)
def run(ctx) -> Result:
    start = time.monotonic()
    torch, why = import_torch()
    if torch is None:
        return no_torch(NAME, why, start)
    target = setup_target(torch, ctx.config)
    datasheet, threshold = ctx.config.get("datasheet") or {}, threshold_pct(ctx.config)
    chosen = dtypes(torch, target, ctx.config)
    judged_names = [figure for figure in chosen if figure in FIGURES]
    thresholds = datasheet_thresholds(judged_names, datasheet, threshold)
    failures: list[str] = []
    per_gpu: dict[str, dict] = {}
    if target.cuda:
        previous = torch.get_float32_matmul_precision()
        for index in range(target.gpus):
            with torch.cuda.device(index):
                figures = {}
                for figure, dtype in chosen.items():
                    torch.set_float32_matmul_precision("high" if figure == "tf32_tflops" else "highest")
                    figures[figure] = round(matmul_tflops(torch, f"cuda:{index}", GPU_N, dtype, index), 2)
            torch.set_float32_matmul_precision(previous)
            per_gpu[str(index)] = figures
            failures += judge_figures(figures, datasheet, threshold, f"GPU {index}: ")[0]
        size = GPU_N
    else:
        per_gpu["cpu"] = {figure: round(matmul_tflops(torch, "cpu", CPU_N, dtype, 0), 4)
                          for figure, dtype in chosen.items()}
        size = CPU_N
    slowest = {figure: min(gpu[figure] for gpu in per_gpu.values()) for figure in chosen}
    failures_min, judged = judge_figures({name: slowest[name] for name in judged_names}, datasheet, threshold)
    if not target.cuda:
        failures = failures_min
    figures = {**slowest, "n": size, "per_gpu": per_gpu, "device": target.describe()}
    if ctx.level == "burn-in" and target.cuda:
        figure = "bf16_tflops" if "bf16_tflops" in chosen else "fp16_tflops"
        seconds = burn_in_seconds(ctx.config, TIMEOUT - 60 - (time.monotonic() - start))
        load = sustained(torch, target.gpus, GPU_N, chosen[figure], seconds)
        figures["sustained"] = {"figure": figure, "seconds": round(seconds, 1),
                                "per_gpu": {str(index): round(value, 2) for index, value in load.items()}}
        for index, value in sorted(load.items()):
            failures += judge_figures({figure: value}, datasheet, threshold,
                                      f"GPU {index} sustained over {seconds:g} s: ")[0]
    summary = ", ".join(f"{name.split('_')[0]} {value:.4g} TFLOP/s" for name, value in slowest.items())
    summary = f"{target.describe()}, {size}x{size} matmul: {summary}"
    return perf_result(NAME, target, summary=summary, figures=figures, failures=failures, judged=judged,
                       wanted=judged_names, thresholds=thresholds, start=start)

