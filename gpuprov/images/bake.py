"""docker-bake.json for buildx users: one target per rendered image (its context, tags and build-time labels) and
a `default` group with all of them. Contexts are relative to the working directory, where `docker buildx bake -f
build/images/docker-bake.json` runs (bake resolves them against the working directory)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from gpuprov.core.errors import InputError
from gpuprov.images.labels import Provenance, build_labels
from gpuprov.images.render import Rendered
from gpuprov.images.tags import image_tags

_TARGET = re.compile(r"[^A-Za-z0-9_-]")


def target_name(image_id: str) -> str:
    """A bake target name (letters, digits, '_' and '-'): "cuda-pytorch-train-2.8.0-cu128" -> "..._2_8_0-cu128"."""
    return _TARGET.sub("_", image_id)


def bake_document(rendered: list[Rendered], registry: str | None, provenance: Provenance,
                  root: Path = Path(".")) -> dict:
    """The bake file's content, in JSON form."""
    targets = {}
    for item in rendered:
        context = Path(item.folder).resolve()
        with contextlib.suppress(ValueError):
            context = context.relative_to(Path(root).resolve())
        name = target_name(item.image.id)
        if name in targets:
            raise InputError(f"images {item.image.id!r} and another give the same bake target {name!r}: rename one",
                             step="images.bake")
        targets[name] = {
            "context": context.as_posix(),
            "dockerfile": "Dockerfile",
            "tags": image_tags(item.image, registry, provenance.revision),
            "labels": build_labels(item.context_hash, provenance),
        }
    return {"group": {"default": {"targets": list(targets)}}, "target": targets}
