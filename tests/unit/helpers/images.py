"""What the image tests share: a CUDA spec with its Python family pinned, and a build context whose archive must
describe every kind of entry."""

from __future__ import annotations

import os
from pathlib import Path

# a train image on CUDA 12.8.1 / Ubuntu 24.04 with python3-defaults pinned as a family (noble's release pocket);
# FLAVOR is where a test puts `, flavor: ...` (nothing by default: cuda_spec())
CUDA_SPEC = """\
name: t
purpose: train
gpus: [H100-SXM]
base: {cuda: "12.8.1", cudnn: "9", ubuntu: "24.04"FLAVOR}
pytorch: "2.8.0"
apt: {python3: "3.12.3-0ubuntu2", python3-minimal: "3.12.3-0ubuntu2", libpython3-stdlib: "3.12.3-0ubuntu2",
      python3-venv: "3.12.3-0ubuntu2"}
user: {name: gpuprov, uid: 1000}
"""


def cuda_spec(flavor: str = "") -> str:
    """The spec with `flavor` (e.g. `, flavor: devel`) where FLAVOR stands."""
    return CUDA_SPEC.replace("FLAVOR", flavor)


def context_tree(folder: Path) -> Path:
    """A context with what the SDK's archive must describe: folders, an executable, an empty file, two names of
    one file (a hard link) and files of and off a tar block's size, larger than a piece of the stream."""
    (folder / "smoke").mkdir(parents=True)
    (folder / "smoke" / "core.py").write_text("print('core')\n")
    (folder / "gpuprov-smoke").write_text("#!/bin/sh\nexit 0\n")
    (folder / "gpuprov-smoke").chmod(0o755)
    (folder / "empty").write_bytes(b"")
    (folder / "wheels").mkdir()
    (folder / "wheels" / "big.whl").write_bytes(os.urandom(3 * 4096 + 517))
    os.link(folder / "wheels" / "big.whl", folder / "wheels" / "same.whl")
    (folder / "wheels" / "exact.whl").write_bytes(b"x" * 8192)
    (folder / "Dockerfile").write_text("FROM scratch\nCOPY wheels/ /wheels/\nCOPY smoke/ /smoke/\n")
    return folder
