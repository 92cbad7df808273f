"""infer.latency: inference latency (p50, p99) and throughput of a small transformer on GPU 0 at batch 1 and
batch 32, and the gain batching gives (batch-32 throughput over batch-1 throughput): what dynamic batching in an
inference server relies on. A gain under the threshold (default 1.5: batching must pay) fails.

Each call is timed on its own (CUDA events around it, after warm-up; time.perf_counter on the CPU), in inference
mode under the check suite's precision (bf16/fp16 autocast on a GPU).
"""

from __future__ import annotations

import time

from .core import FAIL, PASS, Result, check
from .torchutil import (
    autocast,
    choose_precision,
    first_line,
    percentile,
    shift_task,
    sized,
    time_calls,
    torch_check,
    transformer_lm,
)

NAME = "infer.latency"
MIN_BATCHING_GAIN = 1.5
BATCHES = (1, 32)
SIZES = {
    "cpu": {"vocab": 64, "dim": 64, "heads": 4, "seq": 32, "layers": 1},
    "cuda": {"vocab": 1024, "dim": 512, "heads": 8, "seq": 128, "layers": 2},
}
CALLS = {("cpu", "quick"): (5, 50), ("cpu", "burn-in"): (10, 500),
         ("cuda", "quick"): (10, 200), ("cuda", "burn-in"): (50, 2000)}    # warm-up, timed calls


def latency_figures(batch: int, times: list[float]) -> dict[str, float]:
    """p50 and p99 in ms and samples per second over all timed calls."""
    return {f"b{batch}_p50_ms": round(percentile(times, 50) * 1e3, 4),
            f"b{batch}_p99_ms": round(percentile(times, 99) * 1e3, 4),
            f"b{batch}_per_s": round(batch * len(times) / sum(times), 1)}


@check(NAME, timeout=180)
@torch_check(NAME)
def run(ctx, torch, target, start: float) -> Result:
    precision = choose_precision(torch, target, ctx.config)
    size = SIZES[target.device]
    warmup, calls = sized(CALLS, target, ctx.level)
    minimum = ctx.config.get("min_batching_gain")
    minimum = float(minimum) if isinstance(minimum, (int, float)) and minimum > 0 else MIN_BATCHING_GAIN
    device = "cuda:0" if target.cuda else "cpu"
    torch.manual_seed(0)
    figures = {"device": target.describe(first_gpu=True), "precision": precision.label}
    try:
        model = transformer_lm(torch, size["vocab"], size["dim"], size["heads"], size["seq"], size["layers"])
        model = model.to(device).eval()
        for batch in BATCHES:
            tokens = shift_task(torch, batch, size["seq"], size["vocab"])[0].to(device)

            def infer(tokens=tokens):
                with torch.inference_mode(), autocast(torch, target, precision):
                    return model(tokens)

            figures.update(latency_figures(batch, time_calls(torch, infer, target.device, warmup=warmup,
                                                             repeats=calls)))
    except Exception as exc:
        return Result(NAME, FAIL, f"inference failed: {first_line(exc)}", figures, seconds=time.monotonic() - start)
    gain = figures["b32_per_s"] / figures["b1_per_s"]
    figures["batching_gain"] = round(gain, 2)
    thresholds = {"min_batching_gain": minimum, "calls": calls, "seq": size["seq"]}
    summary = (f"batch 1: p50 {figures['b1_p50_ms']:.3g} ms, p99 {figures['b1_p99_ms']:.3g} ms, "
               f"{figures['b1_per_s']:.4g}/s; batch 32: p50 {figures['b32_p50_ms']:.3g} ms, p99 "
               f"{figures['b32_p99_ms']:.3g} ms, {figures['b32_per_s']:.4g}/s; batching gain {gain:.3g}x")
    seconds = time.monotonic() - start
    if gain < minimum:
        return Result(NAME, FAIL, f"batching gains too little on {figures['device']}: {summary} (at least "
                      f"{minimum:g}x needed)", figures, thresholds, seconds)
    return Result(NAME, PASS, f"{figures['device']}, {precision.label}: {summary}", figures, thresholds, seconds)
