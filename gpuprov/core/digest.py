"""The one SHA-256 of a file the controller takes (wheelhouse manifests, lab packages)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    """The hex sha256 of a file's content, read in blocks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
