"""perf.copy: memory copies of every GPU, what nvbandwidth measures: device-to-device (GB/s counts the bytes read
and written, as CUDA's bandwidthTest does) and host-to-device and device-to-host from pinned memory (a link
trained down to x8 or an older generation shows there). Each is judged at threshold_pct of the model's expected
figure (the config's `expected` block: device-to-device as NVIDIA's DCGM measures the model's memory bandwidth,
host copies as nvbandwidth's share of the PCIe link; or a marked fallback). CUDA events, median of repeats after
warm-up, random data. The figures are the slowest GPU's; `per_gpu` has each one's.

On the CPU a host memory copy is measured as d2d_gbs and reported, not judged; there is no host-device copy.
"""

from __future__ import annotations

import statistics

from . import nvsmi
from .core import Result, check
from .torchutil import (
    expected_thresholds,
    judge_figures,
    perf_result,
    randn,
    sized,
    threshold_pct,
    time_calls,
    torch_check,
)

NAME = "perf.copy"
MIB = 1 << 20
# (device, level) -> (device copy MiB, host copy MiB, warm-up, repeats, copies a repeat)
SIZES = {
    ("cuda", "quick"): (1024, 256, 3, 10, 5),
    ("cuda", "burn-in"): (4096, 1024, 5, 100, 5),
    ("cpu", "quick"): (64, 0, 1, 5, 1),
    ("cpu", "burn-in"): (256, 0, 2, 20, 1),
}


def copy_gbs(torch, device: str, dst, src, moved: int, sizes: tuple) -> float:
    """GB/s of dst.copy_(src) when one copy moves `moved` bytes."""
    _, _, warmup, repeats, inner = sizes
    times = time_calls(torch, lambda: dst.copy_(src, non_blocking=True), device, warmup=warmup, repeats=repeats,
                       inner=inner)
    return moved / statistics.median(times) / 1e9


def gpu_copies(torch, index: int, sizes: tuple) -> dict[str, float]:
    device_mib, host_mib = sizes[0], sizes[1]
    device = f"cuda:{index}"
    with torch.cuda.device(index):
        src = randn(torch, (device_mib * MIB // 4,), index, device)
        dst = torch.empty_like(src)
        d2d = copy_gbs(torch, "cuda", dst, src, 2 * src.numel() * 4, sizes)
        del src, dst
        host = torch.empty(host_mib * MIB // 4, dtype=torch.float32, pin_memory=True).uniform_()
        on_device = torch.empty(host.numel(), dtype=torch.float32, device=device)
        h2d = copy_gbs(torch, "cuda", on_device, host, host.numel() * 4, sizes)
        d2h = copy_gbs(torch, "cuda", host, on_device, host.numel() * 4, sizes)
    return {"d2d_gbs": round(d2d, 2), "h2d_gbs": round(h2d, 2), "d2h_gbs": round(d2h, 2)}


@check(NAME, timeout=180)
@torch_check(NAME, problem_fails=False)
def run(ctx, torch, target, start: float) -> Result:
    mig = nvsmi.mig_judgement(ctx, target.names).not_scaled(NAME, "its copies follow its memory slices", start)
    if mig:
        return mig
    expected, threshold = ctx.config.get("expected") or {}, threshold_pct(ctx.config)
    sizes = sized(SIZES, target, ctx.level)
    failures: list[str] = []
    if target.cuda:
        per_gpu = {str(index): gpu_copies(torch, index, sizes) for index in range(target.gpus)}
        for index, figures in per_gpu.items():
            failures += judge_figures(figures, expected, threshold, f"GPU {index}: ")[0]
        wanted = ["d2d_gbs", "h2d_gbs", "d2h_gbs"]
    else:
        src = randn(torch, (sizes[0] * MIB // 4,), 0)
        per_gpu = {"cpu": {"d2d_gbs": round(copy_gbs(torch, "cpu", torch.empty_like(src), src, 2 * sizes[0] * MIB,
                                                     sizes), 3)}}
        wanted = ["d2d_gbs"]
    slowest = {figure: min(gpu[figure] for gpu in per_gpu.values()) for figure in wanted}
    failures_min, judged = judge_figures(slowest, expected, threshold)
    if not target.cuda:
        failures = failures_min
    summary = ", ".join(f"{name.split('_')[0]} {value:.4g} GB/s" for name, value in slowest.items())
    where = (f"{target.describe()}, {sizes[0]} MiB device copy, {sizes[1]} MiB pinned host copies" if target.cuda
             else f"{target.describe()}: host memory copy of {sizes[0]} MiB (no GPU, no host-device copy)")
    return perf_result(NAME, target, summary=f"{where}: {summary}",
                       figures={**slowest, "per_gpu": per_gpu, "device": target.describe()}, failures=failures,
                       judged=judged, wanted=wanted, thresholds=expected_thresholds(wanted, ctx.config),
                       start=start)
