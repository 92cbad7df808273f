"""train.compile: torch.compile (TorchInductor: Triton kernels on a GPU, C++ on the CPU) trains the small
transformer a few steps under AMP: its first loss equals eager's from the same weights within a stated tolerance,
and its loss is finite and falls. The compile time and the compiled and eager step times are reported.

Where torch.compile cannot run for want of a compiler (no C/C++ compiler, no Triton, Python headers missing,
a GPU Triton does not support) the check is a skip naming what is missing, never a failure.
"""

from __future__ import annotations

import copy
import statistics
import time

from .core import FAIL, SKIP, Result, check
from .torchutil import (
    LOSS_THRESHOLDS,
    choose_precision,
    compiler_missing,
    first_line,
    private_cache,
    shift_task,
    toolchain_error,
    torch_check,
    train_result,
    train_steps,
    transformer_lm,
)

NAME = "train.compile"
SIZES = {
    "cpu": {"vocab": 64, "dim": 64, "heads": 4, "seq": 32, "batch": 16, "steps": 8},
    "cuda": {"vocab": 256, "dim": 256, "heads": 8, "seq": 128, "batch": 32, "steps": 12},
}
BURN_IN_STEPS = 50
FIRST_LOSS_RTOL = {"fp32": 1e-4, "amp": 2e-2}   # compiled vs eager first loss, relative


@check(NAME, timeout=300)
@torch_check(NAME)
def run(ctx, torch, target, start: float) -> Result:
    with private_cache():
        return compiled_training(ctx, torch, target, start)


def compiled_training(ctx, torch, target, start: float) -> Result:
    """The check once torch and its device are set up (in TorchInductor's private cache)."""
    missing = compiler_missing(torch, target)
    if missing:
        return Result(NAME, SKIP, f"torch.compile not run: {missing}", {"device": target.describe(first_gpu=True)},
                      seconds=time.monotonic() - start)
    precision = choose_precision(torch, target, ctx.config)
    size = SIZES[target.device]
    steps = BURN_IN_STEPS if ctx.level == "burn-in" else size["steps"]
    device = "cuda:0" if target.cuda else "cpu"
    rtol = FIRST_LOSS_RTOL["fp32" if precision.dtype is None else "amp"]
    torch.manual_seed(0)
    eager = transformer_lm(torch, size["vocab"], size["dim"], size["heads"], size["seq"]).to(device)
    twin = copy.deepcopy(eager)
    tokens, targets = shift_task(torch, size["batch"], size["seq"], size["vocab"])
    tokens, targets = tokens.to(device), targets.to(device)

    def loss_fn(logits, labels):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, size["vocab"]), labels.reshape(-1))

    figures = {"device": target.describe(first_gpu=True), "precision": precision.label}
    try:
        eager_losses, eager_seconds = train_steps(torch, eager, ((tokens, targets) for _ in range(3)), loss_fn,
                                                  target, precision)
        losses, seconds = train_steps(torch, torch.compile(twin), ((tokens, targets) for _ in range(steps)),
                                      loss_fn, target, precision)
    except Exception as exc:
        if toolchain_error(exc):
            return Result(NAME, SKIP, f"torch.compile not run, the compiler toolchain failed: {first_line(exc)}",
                          figures, seconds=time.monotonic() - start)
        return Result(NAME, FAIL, f"torch.compile training failed: {first_line(exc)}", figures,
                      seconds=time.monotonic() - start)
    compiled_step = statistics.median(seconds[1:])
    eager_step = statistics.median(eager_seconds[1:])
    figures.update({"compile_s": round(seconds[0], 2), "eager_step_ms": round(eager_step * 1e3, 3),
                    "speedup": round(eager_step / compiled_step, 2), "first_loss_eager": round(eager_losses[0], 5),
                    "first_loss_compiled": round(losses[0], 5)})
    problems = []
    if not abs(losses[0] - eager_losses[0]) <= rtol * abs(eager_losses[0]):
        problems.append(f"first loss {losses[0]:.6g} compiled against {eager_losses[0]:.6g} eager (relative "
                        f"difference above {rtol:g})")
    result = train_result(NAME, target, precision, "torch.compile training", losses, seconds,
                          items=size["batch"] * size["seq"], unit="tokens", start=start, figures=figures,
                          problems=problems)
    result.thresholds = {**LOSS_THRESHOLDS, "first_loss_rtol": rtol}
    return result
