"""SSH algorithms: the modern sets gpuprov offers, what the host's OpenSSH supports, and what paramiko (gpuprov's
own SSH client) can use, read from paramiko at run time rather than written down here.

sshd_config names: KexAlgorithms, Ciphers, MACs, HostKeyAlgorithms; `ssh -Q` queries: kex, cipher, mac, key-sig;
paramiko.Transport lists: _preferred_kex, _preferred_ciphers, _preferred_macs, _preferred_keys.
"""

from __future__ import annotations

from dataclasses import dataclass

# The dev-sec ssh-hardening baseline's choices, newest first, for OpenSSH 8.x to 10.x: post-quantum hybrid and
# X25519 key exchange, 4096+ bit DH groups, AEAD and CTR ciphers, encrypt-then-MAC MACs, Ed25519 and RSA-SHA2
# host keys. Each is offered only where the host's OpenSSH supports it (`ssh -Q`).
MODERN: dict[str, tuple[str, ...]] = {
    "kex_algorithms": ("mlkem768x25519-sha256", "sntrup761x25519-sha512", "sntrup761x25519-sha512@openssh.com",
                       "curve25519-sha256", "curve25519-sha256@libssh.org", "diffie-hellman-group18-sha512",
                       "diffie-hellman-group16-sha512"),
    "ciphers": ("chacha20-poly1305@openssh.com", "aes256-gcm@openssh.com", "aes128-gcm@openssh.com", "aes256-ctr",
                "aes192-ctr", "aes128-ctr"),
    "macs": ("hmac-sha2-512-etm@openssh.com", "hmac-sha2-256-etm@openssh.com", "umac-128-etm@openssh.com"),
    "host_key_algorithms": ("ssh-ed25519", "ssh-ed25519-cert-v01@openssh.com", "sk-ssh-ed25519@openssh.com",
                            "sk-ssh-ed25519-cert-v01@openssh.com", "rsa-sha2-512", "rsa-sha2-512-cert-v01@openssh.com",
                            "rsa-sha2-256", "rsa-sha2-256-cert-v01@openssh.com"),
}
KINDS = tuple(MODERN)
SSHD_KEYWORD = {"kex_algorithms": "KexAlgorithms", "ciphers": "Ciphers", "macs": "MACs",
                "host_key_algorithms": "HostKeyAlgorithms"}
_PARAMIKO_LIST = {"kex_algorithms": "_preferred_kex", "ciphers": "_preferred_ciphers", "macs": "_preferred_macs",
                  "host_key_algorithms": "_preferred_keys"}
# the host key type paramiko verifies (PKey.get_name()) -> the HostKeyAlgorithms that present such a key
KEY_TYPE_ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


def paramiko_supported(kind: str) -> tuple[str, ...]:
    """What paramiko, as installed, negotiates for one kind (its Transport's preferred list)."""
    import paramiko

    return tuple(getattr(paramiko.Transport, _PARAMIKO_LIST[kind]))


@dataclass(frozen=True)
class AlgorithmChoice:
    """The algorithms of one kind that the drop-in sets, and whether the inventory named them."""

    kind: str
    names: tuple[str, ...]
    explicit: bool

    @property
    def keyword(self) -> str:
        return SSHD_KEYWORD[self.kind]

    def with_paramiko(self) -> tuple[str, ...]:
        """The names paramiko can use too (empty: gpuprov could not connect any more)."""
        supported = set(paramiko_supported(self.kind))
        return tuple(name for name in self.names if name in supported)


def choose(kind: str, explicit: list[str] | None, host_supports: list[str] | None) -> AlgorithmChoice:
    """The inventory's list as written (sshd -t judges it on the host), else the modern set the host supports
    (all of it when the host's OpenSSH cannot be asked)."""
    if explicit:
        return AlgorithmChoice(kind, tuple(explicit), True)
    names = MODERN[kind]
    if host_supports:
        names = tuple(name for name in names if name in set(host_supports))
    return AlgorithmChoice(kind, names, False)


def presents_key(choice: AlgorithmChoice, key_type: str) -> bool:
    """Whether HostKeyAlgorithms still lets the host present a key of `key_type`, in a way paramiko accepts."""
    usable = set(choice.with_paramiko())
    return any(name in usable for name in KEY_TYPE_ALGORITHMS.get(key_type, (key_type,)))
