"""A host that is this machine (commands run with `sh -c` here, uploads copy files) and small wheelhouses for it:
pip's own wheel (from ensurepip) and a pure-Python wheel made here."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov.connection import Result
from gpuprov.validation.env import Wheelhouse


class LocalSFTP:
    def __init__(self, conn):
        self.conn = conn

    def put(self, local, remote):
        self.conn.uploads.append(remote)
        shutil.copyfile(local, remote)

    def posix_rename(self, old, new):
        os.replace(old, new)


class LocalConn:
    """A host that is this machine: commands run with `sh -c` (as this user, root in CI), uploads copy files."""

    def __init__(self, name: str = "lab01", env: dict | None = None):
        self.host = SimpleNamespace(name=name, user=os.environ.get("USER") or "root", address="127.0.0.1")
        self.commands: list[str] = []
        self.sudo: list[bool] = []
        self.uploads: list[str] = []
        self.env = env

    def run(self, command, *, sudo=False, timeout=None, stdin=None):
        self.commands.append(command)
        self.sudo.append(sudo)
        done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True,
                              timeout=timeout or 600, check=False, env=self.env)
        return Result(command, done.returncode, done.stdout, done.stderr, 0.0)

    def sftp(self):
        return LocalSFTP(self)


def make_wheel(folder: Path, version: str = "1.0", value: int = 42) -> Path:
    """A pure-Python wheel `gpuprov_probe` whose module holds VALUE (PEP 427 layout, RECORD with hashes)."""
    files = {
        "gpuprov_probe/__init__.py": f"VALUE = {value}\n".encode(),
        f"gpuprov_probe-{version}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: gpuprov-probe\nVersion: {version}\n".encode(),
        f"gpuprov_probe-{version}.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"gpuprov_probe-{version}.dist-info/RECORD,,")
    files[f"gpuprov_probe-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"gpuprov_probe-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def pip_wheel() -> Path:
    import ensurepip

    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not bundled:
        pytest.skip("this Python has no bundled pip wheel (ensurepip)")
    return bundled[-1]


def tiny_wheelhouse(folder: Path, version: str = "1.0", value: int = 42) -> Wheelhouse:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(pip_wheel(), folder)
    make_wheel(folder, version, value)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*.whl")}
    return Wheelhouse(folder, files, ["gpuprov-probe"])

