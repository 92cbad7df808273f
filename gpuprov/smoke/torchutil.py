"""What the torch checks share: where they run (GPU or CPU) and in which precision, timing (CUDA events after
warm-up, median of repeats), seeded random data and the small models, the loss and datasheet verdicts, and a
process group (torchrun) run under a timeout.

torch is never imported at module level: every function that needs it takes the module as its first argument,
so the suite imports (and lists its checks) on a host without torch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from .core import FAIL, PASS, SKIP, Result
from .isolation import kill_group, process_folder

LOSS_WINDOW = 3           # steps averaged at each end of a training run
MAX_LOSS_RATIO = 0.9      # the last steps' mean loss must be at most this fraction of the first steps'
DEFAULT_THRESHOLD_PCT = 80.0
DEFAULT_BURN_IN_SECONDS = 60.0

# figure name -> (what it measures, unit, the key of the config's `expected` block it is judged against)
FIGURES = {
    "bf16_tflops": ("bf16 matmul", "TFLOP/s", "bf16_tflops"),
    "fp16_tflops": ("fp16 matmul", "TFLOP/s", "fp16_tflops"),
    "tf32_tflops": ("tf32 matmul", "TFLOP/s", "tf32_tflops"),
    "d2d_gbs": ("device-to-device copy", "GB/s", "d2d_gbs"),
    "h2d_gbs": ("host-to-device copy (pinned)", "GB/s", "h2d_gbs"),
    "d2h_gbs": ("device-to-host copy (pinned)", "GB/s", "d2h_gbs"),
    "busbw_gbs": ("all-reduce bus bandwidth", "GB/s", "allreduce_busbw_gbs"),
}


def import_torch() -> tuple[Any, str]:
    """torch, or None and why it cannot be imported."""
    try:
        import torch
    except Exception as exc:  # ImportError, or OSError from a wheel whose CUDA libraries are missing
        return None, f"torch is not importable ({type(exc).__name__}: {exc})"
    return torch, ""


def no_torch(name: str, reason: str, start: float) -> Result:
    return Result(name, SKIP, reason, seconds=time.monotonic() - start)


def torch_check(name: str, *, problem_fails: bool = True, first: Callable[[Any, float], Result | None] | None = None):
    """The preamble every torch check starts with, as a decorator: `body(ctx, torch, target, start)` runs with
    torch imported and the target set up; without torch the check skips with the reason. `problem_fails`: a
    target with a problem (a CUDA torch that sees no GPU) fails at once, before the body; the perf checks pass
    False and judge the problem beside their figures (perf_result). `first(ctx, start)`: a verdict reached before
    torch is imported (train.ddp's MIG skip), or None to go on."""

    def wrap(body: Callable[..., Result]) -> Callable[[Any], Result]:
        @functools.wraps(body)
        def run(ctx) -> Result:
            start = time.monotonic()
            early = first(ctx, start) if first else None
            if early is not None:
                return early
            torch, why = import_torch()
            if torch is None:
                return no_torch(name, why, start)
            target = setup_target(torch, ctx.config)
            if problem_fails and target.problem:
                return Result(name, FAIL, target.problem, seconds=time.monotonic() - start)
            return body(ctx, torch, target, start)

        return run

    return wrap


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the torch checks run: every GPU torch sees, else the CPU. `problem` says why running on the CPU is
    itself a fault: a CUDA build of torch that sees no GPU on a host whose nvidia-smi lists GPUs."""

    device: str                     # "cuda" | "cpu"
    gpus: int = 0
    names: tuple[str, ...] = ()
    problem: str = ""

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def describe(self, first_gpu: bool = False) -> str:
        """"CPU (1 thread)", "8 x NVIDIA H100 80GB HBM3", or with `first_gpu` the one GPU a check uses."""
        if not self.cuda:
            return "CPU (1 thread)"
        if first_gpu:
            return f"GPU 0 ({self.names[0]})"
        kinds = sorted(set(self.names))
        return f"{self.gpus} x {kinds[0]}" if len(kinds) == 1 else ", ".join(self.names)


def setup_target(torch, config: dict) -> Target:
    """The GPUs torch sees, else the CPU (with the problem when the host has GPUs and torch is built for CUDA).

    On the CPU torch is set to one thread: OpenMP threads stall each other on a shared or quota-limited CPU
    (a lab host, a container), which makes a small model 10-100 times slower; one thread measures steadily."""
    error = ""
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken CUDA install raises here
        count, error = 0, f" ({type(exc).__name__}: {exc})"
    if count:
        return Target("cuda", count, tuple(torch.cuda.get_device_name(index) for index in range(count)))
    torch.set_num_threads(1)
    problem = ""
    if torch.version.cuda and config.get("gpus_visible"):
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        problem = (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU{error}, "
                   "while nvidia-smi lists GPUs on this host"
                   + (f" (CUDA_VISIBLE_DEVICES={hidden!r})" if hidden is not None else ""))
    return Target("cpu", problem=problem)


def sized(table: dict[tuple[str, str], Any], target: Target, level: str) -> Any:
    """A check's sizes for where it runs ("cuda" or "cpu") and its level (anything but burn-in is quick)."""
    return table[(target.device, level if level == "burn-in" else "quick")]


@dataclasses.dataclass(frozen=True)
class Precision:
    """The autocast dtype (None: fp32 without autocast) and whether fp16 needs a GradScaler."""

    dtype: Any
    scaler: bool
    label: str


def choose_precision(torch, target: Target, config: dict) -> Precision:
    """bf16 autocast where the GPU has bf16, fp16 autocast with GradScaler otherwise; on the CPU bf16 autocast
    where the CPU computes bf16 natively (AVX512-BF16 or AMX), else fp32."""
    if target.cuda:
        expected = (config.get("expect") or {}).get("bf16")
        if expected is not False and cuda_bf16(torch):
            return Precision(torch.bfloat16, False, "bf16 autocast")
        why = "the GPU has no bf16" if expected is False else "torch reports no bf16 on this GPU"
        return Precision(torch.float16, True, f"fp16 autocast with GradScaler ({why})")
    if _cpu_bf16(torch):
        return Precision(torch.bfloat16, False, "bf16 autocast on CPU")
    return Precision(None, False, "fp32 on CPU (no native bf16 on this CPU)")


def cuda_bf16(torch) -> bool:
    """Whether the current GPU computes bf16 natively (not by emulation, as torch counts it on older GPUs)."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 has no including_emulation
        return bool(torch.cuda.is_bf16_supported())


def _cpu_bf16(torch) -> bool:
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, probe, lambda: False)()) for probe in probes)


def autocast(torch, target: Target, precision: Precision):
    return torch.autocast(target.device, dtype=precision.dtype, enabled=precision.dtype is not None)


def train_steps(torch, model, batches: Iterable, loss_fn: Callable, target: Target, precision: Precision,
                lr: float = 3e-3) -> tuple[list[float], list[float]]:
    """Train `model` on `batches` ((input, label) pairs already on the device) with AdamW under the precision:
    the loss and the seconds of each step (`.item()` waits for the GPU, so a step's time is real)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(target.device) if precision.scaler else None
    losses: list[float] = []
    seconds: list[float] = []
    for inputs, labels in batches:
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast(torch, target, precision):
            outputs = model(inputs)
        loss = loss_fn(outputs.float(), labels)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - began)
    return losses, seconds


def loss_verdict(losses: list[float], window: int = LOSS_WINDOW,
                 max_ratio: float = MAX_LOSS_RATIO) -> tuple[str, dict]:
    """"" when the loss is finite at every step and the mean of the last `window` steps is at most `max_ratio`
    times the mean of the first `window`; else why not. Also the figures it judged."""
    if len(losses) < 2 * window:
        return f"only {len(losses)} training steps ran, {2 * window} are needed to judge the loss", {}
    first = statistics.fmean(losses[:window])
    last = statistics.fmean(losses[-window:])
    ratio = last / first if first else math.inf
    figures = {"steps": len(losses), "loss_first": json_number(first, 4), "loss_last": json_number(last, 4),
               "loss_ratio": json_number(ratio, 4)}
    bad = next((step for step, loss in enumerate(losses) if not math.isfinite(loss)), None)
    if bad is not None:
        return f"loss is not finite at step {bad + 1} of {len(losses)} ({losses[bad]})", figures
    if ratio > max_ratio:
        return (f"loss did not fall: {last:.4g} (mean of the last {window} steps) against {first:.4g} (mean of "
                f"the first {window}), ratio {ratio:.3f} where at most {max_ratio:g} is needed"), figures
    return "", figures


LOSS_THRESHOLDS = {"loss_window": LOSS_WINDOW, "max_loss_ratio": MAX_LOSS_RATIO}


def json_number(value: float, digits: int = 3) -> float | str:
    """A figure for the JSON document: rounded, and "nan" / "inf" as text (JSON has no such numbers)."""
    return round(value, digits) if math.isfinite(value) else str(value)


def time_calls(torch, fn: Callable[[], Any], device: str, *, warmup: int, repeats: int,
               inner: int = 1) -> list[float]:
    """Seconds one call of `fn` takes, measured `repeats` times (each over `inner` calls) after `warmup` calls:
    CUDA events on the current stream of the current GPU, time.perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0 / inner)
        return times
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - began) / inner)
    return times


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p50 of 1..100 is 50, p99 is 99)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100.0 * len(ordered)) - 1)]


def randn(torch, shape: tuple[int, ...], seed: int, device: str = "cpu", dtype=None):
    """Seeded normal random data, made on the device itself."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=dtype or torch.float32)


def quadrant_sample(torch, index: int, size: int, seed: int = 0):
    """One learnable image: noise with a bright square in one quadrant, and the quadrant (0-3) as its label.
    Sample `index` is always the same image."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    image = torch.randn(3, size, size, generator=generator) * 0.5
    label = int(torch.randint(0, 4, (1,), generator=generator))
    half, side = size // 2, max(2, size // 4)
    row, col = divmod(label, 2)
    top, left = row * half + (half - side) // 2, col * half + (half - side) // 2
    image[:, top:top + side, left:left + side] += 2.0
    return image, label


def quadrant_batch(torch, count: int, size: int, seed: int = 0):
    samples = [quadrant_sample(torch, index, size, seed) for index in range(count)]
    return torch.stack([image for image, _ in samples]), torch.tensor([label for _, label in samples])


def cnn(torch, width: int = 16, classes: int = 4):
    """A small convolutional network (conv, batch norm, ReLU, pooling, linear) for 3-channel images."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(2 * width * 16, classes))


def transformer_lm(torch, vocab: int, dim: int, heads: int, seq: int, layers: int = 1):
    """A small transformer language model: embedding, learned positions, pre-norm encoder block(s), head."""
    nn = torch.nn

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.position = nn.Parameter(torch.zeros(seq, dim))
            block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.head = nn.Linear(dim, vocab)

        def forward(self, tokens):
            return self.head(self.blocks(self.embed(tokens) + self.position[: tokens.shape[1]]))

    return TinyLM()


def shift_task(torch, batch: int, seq: int, vocab: int, seed: int = 1):
    """Random tokens and their learnable targets (each token + 1, modulo the vocabulary)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq), generator=generator)
    return tokens, (tokens + 1) % vocab


def threshold_pct(config: dict) -> float:
    value = config.get("threshold_pct")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEFAULT_THRESHOLD_PCT


def burn_in_seconds(config: dict, cap: float) -> float:
    value = config.get("burn_in_seconds")
    seconds = float(value) if isinstance(value, (int, float)) and value > 0 else DEFAULT_BURN_IN_SECONDS
    return min(seconds, cap)


def judge_figures(measured: dict[str, float], expected: dict, threshold: float,
                  where: str = "") -> tuple[list[str], dict[str, float]]:
    """Each measured figure against its expected figure (the config's `expected` block, published measurements of
    the GPU model; FIGURES names the key): the failures, each with both numbers and the threshold, and the
    percentage of the expected figure of every figure that could be judged."""
    failures: list[str] = []
    pct: dict[str, float] = {}
    for figure, value in measured.items():
        what, unit, key = FIGURES[figure]
        reference = (expected or {}).get(key)
        if value is None or not reference:
            continue
        pct[figure] = round(100.0 * value / reference, 1)
        if pct[figure] < threshold:
            failures.append(f"{where}{what} {value:.4g} {unit} is {pct[figure]:.1f} % of the expected "
                            f"{reference:g} {unit} (at least {threshold:g} % needed)")
    return failures, pct


def expected_thresholds(figures: Iterable[str], config: dict) -> dict:
    """The thresholds record of a perf check: the percentage needed, the expected figure of each figure and what
    it rests on (a published measurement, or a fallback)."""
    keys = {figure: FIGURES[figure][2] for figure in figures}
    expected, basis = config.get("expected") or {}, config.get("expected_basis") or {}
    return {"threshold_pct": threshold_pct(config),
            "expected": {figure: expected.get(key) for figure, key in keys.items()},
            "expected_keys": keys,
            "expected_basis": {figure: basis[key] for figure, key in keys.items() if isinstance(basis.get(key), str)}}


def perf_result(name: str, target: Target, *, summary: str, figures: dict, failures: list[str],
                judged: dict[str, float], wanted: Iterable[str], thresholds: dict, start: float) -> Result:
    """A perf check's verdict. On a GPU: fail when a figure is under the threshold, skip when nothing is expected
    of any of the figures, else pass. On the CPU: skip (measured, not judged), unless torch should have seen the
    GPUs, which fails."""
    if target.cuda or target.problem:
        figures = {**figures, "pct_of_expected": judged}
    seconds = time.monotonic() - start
    if target.problem:
        return Result(name, FAIL, "; ".join([target.problem, *failures]), figures, thresholds, seconds)
    if not target.cuda:
        return Result(name, SKIP, f"no GPU: measured on CPU, not judged against the datasheet ({summary})",
                      figures, thresholds, seconds)
    if failures:
        return Result(name, FAIL, "; ".join(failures), figures, thresholds, seconds)
    unjudged = [figure for figure in wanted if figure not in judged]
    if not judged:
        keys = ", ".join(sorted({FIGURES[figure][2] for figure in unjudged}))
        return Result(name, SKIP, f"no expected figure to judge against ({keys}): {summary}", figures,
                      thresholds, seconds)
    note = f"; not judged (no expected figure): {', '.join(unjudged)}" if unjudged else ""
    return Result(name, PASS, f"{summary}: at least {thresholds['threshold_pct']:g} % of the expected figures"
                  f"{note}", figures, thresholds, seconds)


def compiler_missing(torch, target: Target) -> str:
    """Why torch.compile (TorchInductor) cannot run here, or "" when it can be tried."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:
        import torch._dynamo as dynamo

        if not dynamo.is_dynamo_supported():
            return f"torch.compile does not support this Python ({'.'.join(map(str, sys.version_info[:2]))})"
    except Exception as exc:
        return f"torch._dynamo is unusable ({type(exc).__name__}: {exc})"
    if not target.cuda:
        names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
        if not any(name and shutil.which(name) for name in names):
            return "no C++ compiler (g++, c++ or clang++) for TorchInductor's CPU code"
        return ""
    major, minor = torch.cuda.get_device_capability(0)
    if major < 7:
        return f"Triton needs compute capability 7.0 or newer, GPU 0 has {major}.{minor}"
    try:
        import triton  # noqa: F401
    except Exception as exc:
        return f"Triton is not importable ({type(exc).__name__}: {exc})"
    if not any(name and shutil.which(name) for name in (os.environ.get("CC", ""), "cc", "gcc", "clang")):
        return "no C compiler (cc, gcc or clang) for Triton's launcher"
    return ""


TOOLCHAIN_ERRORS = ("InvalidCxxCompiler", "Python.h", "Failed to find C compiler", "No working C compiler",
                    "command not found", "cannot find -l", "crti.o")


def toolchain_error(exc: BaseException) -> bool:
    """Whether torch.compile failed for want of a working compiler toolchain (headers, linker), not torch."""
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in TOOLCHAIN_ERRORS)


def private_cache(root=None):
    """A context in which TorchInductor keeps and loads its compiled kernels (TORCHINDUCTOR_CACHE_DIR, Triton's
    cache below it) and torch's other temporary files (tempfile's folder, TMPDIR: torch also builds paths from
    `default_cache_dir()`, /tmp/torchinductor_<user>, ignoring TORCHINDUCTOR_CACHE_DIR) in a folder only this user
    can change: `cache` beside the suite when it and the suite's folder are this user's and writable by it alone
    (validate makes /opt/gpuprov/cache so: warm runs reuse the kernels), else this process's own temporary folder,
    removed when the process ends (one per process: torch fixes its precompiled-header folder at the first import of
    torch._inductor.codecache, so a second compile in the process must find it still there). Never
    /tmp/torchinductor_<user>, which another user can create first, filled with code root would load. Enter it
    before torch._dynamo is imported (its import fixes a cache path)."""
    import contextlib
    import tempfile

    from .core import ROOT

    base = str(ROOT if root is None else root)

    def own(path) -> bool:
        try:
            found = os.lstat(path)
        except OSError:
            return False
        return os.path.isdir(path) and not os.path.islink(path) and found.st_uid == os.geteuid() and not (
            found.st_mode & 0o022)

    @contextlib.contextmanager
    def use(folder: str):
        names = ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")
        before = tempfile.tempdir, {name: os.environ.get(name) for name in names}
        tempfile.tempdir = os.environ["TMPDIR"] = folder
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "torchinductor")
        try:
            yield os.environ["TORCHINDUCTOR_CACHE_DIR"]
        finally:
            tempfile.tempdir = before[0]
            for name, value in before[1].items():
                os.environ.pop(name, None) if value is None else os.environ.update({name: value})

    @contextlib.contextmanager
    def chosen():
        if own(base) and own(os.path.join(base, "cache")):
            with use(os.path.join(base, "cache")) as folder:
                yield folder
            return
        with use(process_folder()) as folder:
            yield folder

    return chosen()


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for the local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_group(argv: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, str]:
    """Run a command in its own process group and kill the whole group at the timeout (torchrun's workers
    included): rc 124 and "timed out after N s" in stderr then; rc 127 when the command is missing."""
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                   start_new_session=True)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        out, err = process.communicate()
        return 124, out, f"{err}\n{' '.join(argv[:4])} ...: timed out after {timeout:g} s"
    except BaseException:
        kill_group(process.pid)
        raise
    return process.returncode, out, err


def tail(text: str, lines: int = 6) -> str:
    """The last lines of a command's output, for a reason."""
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def train_result(name: str, target: Target, precision: Precision, what: str, losses: list[float],
                 seconds: list[float], *, items: int, unit: str, start: float, figures: dict | None = None,
                 problems: list[str] | None = None) -> Result:
    """A training check's verdict: fail on a non-finite or non-falling loss (or the check's own problems),
    else pass; figures with the loss at both ends, the step time and `items` a step as `unit`/s."""
    verdict, loss_figures = loss_verdict(losses)
    step = statistics.median(seconds[1:] or seconds)
    figures = {"device": target.describe(first_gpu=True), "precision": precision.label, **loss_figures,
               "step_ms": round(step * 1e3, 3), f"{unit}_per_s": round(items / step, 1), **(figures or {})}
    problems = [*(problems or []), *([verdict] if verdict else [])]
    if problems:
        return Result(name, FAIL, f"{what}: " + "; ".join(problems), figures, dict(LOSS_THRESHOLDS),
                      time.monotonic() - start)
    return Result(name, PASS, f"{what} on {target.describe(first_gpu=True)} with {precision.label}: loss "
                  f"{loss_figures['loss_first']:.4g} -> {loss_figures['loss_last']:.4g} over {len(losses)} steps",
                  figures, dict(LOSS_THRESHOLDS), time.monotonic() - start)
