"""Render an image into build/images/<id>/, its build context: the Dockerfile, a copy of the smoke suite and its
entry point, the extra CA certificate when the spec names one, and for a local base the wheels of the
controller's wheelhouse (torch, numpy, onnx, onnxruntime and pip, downloaded once into build/wheelhouse by the
controller's pip, as `invoke validate` does for hosts), hard-linked where the file system allows.

A context is written beside the old one and then put in its place, so a failed render leaves the last good one.
build/images/<id>.json records what a build needs: the context hash, the image labels, the expected versions.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuprov import images as paths
from gpuprov.errors import InputError, literal
from gpuprov.images.blocks import ContextFiles, render_dockerfile
from gpuprov.images.labels import context_hash, image_labels
from gpuprov.images.model import Image
from gpuprov.inventory.checks import output_file_problem
from gpuprov.json_text import dump_json

SMOKE_SOURCE = paths.PROJECT / "gpuprov" / "smoke"
ENTRY_SCRIPT = "files/gpuprov-smoke"
CA_NAME = "extra-ca.crt"
WHEELS = "wheels"


@dataclass(frozen=True)
class Rendered:
    """A rendered image: its context folder, Dockerfile text and content hash."""

    image: Image
    folder: Path
    dockerfile: str
    context_hash: str

    @property
    def labels(self) -> dict[str, str]:
        return image_labels(self.image)

    def to_dict(self) -> dict:
        return {"id": self.image.id, "name": self.image.name, "spec": str(self.image.file),
                "context": str(self.folder), "context_hash": self.context_hash, "version_tag": self.image.version_tag,
                "base": self.image.base.reference, "labels": self.labels,
                "versions": dataclasses.asdict(self.image.versions)}


def render(image: Image, output: Path | None = None, templates: Path | None = None, wheelhouse: Path | None = None,
           say: Callable[[str], None] = lambda what: None) -> Rendered:
    """Write the image's context to output/<id>/ and its record to output/<id>.json (by default the folders named
    in gpuprov.images: build/images, templates, build/wheelhouse)."""
    output = Path(output or paths.OUTPUT)
    templates = Path(templates or paths.TEMPLATES)
    wheelhouse = Path(wheelhouse or paths.WHEELHOUSE)
    problem = output_file_problem(output / f"{image.id}.json")
    if problem:  # checked before anything is written: a file where a folder goes, or a folder where a file does
        raise InputError(f"the images build folder: {literal(problem)}", step="images.render",
                         hint=f"move what is in the way under {literal(str(output))}")
    output.mkdir(parents=True, exist_ok=True)
    folder = output / image.id
    work = output / f".{image.id}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        files = _context_files(image, work, templates, wheelhouse, say)
        dockerfile = render_dockerfile(image, files, templates)
        (work / "Dockerfile").write_text(dockerfile, encoding="utf-8")
        digest = context_hash(work)
        old = output / f".{image.id}.old-{os.getpid()}"
        if folder.exists():
            folder.rename(old)
        work.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rendered = Rendered(image, folder, dockerfile, digest)
    (output / f"{image.id}.json").write_text(dump_json(rendered.to_dict()) + "\n", encoding="utf-8")
    return rendered


def _context_files(image: Image, work: Path, templates: Path, wheelhouse: Path,
                   say: Callable[[str], None]) -> ContextFiles:
    smoke = work / "smoke"
    smoke.mkdir()
    for source in sorted(SMOKE_SOURCE.glob("*.py")):
        shutil.copyfile(source, smoke / source.name)
    shutil.copyfile(templates / ENTRY_SCRIPT, work / "gpuprov-smoke")
    (work / "gpuprov-smoke").chmod(0o755)
    files = ContextFiles()
    if image.ca_file:
        shutil.copyfile(image.ca_file, work / CA_NAME)
        files = dataclasses.replace(files, ca_file=CA_NAME)
    if image.base.kind == "local":
        files = dataclasses.replace(files, **_wheels(image, work / WHEELS, wheelhouse, say))
    return files


def _wheels(image: Image, target: Path, root: Path, say: Callable[[str], None]) -> dict:
    """The controller's wheelhouse for the image's Python, linked into the context, and the requirements pinned to
    the versions of its wheels."""
    from gpuprov.validation.env import WheelRequest, wheelhouse_for

    request = WheelRequest(python=image.base.python, arch=platform.machine(), glibc=image.base.glibc, wheel="cpu",
                           torch_version=image.versions.public_pytorch, torch_index=None)
    house = wheelhouse_for(request, root, say=say)
    target.mkdir()
    for name in sorted(house.files):
        try:
            os.link(house.folder / name, target / name)
        except OSError:
            shutil.copyfile(house.folder / name, target / name)
    versions = {_normal(name.split("-")[0]): name.split("-")[1] for name in house.files}
    pinned = []
    for requirement in house.requirements:
        package = _normal(re.split(r"[=<>!~ ]", requirement, maxsplit=1)[0])
        pinned.append(f"{package}=={versions[package]}")
    return {"wheels": f"{WHEELS}/", "pip_wheel": house.pip_wheel, "requirements": tuple(pinned)}


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()
