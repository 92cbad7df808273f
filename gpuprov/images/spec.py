"""Image specs, `images/*.yaml`, read with the inventory's located YAML reader: each spec is checked and
expanded over its matrix into Images. Every problem is `FILE:LINE:COL: key: message` (an unknown key with a
did-you-mean, a bad or unpinned version, a pair the resolver refuses with its explanation), and all of them are
raised together as one SpecError (exit 2). The keys:

    name: cuda-pytorch-train          the repository name (lower case; build/images/<name>[-<version>]/)
    purpose: train | infer
    description: text                 optional, the image's description label
    gpus: [H100-SXM, L40S]            the GPU models it is for (ngc and cuda bases): the resolver checks each
    base:                             one of
      ngc: 25.01-py3                    NVIDIA's NGC PyTorch container (it gives CUDA, PyTorch and NCCL)
      cuda: 12.8.1, cudnn: "9", ubuntu: "24.04", flavor: runtime | devel   nvidia/cuda, PyTorch from its index:
                                      runtime starts from nvidia/cuda:X-base-ubuntuR, devel from X-devel-ubuntuR;
                                      CUDA's libraries and cuDNN (`cudnn`: its major) come from PyTorch's
                                      nvidia-*-cu12 wheels, never twice; nccl-tests and nvbandwidth are built in a
                                      nvidia/cuda:X-devel-ubuntuR stage and copied in (gpuprov/data/cuda.yaml)
      local: REPO:TAG, python: "3.11", glibc: "2.36"  an image on the engine, with the CPU wheel (the lab)
      digest: sha256:...              optional: the base pinned by digest
    pytorch: 2.8.0                    cuda and local bases
    nccl: 2.27.3                      optional: the NCCL build (cuda bases) or the NGC tag's (when the data lacks it)
    apt: {package: version}           pinned, a family together (python3 with python3-minimal and libpython3-stdlib:
                                      fields.EXACT_DEPENDS); a cuda base needs python3 and python3-venv
    pip: {package: version}           pinned (ngc and cuda bases)
    user: {name: gpuprov, uid: 1000, gid: 1000}   the non-root user jobs run as
    env: {NCCL_DEBUG: WARN}           the settings that matter on multi-GPU hosts
    ports: [8000]                     inference images
    healthcheck: {test: [...], interval: 30s, timeout: 10s, start_period: 30s, retries: 3}   inference images
    command: [argv...]                optional: the image's CMD
    ca_file: certs/corp-ca.pem        optional: an extra CA certificate, relative to the spec's folder
    matrix: ...                       see gpuprov.images.matrix
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprov import images as paths
from gpuprov.core.errors import InputError, literal
from gpuprov.images import fields
from gpuprov.images.matrix import Entry, expand
from gpuprov.images.model import BASE_KINDS, Base, Image
from gpuprov.images.versions import CUDA_REPOSITORY, Problem, cuda, local, ngc
from gpuprov.inventory.checks import NotRegular, read_regular
from gpuprov.inventory.diagnostics import FILE_KEY, problem_line, show, type_name
from gpuprov.inventory.levels import INVALID, known_keys
from gpuprov.inventory.located import Located, YamlTextError, compose, decode

TOP_KEYS = ("name", "purpose", "description", "gpus", "base", "pytorch", "nccl", "apt", "pip", "user", "env",
            "ports", "healthcheck", "command", "ca_file", "matrix")
REQUIRED = ("name", "purpose", "user")
BASE_KEYS = {"ngc": ("ngc", "digest"), "cuda": ("cuda", "cudnn", "ubuntu", "flavor", "digest"),
             "local": ("local", "python", "glibc", "digest")}
ALL_BASE_KEYS = tuple(dict.fromkeys(key for keys in BASE_KEYS.values() for key in keys))
CUDA_BASE_PYTHON = ("python3", "python3-venv")
CUDA_FLAVOR_TAGS = {"runtime": "base", "devel": "devel"}   # the nvidia/cuda image each flavor starts from
ARTICLE = {"ngc": "an NGC", "cuda": "a CUDA", "local": "a local"}
MAX_BYTES = 1024 * 1024
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,120}\.yaml")
STATIC = {"name": fields.name, "purpose": fields.purpose, "description": fields.description, "gpus": fields.gpus,
          "apt": fields.apt, "pip": fields.pip, "user": fields.user, "env": fields.env, "ports": fields.ports,
          "healthcheck": fields.healthcheck, "command": fields.command}


class SpecError(InputError):
    """Image specs that cannot be used; `.errors` holds every problem as `FILE:LINE:COL: key: message`."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        super().__init__(f"image specs: {count}:\n  " + "\n  ".join(self.errors), step="images",
                         hint="fix the spec, then run: invoke images.list")


def load_specs(folder: Path | None = None) -> list[Image]:
    """Every image of every spec in `folder` (default: the user's ./images/, else the shipped specs:
    gpuprov.images.specs_folder; *.yaml, by name); SpecError with the problems of all of them."""
    folder = Path(folder or paths.specs_folder())
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise InputError(f"no image specs (*.yaml) in {literal(str(folder))}", step="images",
                         hint="add a spec: gpuprov/images/spec.py describes the keys")
    images, errors = [], []
    for path in files:
        try:
            images.extend(load_spec(path))
        except SpecError as exc:
            errors.extend(exc.errors)
    seen: dict[str, Image] = {}
    for image in images:
        first = seen.setdefault(image.id, image)
        if first is not image:
            errors.append(problem_line(image.file, 1, 1, "name", f"image {image.id!r} is also made by {first.file}: "
                                                                 "give each spec its own name"))
    if errors:
        raise SpecError(errors)
    return images


def load_spec(path: Path) -> list[Image]:
    """The images of one spec file; InputError when it cannot be read, SpecError when it is bad (its name
    included: the spec's path is written into the rendered Dockerfile, so it is a plain file name)."""
    path = Path(path)
    if not FILE_NAME.fullmatch(path.name):
        raise SpecError([problem_line(path, 1, 1, FILE_KEY, f"bad spec file name {show(path.name)}: letters, "
                                                            "digits, '_', '.' and '-', ending in .yaml")])
    try:
        data = read_regular(path, MAX_BYTES)
    except NotRegular as exc:
        raise SpecError([problem_line(path, 1, 1, FILE_KEY, f"the file {exc.reason}")]) from None
    except OSError as exc:
        raise InputError(f"cannot read image spec {literal(str(path))}: {exc.strerror}", step="images") from None
    return read_spec(path, data)


def read_spec(path: Path, data: bytes) -> list[Image]:
    """The images of the spec in `data` (the bytes of `path`); SpecError with every problem found."""
    try:
        text = decode(data)
        doc = Located(path, aliases="*" in text)
        root = compose(text)
    except YamlTextError as exc:
        raise SpecError([problem_line(path, exc.line, exc.col, FILE_KEY, exc.message)]) from None
    document = doc.construct(root) if root is not None else None
    if not isinstance(document, dict):
        what = "the file is empty" if root is None else f"the top level is {type_name(document)}"
        doc.file_error(1, 1, f"{what}: a spec is a mapping with name:, purpose:, base:, user: ...")
        raise SpecError(doc.problems())
    images = _images(doc, document, path.parent)
    if doc.errors:
        raise SpecError(doc.problems())
    return images


def _images(doc: Located, data: dict, folder: Path) -> list[Image]:
    known_keys(doc, data, (), TOP_KEYS, "spec")
    for key in REQUIRED:
        if key not in data:
            doc.error((), f"the spec needs {key}:")
    static = {key: check(doc, data[key], (key,)) for key, check in STATIC.items() if key in data}
    if "ca_file" in data:
        static["ca_file"] = fields.ca_file(doc, data["ca_file"], ("ca_file",), folder)
    if static.get("purpose") == "infer":
        for key in ("ports", "healthcheck"):
            if key not in data:
                doc.error((), f"an inference image needs {key}: (what its server listens on and how Docker knows "
                              "it is healthy)")
    if "base" in data and not isinstance(data["base"], dict):
        doc.error(("base",), f"base must be a mapping such as {{cuda: 12.8.1, ...}}, not {type_name(data['base'])}")
    elif isinstance(data.get("base"), dict):
        known_keys(doc, data["base"], ("base",), ALL_BASE_KEYS, "base")
    entries = expand(doc, data["matrix"], ("matrix",)) if "matrix" in data else [{}]
    images: list[Image] = []
    for entry in entries:
        image = _entry(doc, data, static, entry)
        if image is None:
            continue
        twin = next((other for other in images if other.id == image.id), None)
        if twin is not None:
            doc.error(("matrix",), f"matrix entries {_shown(twin.matrix)} and {_shown(image.matrix)} make the same "
                                   f"image ({image.id}, tag {image.version_tag}): vary what its tag names")
            continue
        images.append(image)
    return images


def _entry(doc: Located, data: dict, static: dict, entry: Entry) -> Image | None:
    """One image of the spec: its plain fields and the versions of its base, with this matrix entry applied."""
    base = dict(data["base"]) if isinstance(data.get("base"), dict) else {}
    where = {key: ("base", key) for key in base}
    for key, (value, path) in entry.items():
        if key.startswith("base."):
            base[key.removeprefix("base.")], where[key.removeprefix("base.")] = value, path

    def place(key: str) -> tuple:
        if key in entry:
            return entry[key][1]
        return where.get(key.removeprefix("base."), ("base",)) if key.startswith("base.") else (key,)

    def value(key: str) -> Any:
        return entry[key][0] if key in entry else data.get(key)

    def fail(key: str, message: str) -> None:
        doc.error(place(key), f"matrix entry {_shown(_values(entry, doc))}: {message}" if entry else message)

    kind = _kind(doc, base, place, fail)
    if kind is None or INVALID in static.values() or any(key not in data for key in REQUIRED):
        return None
    texts = {}
    for key in BASE_KEYS[kind]:
        if key in base:
            texts[key] = fields.text(doc, base[key], place(f"base.{key}"), f"base.{key}", '"12.8.1"')
    for key in ("pytorch", "nccl"):
        if key in data or key in entry:
            texts[key] = fields.text(doc, value(key), place(key), key, '"2.8.0"')
    if INVALID in texts.values():
        return None
    digest = fields.digest(doc, base["digest"], place("base.digest")) if "digest" in base else None
    if digest is INVALID or not _fits_kind(kind, static, texts, data, fail):
        return None
    tools = None
    try:
        if kind == "ngc":
            image, versions = ngc(texts["ngc"], texts.get("nccl"), static["gpus"])
        elif kind == "cuda":
            flavor = texts.get("flavor", "runtime")
            _, versions = cuda(texts["cuda"], texts["cudnn"], texts["ubuntu"], flavor, texts["pytorch"],
                               texts.get("nccl"), static["gpus"])
            image, tools = (cuda_image(texts["cuda"], CUDA_FLAVOR_TAGS[flavor], texts["ubuntu"]),
                            cuda_image(texts["cuda"], "devel", texts["ubuntu"]))
        else:
            image, versions = local(texts["local"], texts["python"], texts["glibc"], texts["pytorch"])
    except Problem as problem:
        fail(problem.key, problem.message)
        return None
    name = static["name"]
    return Image(
        id=f"{name}-{versions.public_pytorch}-{versions.wheel}" if entry else name, name=name, file=doc.file,
        purpose=static["purpose"], versions=versions, user=static["user"], gpus=static.get("gpus", ()),
        base=Base(kind, image, digest, tools=tools, ubuntu=texts.get("ubuntu") if tools else None,
                  python=texts.get("python"), glibc=texts.get("glibc")),
        description=static.get("description"), apt=static.get("apt", ()), pip=static.get("pip", ()),
        env=static.get("env", ()), ports=static.get("ports", ()), healthcheck=static.get("healthcheck"),
        command=static.get("command"), ca_file=static.get("ca_file"), matrix=_values(entry, doc))


def cuda_image(version: str, flavor_tag: str, ubuntu: str) -> str:
    """NVIDIA's image of a CUDA release without cuDNN: "12.8.1", "base", "24.04" -> nvidia/cuda:12.8.1-base-ubuntu24.04
    (PyTorch's wheels bring cuDNN and CUDA's libraries; a -cudnn-runtime- base would ship them twice)."""
    return f"{CUDA_REPOSITORY}:{version}-{flavor_tag}-ubuntu{ubuntu}"


def _kind(doc: Located, base: dict, place: Callable[[str], tuple], fail: Callable[[str, str], None]) -> str | None:
    """The base's kind (exactly one of ngc, cuda, local), its keys checked against it."""
    kinds = [kind for kind in BASE_KINDS if kind in base]
    if len(kinds) != 1:
        fail("base", "base needs one of ngc: TAG, cuda: VERSION or local: IMAGE" if not kinds else
             f"base gives {' and '.join(kinds)}: give one of them")
        return None
    kind = kinds[0]
    for key in base:
        if key in ALL_BASE_KEYS and key not in BASE_KEYS[kind]:
            owner = next(k for k, keys in BASE_KEYS.items() if key in keys)
            doc.error(place(f"base.{key}"), f"{key} belongs to {ARTICLE[owner]} base, not to {ARTICLE[kind]} base "
                                            f"({ARTICLE[kind]} base takes {', '.join(BASE_KEYS[kind])})", at_key=True)
            return None
    return kind


def _fits_kind(kind: str, static: dict, texts: dict, data: dict, fail: Callable[[str, str], None]) -> bool:
    """What each kind of base needs and refuses, beyond its own keys."""
    needs = {"ngc": ("gpus",), "cuda": ("gpus", "pytorch", "base.cudnn", "base.ubuntu"),
             "local": ("pytorch", "base.python", "base.glibc")}[kind]
    refused = {"ngc": {"pytorch": "an NGC base brings its own PyTorch: remove pytorch"},
               "cuda": {},
               "local": {"gpus": "a local base makes a CPU image (the CPU wheel): remove gpus",
                         "nccl": "a local base makes a CPU image, which has no NCCL: remove nccl",
                         "pip": "a local base installs only the controller's wheelhouse (torch, numpy, onnx, "
                                "onnxruntime), it has no package index: remove pip, or use a cuda or ngc base"}}[kind]
    ok = True
    for key in needs:
        present = key in static if key == "gpus" else key.removeprefix("base.") in texts
        if not present:
            fail("base", f"{ARTICLE[kind]} base needs {key}")
            ok = False
    for key, message in refused.items():
        if key in texts or key in data:
            fail(key, message)
            ok = False
    if kind == "cuda" and static.get("apt", ()) is not INVALID:
        missing = [pkg for pkg in CUDA_BASE_PYTHON if pkg not in dict(static.get("apt", ()))]
        if missing:
            fail("apt" if "apt" in data else "base", f"a CUDA base has no Python: add {' and '.join(missing)} to apt, "
                                                     "pinned (PyTorch is installed into a venv)")
            ok = False
    return ok


def _values(entry: Entry, doc: Located) -> dict[str, str]:
    """A matrix entry's values as text (numbers as written)."""
    return {key: doc.raw.get(path, str(value)) for key, (value, path) in entry.items()}


def _shown(values: dict[str, str]) -> str:
    return ", ".join(f"{key}={show(value)}" for key, value in values.items()) or "(the spec's own values)"

