"""Image tags: `<registry>/<name>:<pytorch>-<cuXY|cpu>-<purpose>`, plus the same with the git revision appended
(`...-train-1a2b3c4d5e6f`, `-dirty` when the work tree had changes), so that a build can be traced to a commit."""

from __future__ import annotations

import re

from gpuprov.core.errors import InputError
from gpuprov.images.model import Image
from gpuprov.inventory.checks import REGISTRY_ADDRESS

TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
SHORT = 12


def check_registry(registry: str | None) -> str | None:
    """--registry as given (trailing / dropped), once it is a registry host with an optional port and path."""
    if registry is None:
        return None
    text = str(registry).strip().rstrip("/")
    if not REGISTRY_ADDRESS.fullmatch(text):
        raise InputError(f"--registry must be a registry host with an optional port and path, such as "
                         f"127.0.0.1:5000 or registry.example.com/team, not {registry!r}", step="images")
    from gpuprov.inventory.checks import registry_port_problem

    problem = registry_port_problem(text)
    if problem:
        raise InputError(f"--registry {text!r}: {problem}", step="images")
    return text


def repository(image: Image, registry: str | None = None) -> str:
    return f"{registry}/{image.name}" if registry else image.name


def image_tags(image: Image, registry: str | None = None, revision: str | None = None) -> list[str]:
    """The image's tags: the version tag, and the version tag with the revision when there is one."""
    name = repository(image, registry)
    tags = [f"{name}:{image.version_tag}"]
    if revision:
        commit, _, dirty = revision.partition("-")
        tags.append(f"{name}:{image.version_tag}-{commit[:SHORT]}{'-' + dirty if dirty else ''}")
    for tag in tags:
        if not TAG.fullmatch(tag.rsplit(":", 1)[1]):
            raise InputError(f"image {image.id}: {tag!r} is not a valid tag (letters, digits, '_', '.' and '-', at "
                             "most 128)", step="images")
    return tags
