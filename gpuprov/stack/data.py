"""Loading the compatibility tables under `gpuprov/data/` (cached), and version helpers shared by all users."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
OS_KEYS = ("ubuntu-22.04", "ubuntu-24.04", "debian-12", "rhel-9", "rocky-9")
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def table(name: str) -> dict:
    """One data file, e.g. `table("cuda")` for `gpuprov/data/cuda.yaml`, parsed once per process."""
    with open(DATA_DIR / f"{name}.yaml", encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_Loader)


def vkey(version: str) -> tuple[int, ...]:
    """A dotted version as a comparable tuple: "570.124.06" -> (570, 124, 6)."""
    return tuple(int(part) for part in str(version).split("."))


def at_least(version: str, minimum: str) -> bool:
    """`version >= minimum`, comparing dotted versions numerically ("570.26" < "570.124.06")."""
    return vkey(version) >= vkey(minimum)


def branch_of(driver_version: str) -> str:
    """The branch of a driver version: "570.148.08" -> "570"."""
    return str(driver_version).split(".")[0]


def minor_of(version: str) -> str:
    """"12.8.1" -> "12.8"."""
    return ".".join(str(version).split(".")[:2])


def cuda_of_wheel(variant: str) -> str:
    """A wheel variant's CUDA release: "cu128" -> "12.8", "cu118" -> "11.8"."""
    digits = variant.removeprefix("cu")
    return f"{digits[:-1]}.{digits[-1]}"


def cuda_updates(minor: str) -> dict[str, str]:
    """{"12.8.0": "570.26", "12.8.1": "570.124.06"} for "12.8"; empty for an unknown release."""
    release = table("cuda")["releases"].get(minor)
    return dict(release["updates"]) if release else {}


def cuda_min_driver(cuda_version: str) -> str | None:
    """The Table 3 driver of a CUDA version ("12.8" means its newest update)."""
    updates = cuda_updates(minor_of(cuda_version))
    if not updates:
        return None
    if cuda_version.count(".") >= 2:
        return updates.get(cuda_version)
    return updates[max(updates, key=vkey)]


def arch_in_cuda(arch: str, cuda_version: str) -> bool:
    """Whether a CUDA release still (or already) supports an architecture (ARCH-MATRIX)."""
    span = table("cuda")["architectures"][arch]
    minor = vkey(minor_of(cuda_version))
    return vkey(span["first"]) <= minor and ("last" not in span or minor <= vkey(span["last"]))


def render(templates: list[dict], **values) -> list[dict]:
    """Fill package templates ({"name": "cuda-toolkit-{cuda_dash}", ...}) with values."""
    return [{"name": t["name"].format(**values), "version": t["version"].format(**values)} for t in templates]
