"""gpuprov.core.digest: the one SHA-256 of a file, judged by coreutils' sha256sum and the FIPS 180-2 vector."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpuprov.core.digest import file_sha256


def test_the_published_vector_of_abc(tmp_path):
    path = tmp_path / "abc"
    path.write_bytes(b"abc")
    assert file_sha256(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.tool
@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils' sha256sum")
def test_a_file_of_several_blocks_matches_sha256sum(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(bytes(range(256)) * 12289)  # 3 MiB and then some: more than one read
    judge = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    assert file_sha256(str(path)) == judge
