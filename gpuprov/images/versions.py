"""The versions that belong together in an image, from the resolver's data and rules (gpuprov.stack), never
restated here: an NGC tag gives its CUDA, PyTorch and NCCL (gpuprov/data/ngc_pytorch.yaml); a CUDA base gives
the PyTorch wheel variant and the NCCL build the resolver picks for that CUDA (pytorch_wheels.yaml, nccl.yaml);
a pair that does not fit is refused with the resolver's own explanation, for each GPU the image is for.

A problem is raised as Problem(key, message), `key` being the spec key it belongs to ("base.cuda", "pytorch"),
so that the spec reader can name the file, line and key of the value that caused it.
"""

from __future__ import annotations

import re

from gpuprov.core.errors import InputError
from gpuprov.images.model import Versions
from gpuprov.stack.data import OS_KEYS, cuda_of_wheel, cuda_updates, minor_of, table
from gpuprov.stack.inputs import PinError, stack_pin
from gpuprov.stack.resolve import Stack, StackConflict, resolve

NGC_REPOSITORY = "nvcr.io/nvidia/pytorch"
CUDA_REPOSITORY = "nvidia/cuda"
UBUNTUS = tuple(key.removeprefix("ubuntu-") for key in OS_KEYS if key.startswith("ubuntu-"))
CUDNN_TAGS = {"8": "cudnn8", "9": "cudnn"}   # nvidia/cuda tags: 12.1.1-cudnn8-runtime-..., 12.8.1-cudnn-runtime-...
FLAVORS = ("runtime", "devel")
_RELEASE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
_MINOR = re.compile(r"[0-9]+\.[0-9]+")
LOCAL_EXAMPLE = "registry.example/base:1.0"
_IMAGE = re.compile(r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class Problem(Exception):
    """A version that does not fit: `key` is the spec key it belongs to."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key, self.message = key, message


def ngc(tag_text: str, nccl_text: str | None, gpus: tuple[str, ...]) -> tuple[str, Versions]:
    """(the FROM image, the versions) of an NGC PyTorch tag such as "25.01-py3"."""
    tag = _pin("base.ngc", "ngc", tag_text)
    row = table("ngc_pytorch")["tags"][tag]
    if not row["pytorch"]:
        raise Problem("base.ngc", f"gpuprov's data does not record the PyTorch of NGC PyTorch {tag}-py3 "
                                  "(gpuprov/data/ngc_pytorch.yaml): pick another tag, or add it to the data")
    nccl = row["nccl"]
    if nccl_text is not None:
        pinned = _pin("nccl", "nccl", nccl_text)
        if nccl and nccl != pinned:
            raise Problem("nccl", f"NGC PyTorch {tag}-py3 ships NCCL {nccl} (gpuprov/data/ngc_pytorch.yaml), "
                                  f"not {pinned}: remove nccl")
        if pinned.count(".") < 2:
            raise Problem("nccl", f"give the NCCL version NGC PyTorch {tag}-py3 ships, such as 2.25.1 (its release "
                                  "notes list it; gpuprov's data does not)")
        nccl = pinned
    for gpu in gpus:
        _resolved("base.ngc", gpu, f"ubuntu-{row['ubuntu']}", ngc=tag)
    versions = Versions(pytorch=row["pytorch"], wheel=wheel_of(row["cuda"]), cuda=row["cuda"], cudnn=row["cudnn"],
                        nccl=nccl, min_driver=row["min_driver"])
    return f"{NGC_REPOSITORY}:{tag}-py3", versions


def cuda(cuda_text: str, cudnn_text: str, ubuntu: str, flavor: str, pytorch_text: str, nccl_text: str | None,
         gpus: tuple[str, ...]) -> tuple[str, Versions]:
    """(the FROM image, the versions) of NVIDIA's CUDA image with PyTorch from its wheel index."""
    version = _pin("base.cuda", "cuda", cuda_text)
    if version.count(".") == 1:
        raise Problem("base.cuda", f"give the CUDA update, as nvidia/cuda tags name it: {version} has "
                                   f"{', '.join(cuda_updates(version))}")
    if minor_of(version) not in table("cuda")["image_contract"]["require_cuda"]:
        raise Problem("base.cuda", f"gpuprov's data does not record the NVIDIA_REQUIRE_CUDA of nvidia/cuda:{version} "
                                   "images (gpuprov/data/cuda.yaml image_contract): pick another CUDA, or add it "
                                   f"from dist/{version}/ubuntu2404/base/Dockerfile of NVIDIA's container-images/cuda")
    if cudnn_text not in CUDNN_TAGS:
        raise Problem("base.cudnn", f"bad cuDNN major {cudnn_text!r}: give {' or '.join(CUDNN_TAGS)} (nvidia/cuda "
                                    "publishes cuDNN 8 and 9 images)")
    if ubuntu not in UBUNTUS:
        raise Problem("base.ubuntu", f"bad Ubuntu release {ubuntu!r}: give {' or '.join(UBUNTUS)}")
    if flavor not in FLAVORS:
        raise Problem("base.flavor", f"bad flavor {flavor!r}: give {' or '.join(FLAVORS)}")
    release, full = pytorch_release(pytorch_text)
    nccl = _pin("nccl", "nccl", nccl_text) if nccl_text is not None else None
    os_key = f"ubuntu-{ubuntu}"
    stacks: dict[str, Stack] = {}
    for gpu in gpus:
        _resolved("base.cuda", gpu, os_key, cuda=version)
        stacks[gpu] = _resolved("pytorch", gpu, os_key, cuda=version, pytorch=release)
        if nccl:
            stacks[gpu] = _resolved("nccl", gpu, os_key, cuda=version, pytorch=release, nccl=nccl)
    wheels = {gpu: stack.pytorch["wheel"] for gpu, stack in stacks.items()}
    if len(set(wheels.values())) > 1:
        shown = ", ".join(f"{gpu}: {wheel}" for gpu, wheel in wheels.items())
        raise Problem("gpus", f"the GPUs need different PyTorch {release} wheels ({shown}): give each wheel its own "
                              "spec")
    stack = next(iter(stacks.values()))
    wheel = stack.pytorch["wheel"]
    versions = Versions(pytorch=f"{full}+{wheel}", wheel=wheel, cuda=version, cudnn=cudnn_text,
                        nccl=stack.nccl["version"], min_driver=wheel_min_driver(wheel))
    return f"{CUDA_REPOSITORY}:{version}-{CUDNN_TAGS[cudnn_text]}-{flavor}-ubuntu{ubuntu}", versions


def local(image: str, python: str, glibc: str, pytorch_text: str) -> tuple[str, Versions]:
    """(the FROM image, the versions) of a local base (repository:tag, an image on the controller's engine) with
    the CPU wheel of PyTorch from the controller's pip."""
    repository, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    if not _IMAGE.fullmatch(repository) or (tag and not _TAG.fullmatch(tag)):
        raise Problem("base.local", f"bad image name {image!r}: give repository:tag such as {LOCAL_EXAMPLE}")
    if not tag:
        raise Problem("base.local", f"give the tag of {repository} (repository:tag), such as {repository}:1.0")
    for key, value in (("base.python", python), ("base.glibc", glibc)):
        if not _MINOR.fullmatch(value):
            raise Problem(key, f"bad version {value!r}: give major.minor such as "
                               f"{'3.11' if key == 'base.python' else '2.36'}")
    _, full = pytorch_release(pytorch_text)
    return f"{repository}:{tag}", Versions(pytorch=f"{full}+cpu", wheel="cpu")


def pytorch_release(text: str) -> tuple[str, str]:
    """("2.8", "2.8.0") for "2.8.0": the release the resolver's data knows, and the exact version pip installs."""
    if not _RELEASE.fullmatch(text):
        raise Problem("pytorch", f"give the exact PyTorch version pip installs, such as 2.8.0, not {text!r}")
    return _pin("pytorch", "pytorch", minor_of(text)), text


def wheel_of(cuda_version: str) -> str:
    """The wheel-style name of a CUDA release: "12.8.0" -> "cu128"."""
    return "cu" + minor_of(cuda_version).replace(".", "")


def wheel_min_driver(wheel: str) -> str:
    """The lowest driver a PyTorch CUDA wheel runs on: the wheel bundles its CUDA runtime, which runs on any driver
    of its major's minor-version compatibility range (cu12x: 525.60.13; gpuprov/data/cuda.yaml minor_compat)."""
    return table("cuda")["minor_compat"][cuda_of_wheel(wheel).split(".")[0]]


def require_cuda(kind: str, cuda_version: str | None) -> str | None:
    """NVIDIA_REQUIRE_CUDA as the base's own NVIDIA image writes it (gpuprov/data/cuda.yaml and ngc_pytorch.yaml
    image_contract): on nvidia/cuda `cuda>=X.Y` and, for each driver branch NVIDIA lists for X.Y, each brand on
    that branch; on NGC PyTorch its own `cuda>=9.0`; none on an image without CUDA."""
    if kind == "ngc":
        return table("ngc_pytorch")["image_contract"]["require_cuda"]
    if not cuda_version:
        return None
    minor = minor_of(cuda_version)
    contract = table("cuda")["image_contract"]
    row = contract["require_cuda"][minor]
    clauses = [f"cuda>={minor}"]
    for branch in row["branches"]:
        clauses += [f"brand={brand},driver>={branch},driver<{int(branch) + 1}"
                    for brand in contract["brands"][row["brands"]]]
    return " ".join(clauses)


def driver_capabilities() -> str:
    """NVIDIA_DRIVER_CAPABILITIES as NVIDIA's PyTorch container writes it (gpuprov/data/cuda.yaml image_contract)."""
    return table("cuda")["image_contract"]["capabilities"]


def _pin(key: str, kind: str, value: str) -> str:
    try:
        return stack_pin(kind, value)
    except PinError as exc:
        raise Problem(key, str(exc)) from None


def _resolved(key: str, gpu: str, os_key: str, **pins) -> Stack:
    """The resolver's stack for `gpu` with these pins; Problem(key, its explanation) when none fits."""
    try:
        return resolve(gpu, os_key, **pins)
    except StackConflict as exc:
        raise Problem(key, f"{gpu}: {'; '.join(exc.conflicts)}") from None
    except InputError as exc:
        raise Problem(key, f"{gpu}: {exc.message}") from None
