"""train.cnn: a small convolutional network (conv, batch norm, pooling: the cuDNN path) trains a few steps on
GPU 0 under AMP, in channels-last layout on a GPU, and its loss is finite and falls.

The images are learnable: noise with a bright square in one quadrant, labelled with the quadrant.
"""

from __future__ import annotations

import time

from .core import FAIL, Result, check
from .torchutil import (
    choose_precision,
    cnn,
    first_line,
    quadrant_batch,
    sized,
    torch_check,
    train_result,
    train_steps,
)

NAME = "train.cnn"

SIZES = {
    ("cpu", "quick"): {"batch": 32, "image": 32, "width": 16, "steps": 12},
    ("cpu", "burn-in"): {"batch": 64, "image": 64, "width": 16, "steps": 30},
    ("cuda", "quick"): {"batch": 128, "image": 64, "width": 32, "steps": 20},
    ("cuda", "burn-in"): {"batch": 256, "image": 128, "width": 64, "steps": 200},
}


@check(NAME, timeout=180)
@torch_check(NAME)
def run(ctx, torch, target, start: float) -> Result:
    precision = choose_precision(torch, target, ctx.config)
    size = sized(SIZES, target, ctx.level)
    device = "cuda:0" if target.cuda else "cpu"
    layout = torch.channels_last if target.cuda else torch.contiguous_format
    torch.manual_seed(0)
    try:
        model = cnn(torch, width=size["width"]).to(device, memory_format=layout)
        images, labels = quadrant_batch(torch, size["batch"], size["image"])
        images, labels = images.to(device, memory_format=layout), labels.to(device)
        batches = ((images, labels) for _ in range(size["steps"]))
        losses, seconds = train_steps(torch, model, batches, torch.nn.functional.cross_entropy, target, precision)
    except Exception as exc:  # a CUDA or cuDNN error, out of memory
        return Result(NAME, FAIL, f"CNN training failed: {first_line(exc)}",
                      {"device": target.describe(first_gpu=True), "precision": precision.label},
                      seconds=time.monotonic() - start)
    return train_result(NAME, target, precision, "CNN training", losses, seconds, items=size["batch"],
                        unit="images", start=start,
                        figures={"batch": size["batch"], "image": size["image"],
                                 "layout": "channels_last" if target.cuda else "contiguous"})
