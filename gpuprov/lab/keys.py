"""SSH keys of the lab: the operator key pair, one ed25519 host key per host, and known_hosts."""

from __future__ import annotations

import os
from pathlib import Path


def _generate(comment: str) -> tuple[bytes, str]:
    """A new ed25519 key: (OpenSSH private key bytes, public key line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, f"{public.decode()} {comment}"


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def ensure_keypair(private_path: Path, comment: str) -> str:
    """Create the key pair at `private_path` (+ `.pub`) once. Returns the public key line."""
    public_path = private_path.with_name(private_path.name + ".pub")
    if private_path.exists() and public_path.exists():
        return public_path.read_text(encoding="utf-8").strip()
    private, public = _generate(comment)
    _write_private(private_path, private)
    public_path.write_text(public + "\n", encoding="utf-8")
    return public


def known_hosts_line(address: str, port: int, public_key: str) -> str:
    """One OpenSSH known_hosts entry; a non-22 port uses the `[host]:port` form."""
    key_type, key_data = public_key.split()[:2]
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {key_type} {key_data}"


def render_known_hosts(entries: list[tuple[str, int, str]]) -> str:
    """known_hosts text for (address, port, public key) entries."""
    return "".join(known_hosts_line(*entry) + "\n" for entry in entries)
