"""train.transformer: a small transformer language model trains a few steps on GPU 0 under AMP (bf16 autocast
where the GPU has bf16, fp16 with GradScaler otherwise), and its loss is finite and falls.

The task is fixed and learnable (each token's target is the token + 1), so a working GPU, cuBLAS and
attention kernel make the loss fall within a few steps; NaN/inf or a flat loss means they do not.
"""

from __future__ import annotations

import time

from .core import FAIL, Result, check
from .torchutil import (
    choose_precision,
    first_line,
    shift_task,
    sized,
    torch_check,
    train_result,
    train_steps,
    transformer_lm,
)

NAME = "train.transformer"

# (device, level) -> model and run size
SIZES = {
    ("cpu", "quick"): {"vocab": 64, "dim": 64, "heads": 4, "seq": 32, "batch": 16, "layers": 1, "steps": 12,
                       "lr": 3e-3},
    ("cpu", "burn-in"): {"vocab": 128, "dim": 128, "heads": 4, "seq": 64, "batch": 16, "layers": 2, "steps": 40,
                         "lr": 3e-3},
    ("cuda", "quick"): {"vocab": 256, "dim": 256, "heads": 8, "seq": 128, "batch": 32, "layers": 2, "steps": 20,
                        "lr": 3e-3},
    ("cuda", "burn-in"): {"vocab": 1024, "dim": 1024, "heads": 16, "seq": 512, "batch": 16, "layers": 4,
                          "steps": 200, "lr": 1e-3},
}


@check(NAME, timeout=180)
@torch_check(NAME)
def run(ctx, torch, target, start: float) -> Result:
    precision = choose_precision(torch, target, ctx.config)
    size = sized(SIZES, target, ctx.level)
    device = "cuda:0" if target.cuda else "cpu"
    torch.manual_seed(0)
    try:
        model = transformer_lm(torch, size["vocab"], size["dim"], size["heads"], size["seq"], size["layers"])
        model = model.to(device)
        tokens, targets = shift_task(torch, size["batch"], size["seq"], size["vocab"])
        tokens, targets = tokens.to(device), targets.to(device)

        def loss_fn(logits, labels):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, size["vocab"]), labels.reshape(-1))

        batches = ((tokens, targets) for _ in range(size["steps"]))
        losses, seconds = train_steps(torch, model, batches, loss_fn, target, precision, lr=size["lr"])
    except Exception as exc:  # a CUDA error, out of memory, a kernel torch lacks for this GPU
        return Result(NAME, FAIL, f"transformer training failed: {first_line(exc)}",
                      {"device": target.describe(first_gpu=True), "precision": precision.label},
                      seconds=time.monotonic() - start)
    params = sum(parameter.numel() for parameter in model.parameters())
    return train_result(NAME, target, precision, "transformer block training", losses, seconds,
                        items=size["batch"] * size["seq"], unit="tokens", start=start,
                        figures={"params": params, "batch": size["batch"], "seq": size["seq"]})
