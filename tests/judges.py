"""Outside judges the tests ask, never gpuprov's own code: nft -c, sshd -t / -T, a real sshd on 127.0.0.1,
ssh-audit (PyPI) and paramiko's own handshake, apt-config."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
needs_nft = pytest.mark.skipif(shutil.which("nft") is None, reason="nft is not installed (apt-get install nftables)")
needs_sshd = pytest.mark.skipif(not os.path.exists(SSHD) or os.geteuid() != 0,
                                reason="sshd (apt-get install openssh-server) and root are needed")


def nft_check(text: str, folder: Path) -> subprocess.CompletedProcess:
    """`nft -c -f` on a ruleset: nftables' own parser and kernel-free check."""
    path = folder / "ruleset.nft"
    path.write_text(text)
    return subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True, timeout=60)


def host_key(folder: Path) -> Path:
    key = folder / "ssh_host_ed25519_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def sshd_config(folder: Path, body: str, name: str = "sshd_config") -> Path:
    """A whole sshd configuration: `body` first (sshd keeps the first value), then a test host key and pid file."""
    path = folder / name
    path.write_text(body + f"\nHostKey {host_key(folder)}\nPidFile {folder / 'sshd.pid'}\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    return path


def sshd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SSHD, *args], capture_output=True, text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_sshd(config: Path) -> Iterator[int]:
    """`sshd -D` with this configuration on 127.0.0.1 only; yields its port."""
    port = free_port()
    proc = subprocess.Popen([SSHD, "-D", "-e", "-p", str(port), "-f", str(config), "-o", "ListenAddress=127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.recv(8).startswith(b"SSH-"):
                    break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def ssh_audit(host: str, port: int) -> dict:
    """ssh-audit's JSON report of a running sshd (the rate test skipped: it only measures connection speed)."""
    proc = subprocess.run([sys.executable, "-m", "ssh_audit", "-j", "--skip-rate-test", "-p", str(port), host],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def ssh_audit_counts(report: dict) -> dict[str, int]:
    """How many algorithms ssh-audit marks fail and warn, and how many CVEs it lists."""
    counts = {"fail": 0, "warn": 0, "cves": len(report.get("cves") or [])}
    for kind in ("kex", "key", "enc", "mac"):
        for entry in report.get(kind) or []:
            notes = entry.get("notes") or {}
            counts["fail"] += bool(notes.get("fail"))
            counts["warn"] += bool(notes.get("warn"))
    return counts


def ssh_audit_failures(report: dict) -> list[str]:
    """Every failure-level finding: algorithms marked fail, and CVEs."""
    found = [f"{kind} {entry['algorithm']}: {'; '.join(entry['notes']['fail'])}"
             for kind in ("kex", "key", "enc", "mac") for entry in report.get(kind) or []
             if (entry.get("notes") or {}).get("fail")]
    return found + [f"CVE {cve.get('name')}" for cve in report.get("cves") or []]


def paramiko_handshake(port: int) -> str:
    """Negotiate with an sshd as paramiko (gpuprov's SSH client) does; returns the cipher agreed, or raises."""
    import paramiko

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        transport = paramiko.Transport(sock)
        try:
            transport.start_client(timeout=10)
            return transport.remote_cipher
        finally:
            transport.close()
