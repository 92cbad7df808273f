"""What one image is: one entry of a spec's matrix (or the spec itself when it has none), checked and complete."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

BASE_KINDS = ("ngc", "cuda", "local")
PURPOSES = ("train", "infer")


@dataclass(frozen=True)
class Base:
    """The image's FROM: `image` (repository:tag) pinned by `digest` when the spec gives one."""

    kind: str                       # ngc | cuda | local
    image: str                      # nvcr.io/nvidia/pytorch:25.01-py3, nvidia/cuda:12.8.1-base-ubuntu24.04
    digest: str | None = None       # sha256:<64 hex>
    tools: str | None = None        # cuda bases: the devel image the tools stage builds in (nvidia/cuda:...-devel-...)
    ubuntu: str | None = None       # cuda bases: the Ubuntu release of both ("24.04")
    python: str | None = None       # local bases: the Python the image has ("3.11")
    glibc: str | None = None        # local bases: its C library ("2.36"), for the wheels

    @property
    def reference(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


@dataclass(frozen=True)
class Versions:
    """The stack inside the image, as torch reports it after a build (None: the image has none, or gpuprov's data
    does not record it)."""

    pytorch: str                    # torch.__version__: "2.8.0+cu128", "2.13.0+cpu", "2.6.0a0+ecf3bae40a"
    wheel: str                      # "cu128" | "cpu": the wheel variant (NGC: its CUDA written the same way)
    cuda: str | None = None         # "12.8.1" (torch.version.cuda says "12.8")
    cudnn: str | None = None        # "9" (a cuda base: the major) or the NGC data's full version
    nccl: str | None = None         # "2.27.3"
    min_driver: str | None = None   # the lowest driver the image runs on: NGC's CUDA natively, a CUDA wheel's
                                    # major through minor-version compatibility (cu12x: 525.60.13)

    @property
    def public_pytorch(self) -> str:
        """The PyTorch release without its local part: "2.8.0+cu128" -> "2.8.0"."""
        return self.pytorch.split("+")[0]


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]
    interval: str = "30s"
    timeout: str = "30s"
    start_period: str = "0s"
    retries: int = 3


@dataclass(frozen=True)
class Image:
    """One image to render and build: `id` names its folder build/images/<id>/."""

    id: str
    name: str
    file: Path
    purpose: str
    base: Base
    versions: Versions
    user: User
    gpus: tuple[str, ...] = ()
    description: str | None = None
    apt: tuple[tuple[str, str], ...] = ()
    pip: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    ports: tuple[int, ...] = ()
    healthcheck: Healthcheck | None = None
    command: tuple[str, ...] | None = None
    ca_file: Path | None = None
    matrix: dict = field(default_factory=dict)   # the matrix entry's values ({} without a matrix)

    @property
    def version_tag(self) -> str:
        """`<pytorch>-<cuXY|cpu>-<purpose>`, the tag of the image in its repository."""
        return f"{self.versions.public_pytorch}-{self.versions.wheel}-{self.purpose}"
