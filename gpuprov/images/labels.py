"""An image's labels, so that other tasks can match an image with a host.

In the Dockerfile (they change only with the spec): the OCI `title`, `version` and `description`, and the stack
`io.gpuprov.purpose`, `.pytorch`, `.cuda`, `.cudnn`, `.nccl` and `.min-driver` (the lowest driver the image runs
on, from the resolver's data: an NGC image's CUDA natively, a PyTorch CUDA wheel through its major's minor-version
compatibility). A CPU image has no cuda, nccl or min-driver label.

Given at build time (they change with the commit, and would change the context): the OCI `created` (the commit's
time, or SOURCE_DATE_EPOCH, so that a rebuild of the same commit is the same), `revision` (the commit, `-dirty`
when the work tree has changes), `source` (the origin remote, without login, query or fragment) and
`io.gpuprov.context-hash`, the content hash of the rendered context that `images.build --changed-only` compares.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gpuprov.images.model import Image

OCI = "org.opencontainers.image."
GPUPROV = "io.gpuprov."
CONTEXT_HASH = GPUPROV + "context-hash"
MIN_DRIVER = GPUPROV + "min-driver"


@dataclass(frozen=True)
class Provenance:
    """Where a build comes from: None for what git cannot tell (not a checkout, no remote)."""

    revision: str | None
    created: str | None
    source: str | None


def image_labels(image: Image) -> dict[str, str]:
    """The labels the Dockerfile sets."""
    versions = image.versions
    labels = {OCI + "title": image.name, OCI + "version": image.version_tag}
    if image.description:
        labels[OCI + "description"] = image.description
    stack = {"purpose": image.purpose, "pytorch": versions.pytorch, "cuda": versions.cuda, "cudnn": versions.cudnn,
             "nccl": versions.nccl, "min-driver": versions.min_driver}
    labels.update({GPUPROV + key: value for key, value in stack.items() if value})
    return labels


def build_labels(context_hash: str, provenance: Provenance) -> dict[str, str]:
    """The labels given at build time (`docker build --label`, the SDK's `labels=`, bake's `labels`)."""
    labels = {CONTEXT_HASH: context_hash}
    for key in ("created", "revision", "source"):
        value = getattr(provenance, key)
        if value:
            labels[OCI + key] = value
    return labels


def provenance(root: Path = Path(".")) -> Provenance:
    """The commit, its time and the origin remote of the checkout at `root` (the working directory's)."""
    revision = _git(root, "rev-parse", "HEAD")
    if revision and _git(root, "status", "--porcelain"):
        revision += "-dirty"
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch.isdigit():
        created = datetime.datetime.fromtimestamp(int(epoch), datetime.UTC)
    else:
        stamp = _git(root, "log", "-1", "--format=%ct")
        created = datetime.datetime.fromtimestamp(int(stamp), datetime.UTC) if stamp and stamp.isdigit() else None
    source = _git(root, "remote", "get-url", "origin")
    return Provenance(revision=revision, created=created.strftime("%Y-%m-%dT%H:%M:%SZ") if created else None,
                      source=public_source(source) if source else None)


def public_source(remote: str) -> str | None:
    """The origin remote as the `source` label shows it: a URL with the host and port the URL parser finds, without
    user, password, query and fragment (so no part of a login survives, even one with an unescaped `@`), None
    when it cannot be parsed; an scp-like remote (`git@host:org/repo.git`) as `host:org/repo.git`."""
    try:
        parts = urlsplit(remote)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:  # a bad port or IPv6 literal
        return None
    if not parts.netloc:
        login, at, rest = remote.rpartition("@")
        return rest if at and ":" in rest and "/" not in login else remote
    if not parts.hostname:
        return None
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def context_hash(folder: Path, file_digest=None) -> str:
    """sha256 over the context's files: each relative path, whether it is executable, and its content (its sha256,
    by `file_digest(path)` where given: images.render's cache of it)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(b"x" if os.access(path, os.X_OK) else b"-")
        digest.update((file_digest or _file_digest)(path))
    return "sha256:" + digest.hexdigest()


def _file_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
