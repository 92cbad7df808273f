"""No tracked file keeps a merge's conflict markers (a README once landed with both sides of a merge in it)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = [ROOT / name for name in listed.decode().split("\0") if name]
    return [path for path in files if path.is_file() and b"\0" not in path.read_bytes()[:8192]]


def test_the_check_sees_a_conflict():
    assert MARKER.search("text\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n")


@pytest.mark.tool
def test_no_tracked_file_has_conflict_markers():
    found = [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
             for path in tracked_text_files()
             for text in [path.read_text(errors="replace")]
             for m in MARKER.finditer(text)]
    assert not found, f"conflict markers left by a merge: {found}"
