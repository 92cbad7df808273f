"""software: torch reports the CUDA, cuDNN and NCCL versions the stack promised; the versions are recorded.

torch's own view is what a training job gets: `torch.version.cuda` (the CUDA the wheel was built for),
`torch.backends.cudnn.version()` and `torch.cuda.nccl.version()` (the libraries it loads). Each is compared with
the config's `expect` (`cuda`, `cudnn`, `nccl`) on the components both give (their common precision, at least
major.minor): `12.8` matches 12.8 and 12.8.1, `2.26.5` only 2.26.5, a release note's cuDNN `9.1.0.70` torch's
`9.1.0`. A CPU build of torch reports none of them: skip, saying so.
"""

from __future__ import annotations

import time

from .core import FAIL, PASS, SKIP, Result, check, version_matches

NAME = "software"


def cudnn_text(code: int | None) -> str | None:
    """cuDNN's version number as text: 9.x encodes major*10000+minor*100+patch, 8.x major*1000+minor*100+patch."""
    if not code:
        return None
    if code >= 90000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def nccl_text(raw) -> str | None:
    """torch.cuda.nccl.version(): a (major, minor, patch) tuple, or an int in older torch (2.9+ codes are
    major*10000+minor*100+patch, earlier ones major*1000+minor*100+patch)."""
    if raw is None:
        return None
    if isinstance(raw, (tuple, list)):
        return ".".join(str(part) for part in raw[:3])
    code = int(raw)
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def torch_versions() -> dict:
    """torch, CUDA, cuDNN and NCCL versions as torch reports them (None where it reports none)."""
    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None, "nccl": None}
    try:
        if torch.backends.cudnn.is_available():
            out["cudnn"] = cudnn_text(torch.backends.cudnn.version())
    except Exception:
        out["cudnn"] = None
    try:
        out["nccl"] = nccl_text(torch.cuda.nccl.version()) if torch.version.cuda else None
    except Exception:
        out["nccl"] = None
    return out


@check(NAME, timeout=120)
def run(ctx) -> Result:
    start = time.monotonic()
    try:
        versions = torch_versions()
    except ImportError as exc:
        return Result(NAME, SKIP, f"torch is not importable ({exc})", {}, seconds=time.monotonic() - start)
    expected = {key: ctx.expect(key) for key in ("cuda", "cudnn", "nccl")}
    thresholds = {key: value for key, value in expected.items() if value}
    seconds = time.monotonic() - start
    if versions["cuda"] is None:
        return Result(NAME, SKIP, f"torch {versions['torch']} is a CPU build: it reports no CUDA, cuDNN or NCCL"
                      + (f" (expected {', '.join(f'{k} {v}' for k, v in thresholds.items())})" if thresholds else ""),
                      versions, thresholds, seconds)
    wrong = [f"{key} {versions[key] or 'none'} where the stack promised {want}"
             for key, want in thresholds.items() if not version_matches(want, versions[key])]
    if wrong:
        return Result(NAME, FAIL, f"torch {versions['torch']} reports " + "; ".join(wrong), versions, thresholds,
                      seconds)
    if not thresholds:
        return Result(NAME, SKIP, f"torch {versions['torch']}: CUDA {versions['cuda']}, cuDNN {versions['cudnn']}, "
                                  f"NCCL {versions['nccl']}; the config names no expected version", versions,
                      thresholds, seconds)
    return Result(NAME, PASS, f"torch {versions['torch']}: " + ", ".join(f"{k} {versions[k]}" for k in thresholds)
                  + " as the stack promised", versions, thresholds, seconds)
