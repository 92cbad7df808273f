"""A host that is this machine (commands run with `sh -c` here, uploads copy files) and small wheelhouses for it:
pip's own wheel (from ensurepip) and a pure-Python wheel made here."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import subprocess
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov.core.connection import Result
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
    """The tests' one implementation of gpuprov.core.connection.Connection: this machine as a host.

    Commands run with `sh -c` here (as this user, root in CI), uploads copy files, a tunnel is a TCP connection
    from here (to `tunnel_port` when a stand-in service listens there). `answer(command, stdin)` may play the host
    instead: a Result, a string (stdout, exit 0) or None to run the command for real. Every command, its stdin and
    sudo flag, and every tunnel asked for are recorded; `closed` is set by close()."""

    connect_timeout = 5

    def __init__(self, host=None, *, name: str = "lab01", env: dict | None = None,
                 answer: Callable[[str, str | None], Result | str | None] | None = None,
                 tunnel_port: int | None = None):
        if isinstance(host, str):
            host, name = None, host
        self.host = host or SimpleNamespace(name=name, user=os.environ.get("USER") or "root", address="127.0.0.1")
        self.commands: list[str] = []
        self.stdins: list[str | None] = []
        self.sudo: list[bool] = []
        self.uploads: list[str] = []
        self.tunnels: list[tuple[str, int]] = []
        self.env, self.answer, self.tunnel_port = env, answer, tunnel_port
        self.closed = threading.Event()

    def open(self) -> LocalConn:
        return self

    def close(self) -> None:
        self.closed.set()

    def fresh(self, *, connect_timeout: int | None = None, retries: int | None = None) -> LocalConn:
        """The same host again (its own recordings shared: the tests judge what reached the host)."""
        return self

    def server_key_type(self) -> str | None:
        return "ssh-ed25519"

    def open_tunnel(self, port: int, address: str = "127.0.0.1", timeout: int | None = None):
        """A TCP connection to `port` (or `tunnel_port`) on this machine, recording where the host was asked to
        connect."""
        self.tunnels.append((address, port))
        return socket.create_connection(("127.0.0.1", self.tunnel_port or port), timeout=timeout)

    def run(self, command, *, sudo=False, timeout=None, stdin=None) -> Result:
        self.commands.append(command)
        self.stdins.append(stdin)
        self.sudo.append(sudo)
        if self.answer is not None:
            answered = self.answer(command, stdin)
            if isinstance(answered, str):
                return Result(command, 0, answered, "", 0.0)
            if answered is not None:
                return answered
        done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True,
                              timeout=timeout or 600, check=False, env=self.env)
        return Result(command, done.returncode, done.stdout, done.stderr, 0.0)

    def sftp(self) -> LocalSFTP:
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

