"""train.dataloader: a DataLoader with worker processes (and pinned memory on a GPU) feeds the CNN for one
epoch: every sample arrives exactly once, every worker delivers, batches are pinned, and the loss falls.

Worker processes pass batches through /dev/shm: when it is too small they die with a bus error, which this
check reports (host.shm says how large it is).
"""

from __future__ import annotations

import collections
import os
import time

from .core import FAIL, Result, check
from .torchutil import (
    choose_precision,
    cnn,
    first_line,
    quadrant_sample,
    sized,
    torch_check,
    train_result,
    train_steps,
)

NAME = "train.dataloader"

SIZES = {
    ("cpu", "quick"): {"samples": 256, "batch": 32, "image": 32, "width": 16},
    ("cpu", "burn-in"): {"samples": 1024, "batch": 32, "image": 32, "width": 16},
    ("cuda", "quick"): {"samples": 2048, "batch": 64, "image": 64, "width": 32},
    ("cuda", "burn-in"): {"samples": 16384, "batch": 128, "image": 128, "width": 64},
}
LOADER_TIMEOUT = 60   # seconds a batch may take before the DataLoader gives up on its worker


class QuadrantImages:
    """A map-style dataset of learnable images (torchutil.quadrant_sample). Each item also carries its index and
    the id of the worker that made it, so the check can count what arrived and from whom."""

    def __init__(self, count: int, size: int, seed: int = 0):
        self.count, self.size, self.seed = count, size, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        import torch

        image, label = quadrant_sample(torch, index, self.size, self.seed)
        worker = torch.utils.data.get_worker_info()
        return image, label, index, worker.id if worker is not None else -1


def worker_count() -> int:
    return max(2, min(4, os.cpu_count() or 1))


def delivery_problems(indices: list[int], count: int, workers_seen: set[int], workers: int,
                      unpinned: int) -> list[str]:
    """What went wrong in an epoch's delivery: samples missing or twice, idle workers, unpinned batches."""
    problems = []
    counts = collections.Counter(indices)
    missing = sorted(set(range(count)) - counts.keys())
    twice = sorted(index for index, seen in counts.items() if seen > 1)
    if missing:
        problems.append(f"{len(missing)} of {count} sample(s) never arrived (first: {missing[:5]})")
    if twice:
        problems.append(f"{len(twice)} sample(s) arrived more than once (first: {twice[:5]})")
    idle = sorted(set(range(workers)) - workers_seen)
    if idle:
        problems.append(f"worker(s) {idle} of {workers} delivered no batch")
    if unpinned:
        problems.append(f"{unpinned} batch(es) not in pinned memory although pin_memory=True")
    return problems


@check(NAME, timeout=180)
@torch_check(NAME)
def run(ctx, torch, target, start: float) -> Result:
    precision = choose_precision(torch, target, ctx.config)
    size = sized(SIZES, target, ctx.level)
    device = "cuda:0" if target.cuda else "cpu"
    workers = worker_count()
    loader = torch.utils.data.DataLoader(
        QuadrantImages(size["samples"], size["image"]), batch_size=size["batch"], shuffle=True,
        generator=torch.Generator().manual_seed(0), num_workers=workers, pin_memory=target.cuda,
        timeout=LOADER_TIMEOUT)
    indices: list[int] = []
    workers_seen: set[int] = set()
    unpinned = 0

    def batches():
        nonlocal unpinned
        for images, labels, index, worker in loader:
            unpinned += int(target.cuda and not images.is_pinned())
            indices.extend(index.tolist())
            workers_seen.update(worker.tolist())
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)

    torch.manual_seed(0)
    figures = {"workers": workers, "pin_memory": target.cuda, "samples": size["samples"], "batch": size["batch"]}
    began = time.perf_counter()
    try:
        model = cnn(torch, width=size["width"]).to(device)
        losses, seconds = train_steps(torch, model, batches(), torch.nn.functional.cross_entropy, target,
                                      precision)
    except Exception as exc:  # a worker killed (bus error: /dev/shm too small), a timeout, a CUDA error
        hint = " (/dev/shm too small for the workers? see host.shm)" if "bus error" in str(exc).lower() else ""
        return Result(NAME, FAIL, f"DataLoader with {workers} workers failed: {first_line(exc)}{hint}", figures,
                      seconds=time.monotonic() - start)
    epoch = time.perf_counter() - began
    figures["epoch_s"] = round(epoch, 3)
    figures["epoch_samples_per_s"] = round(size["samples"] / epoch, 1)
    figures["workers_seen"] = sorted(workers_seen)
    problems = delivery_problems(indices, size["samples"], workers_seen, workers, unpinned)
    return train_result(NAME, target, precision, f"DataLoader ({workers} workers, pin_memory={target.cuda}) "
                        "feeding CNN training", losses, seconds, items=size["batch"], unit="images", start=start,
                        figures=figures, problems=problems)
