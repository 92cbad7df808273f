"""Render an image into build/images/<id>/, its build context: the Dockerfile, a copy of the smoke suite and its
entry point, the extra CA certificate when the spec names one, and for a local base the wheels of the
controller's wheelhouse (torch, numpy, onnx, onnxruntime and pip, downloaded once into build/wheelhouse by the
controller's pip, as `invoke validate` does for hosts), hard-linked where the file system allows.

Only images on a local base (the lab's) install from the wheelhouse; its download (about 250 MB) happens when such
an image is rendered with `download=True` (images.build does), never for the others: without it, an image whose
wheels are not downloaded yet is WheelsNotDownloaded, which names the command that downloads them.

A context is written beside the old one and then put in its place, so a failed render leaves the last good one.
build/images/<id>.json records what a build needs: the context hash, the image labels, the expected versions.
The hash reads every file, except a file whose sha256 build/images/.<id>.digests.json records for its device,
inode, size and modification time (as git's index does for a work tree): the wheels, hard-linked from the
wheelhouse into every render, are read once, not at every render.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuprov import images as paths
from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.core.json_text import dump_json
from gpuprov.images.blocks import ContextFiles, render_dockerfile
from gpuprov.images.labels import context_hash, image_labels
from gpuprov.images.model import Image
from gpuprov.inventory.checks import output_file_problem

SMOKE_SOURCE = paths.PACKAGE.parent / "smoke"
ENTRY_SCRIPT = "files/gpuprov-smoke"
CA_NAME = "extra-ca.crt"
WHEELS = "wheels"
RACY_SECONDS = 2     # a file changed this recently may change again within its mtime's tick: always read


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


class WheelsNotDownloaded(GpuprovError):
    """The image installs from a wheelhouse that is not downloaded, and the render was not to download it."""


def render(image: Image, output: Path | None = None, templates: Path | None = None, wheelhouse: Path | None = None,
           say: Callable[[str], None] = lambda what: None, download: bool = True) -> Rendered:
    """Write the image's context to output/<id>/ and its record to output/<id>.json (by default the folders named in
    gpuprov.images: build/images, the user's templates or the shipped ones, build/wheelhouse). An image on a local base
    downloads its wheels when they are not there yet, unless `download` is False (WheelsNotDownloaded, before anything
    is written)."""
    output = Path(output or paths.OUTPUT)
    templates = Path(templates or paths.templates_folder())
    wheelhouse = Path(wheelhouse or paths.WHEELHOUSE)
    problem = output_file_problem(output / f"{image.id}.json")
    if problem:  # checked before anything is written: a file where a folder goes, or a folder where a file does
        raise InputError(f"the images build folder: {literal(problem)}", step="images.render",
                         hint=f"move what is in the way under {literal(str(output))}")
    house = _wheelhouse(image, wheelhouse, say, download) if image.base.kind == "local" else None
    output.mkdir(parents=True, exist_ok=True)
    folder = output / image.id
    work = output / f".{image.id}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        files = _context_files(image, work, templates, house)
        dockerfile = render_dockerfile(image, files, templates)
        (work / "Dockerfile").write_text(dockerfile, encoding="utf-8")
        digests = FileDigests(output / f".{image.id}.digests.json", work)
        digest = context_hash(work, digests)
        digests.save()
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


def _context_files(image: Image, work: Path, templates: Path, house) -> ContextFiles:
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
    if house is not None:
        files = dataclasses.replace(files, **_wheels(house, work / WHEELS))
    return files


def _wheelhouse(image: Image, root: Path, say: Callable[[str], None], download: bool):
    """The controller's wheelhouse for the image's Python (gpuprov.validation.env.Wheelhouse): downloaded when it
    is not there yet, or WheelsNotDownloaded when `download` is False."""
    from gpuprov.validation.env import WheelRequest, load_wheelhouse, wheelhouse_for

    request = WheelRequest(python=image.base.python, arch=platform.machine(), glibc=image.base.glibc, wheel="cpu",
                           torch_version=image.versions.public_pytorch, torch_index=None)
    if download:
        return wheelhouse_for(request, root, say=say)
    found = load_wheelhouse(Path(root) / request.key())
    if found is None:
        raise WheelsNotDownloaded(
            f"{image.id} installs from the wheelhouse {request.key()}, which is not downloaded yet (about 250 MB)",
            step="images.render", hint=f"`invoke images.build --name {image.id}` downloads it when it builds the "
                                       f"image; `invoke images.render --wheels --name {image.id}` renders it now")
    return found


def _wheels(house, target: Path) -> dict:
    """The wheelhouse linked into the context, and the requirements pinned to the versions of its wheels."""
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


class FileDigests:
    """sha256 of a context's files for context_hash, remembered in `store` by each file's path in `root`, device,
    inode, size and modification time: a file with the same five is not read again. A file modified less than
    RACY_SECONDS before it is read is not remembered (a second change in the same tick of its clock would keep
    its mtime). The store holds the files of the last render only; one that cannot be read is empty, one that
    cannot be written is left as it was (the hash is the same either way): a cache, never a source of truth."""

    def __init__(self, store: Path, root: Path):
        self.store, self.root = store, root
        self.known = self._load()
        self.seen: dict[str, list] = {}

    def __call__(self, path: Path) -> bytes:
        stat = path.stat()
        key = [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns]
        name = path.relative_to(self.root).as_posix()
        entry = self.known.get(name)
        if entry is not None and entry[:4] == key:
            digest = bytes.fromhex(entry[4])
        else:
            started = time.time_ns()
            with open(path, "rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").digest()
            if stat.st_mtime_ns > started - RACY_SECONDS * 10**9 or path.stat().st_mtime_ns != stat.st_mtime_ns:
                return digest
        self.seen[name] = [*key, digest.hex()]
        return digest

    def _load(self) -> dict:
        try:
            held = json.loads(self.store.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {name: entry for name, entry in held.items() if _digest_entry(entry)} if isinstance(held, dict) else {}

    def save(self) -> None:
        """Remember the digests of this render's files (and only those: no store when none is to be remembered)."""
        work = self.store.with_name(f"{self.store.name}.tmp-{os.getpid()}")
        with contextlib.suppress(OSError):
            if not self.seen:
                self.store.unlink(missing_ok=True)
                return
            try:
                work.write_text(json.dumps(self.seen, sort_keys=True), encoding="utf-8")
                work.replace(self.store)
            finally:
                work.unlink(missing_ok=True)


def _digest_entry(entry) -> bool:
    """[device, inode, size, mtime_ns, sha256 in hex], as FileDigests stores it."""
    return (isinstance(entry, list) and len(entry) == 5 and all(type(n) is int for n in entry[:4])
            and isinstance(entry[4], str) and re.fullmatch(r"[0-9a-f]{64}", entry[4]) is not None)
