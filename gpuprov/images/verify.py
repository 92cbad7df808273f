"""Read back what a built image holds and compare it with its spec, as PyTorch's own image builds check.

The versions are torch's own view inside a container of the image (gpuprov.smoke.software.torch_versions: torch,
`torch.version.cuda`, cuDNN and NCCL as torch loads them); the labels are the engine's inspection of the image.
An expected version is compared on the components both give (`2.7` matches torch 2.7.1+cu128, the release notes'
cuDNN 9.1.0.70 torch's 9.1.0); an expected None means the image must report none (a CPU build of torch has no CUDA,
cuDNN or NCCL).

Reading the versions starts a container (seconds: torch is imported). What it read is recorded with the image's
ID and the probe it ran (build/images/<id>.versions.json): a rebuild that ends with the same ID (the same content)
reuses it instead of starting another container, and says so. The comparison with the spec is made every time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.errors import GpuprovError
from gpuprov.images.container import run_in_image
from gpuprov.validation import LAYOUT

VERSION_KEYS = ("torch", "cuda", "cudnn", "nccl")
# the image's own copy of the suite (the smoke block puts it at /opt/gpuprov/smoke)
PROBE = (f"import json, sys; sys.path.insert(0, {LAYOUT.root!r}); from smoke.software import torch_versions; "
         "print(json.dumps(torch_versions()))")


@dataclass
class Verification:
    """What the image holds, and each way it differs from its spec."""

    image: str
    versions: dict
    labels: dict
    problems: list[str] = field(default_factory=list)
    image_id: str | None = None
    reused: bool = False       # the versions were read from this image ID by an earlier verification

    def to_dict(self) -> dict:
        return {"image": self.image, "image_id": self.image_id, "versions": self.versions,
                "versions_read": "recorded for this image ID" if self.reused else "in a container",
                "labels": self.labels, "problems": self.problems}


def expected_versions(versions) -> dict[str, str | None]:
    """What torch must report in an image of these `Versions` (gpuprov.images.model): torch's own version; for a
    CPU build no CUDA, cuDNN or NCCL; otherwise the CUDA release (torch reports major.minor) and the cuDNN and
    NCCL that gpuprov's data records (one it does not record is not judged)."""
    from gpuprov.stack.data import minor_of

    if versions.wheel == "cpu":
        return {"torch": versions.pytorch, "cuda": None, "cudnn": None, "nccl": None}
    found = {"cuda": minor_of(versions.cuda) if versions.cuda else None, "cudnn": versions.cudnn,
             "nccl": versions.nccl}
    return {"torch": versions.pytorch, **{key: value for key, value in found.items() if value}}


def image_versions(client, image: str, run_as: str | None = None) -> dict:
    """torch, CUDA, cuDNN and NCCL as torch reports them inside a container of `image` (of `run_as`, its ID,
    where given)."""
    ran = run_in_image(client, run_as or image, ["python3", "-c", PROBE], timeout=300, step="verify image")
    try:
        versions = json.loads(ran.stdout.strip().splitlines()[-1]) if ran.rc == 0 and ran.stdout.strip() else None
    except ValueError:
        versions = None
    if not isinstance(versions, dict):
        raise GpuprovError(f"torch's versions could not be read inside {image} (exit {ran.rc})", step="verify image",
                           command=f"python3 -c {PROBE!r}", output=(ran.stderr + "\n" + ran.stdout).strip(),
                           hint="the image must have python3 with torch importable")
    return versions


def version_problems(expected: dict[str, str | None], found: dict) -> list[str]:
    """Each expected version (torch, cuda, cudnn, nccl) the image does not report."""
    from gpuprov.smoke.core import version_matches

    problems = []
    for key in VERSION_KEYS:
        if key not in expected:
            continue
        want, have = expected[key], found.get(key)
        if want is None and have is not None:
            problems.append(f"{key}: the spec has none, the image reports {have}")
        elif want is not None and not version_matches(want, have):
            problems.append(f"{key}: the spec has {want}, the image reports {have or 'none'}")
    return problems


def label_problems(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """Each expected label the image lacks or holds with another value."""
    return [f"label {key}: the spec has {value!r}, the image "
            + (f"has {found[key]!r}" if key in found else "lacks it")
            for key, value in expected.items() if found.get(key) != value]


def verify_image(client, image: str, expected_versions: dict[str, str | None], expected_labels: dict[str, str],
                 record: Path | None = None) -> Verification:
    """The image's versions and labels read back, and every difference from the spec's. With `record`, versions
    recorded there for the image's ID are reused, and versions read in a container are recorded."""
    found = client.api.inspect_image(image)
    image_id = found["Id"]
    labels = found.get("Config", {}).get("Labels") or {}
    versions = recorded_versions(record, image_id) if record else None
    reused = versions is not None
    if versions is None:
        versions = image_versions(client, image, run_as=image_id)
        if record:
            record_versions(record, image_id, versions)
    problems = version_problems(expected_versions, versions) + label_problems(expected_labels, labels)
    return Verification(image, versions, labels, problems, image_id=image_id, reused=reused)


def versions_record(name: str, output: Path | None = None) -> Path:
    """Where the versions read inside the built image of the matrix entry `name` are recorded: beside its rendered
    context (in build/images unless `output` says otherwise)."""
    from gpuprov.images import OUTPUT

    return Path(output or OUTPUT) / f"{name}.versions.json"


def recorded_versions(record: Path, image_id: str) -> dict | None:
    """The versions `record` holds for `image_id`; None when it holds none for it (or cannot be read: they are
    read again)."""
    try:
        held = json.loads(Path(record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(held, dict) or [held.get("image_id"), held.get("probe")] != [image_id, PROBE] \
            or not isinstance(held.get("versions"), dict):
        return None
    return held["versions"]


def record_versions(record: Path, image_id: str, versions: dict) -> None:
    """Record the versions read inside `image_id` (written beside, then renamed: a reader never sees half)."""
    record = Path(record)
    work = record.with_name(f".{record.name}.tmp-{os.getpid()}")
    work.write_text(json.dumps({"image_id": image_id, "probe": PROBE, "versions": versions}, indent=2,
                               sort_keys=True) + "\n", encoding="utf-8")
    work.replace(record)
