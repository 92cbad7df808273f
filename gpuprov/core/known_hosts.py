"""known_hosts files read strictly: every line is an entry gpuprov understands, or the file is bad input.

paramiko's reader skips every line it cannot parse, so a corrupt file would quietly leave hosts unknown (and
`--trust-new-hosts` would append to a file nobody can read). gpuprov reads the file itself, once per run and
before any host is contacted, and hands paramiko the keys of the one host a connection is for. A problem is
an `InputError` (exit 2) as `FILE:LINE: known_hosts: message`.

The format is OpenSSH's (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT"): `[@MARKER] HOSTS KEYTYPE KEY [COMMENT]`.
HOSTS is a comma list of patterns (`*` and `?` wildcards, `!` negates, `[HOST]:PORT` for a port other than
22) or one hashed name `|1|SALT|HASH` (`ssh-keygen -H`). `@revoked` keys are refused. `@cert-authority`
lines are read and checked, never trusted: paramiko cannot verify host certificates, so a host that only a CA line
covers is refused, naming that line (gpuprov.core.connection), rather than trusted on first use. A key type
paramiko cannot use (ssh-dss) is read and never matches.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import struct
import threading
from dataclasses import dataclass, field
from hashlib import sha1
from pathlib import Path

from gpuprov.core.errors import InputError, literal
from gpuprov.inventory.checks import NotRegular, read_regular

MARKERS = ("@cert-authority", "@revoked")
MAX_BYTES = 64 * 1024 * 1024
MAX_ERRORS = 10
_HASHED = re.compile(r"\|1\|([A-Za-z0-9+/=]+)\|([A-Za-z0-9+/=]+)")
_HOST = r"[A-Za-z0-9._:%*?-]+"
_PATTERN = re.compile(_HOST)
_PORTED = re.compile(rf"\[({_HOST})\]:([0-9]+)")
_FIELDS = re.compile(r"[ \t]+")
_WHERE = "point gpuprov.known_hosts (invoke.yaml) or the inventory's known_hosts at a known_hosts file"
_HINT = "fix or delete that line (ssh-keygen -R HOST -f FILE removes a host's entries), or " + _WHERE
_WRITES = threading.Lock()


class KnownHostsError(InputError):
    """A known_hosts file gpuprov cannot use; `.errors` holds each problem as `FILE:LINE: known_hosts: message`."""

    def __init__(self, path: Path, errors: list[str], hint: str = _HINT):
        self.errors = list(errors)
        message = self.errors[0] if len(self.errors) == 1 else (
            f"{literal(str(path))}: {len(self.errors)} errors:\n  " + "\n  ".join(self.errors))
        super().__init__(message, hint=hint)


@dataclass(frozen=True)
class Entry:
    """One key line: where it is, its marker ("" for a plain host key), its host names and its key (None when
    paramiko cannot use the key type)."""

    line: int
    marker: str
    names: str
    key_type: str
    key: object | None

    def matches(self, name: str) -> bool:
        """Whether `name` (`host`, or `[host]:port` for a port other than 22) is one of this line's hosts."""
        name = name.lower()
        hashed = _HASHED.fullmatch(self.names)
        if hashed:
            salt, digest = (base64.b64decode(part) for part in hashed.groups())
            return hmac.compare_digest(hmac.new(salt, name.encode(), sha1).digest(), digest)
        positive = False
        for pattern in self.names.split(","):
            negated = pattern.startswith("!")
            if _host_matches(pattern.removeprefix("!").lower(), name):
                if negated:
                    return False
                positive = True
        return positive


@dataclass
class KnownHosts:
    """A parsed known_hosts file; `record` appends a key (trust on first use) to the file and to `entries`."""

    path: Path
    entries: list[Entry] = field(default_factory=list)

    def keys_for(self, name: str) -> list:
        """The usable host keys listed for `name`, less any that are revoked for it."""
        return [e.key for e in self.entries if not e.marker and e.key is not None and e.matches(name)
                and self.revoked(name, e.key) is None]

    def revoked(self, name: str, key) -> Entry | None:
        """The `@revoked` line that revokes `key` for `name`, or None."""
        return next((e for e in self.entries if e.marker == "@revoked" and e.key is not None
                     and e.key.asbytes() == key.asbytes() and e.matches(name)), None)

    def cert_authority(self, name: str) -> Entry | None:
        """The first `@cert-authority` line whose hosts include `name`, or None."""
        return next((e for e in self.entries if e.marker == "@cert-authority" and e.matches(name)), None)

    def record(self, name: str, key) -> None:
        """Append `name KEYTYPE KEY` to the file (creating it; after a line break when the last line lacks one),
        once: hosts that share a jump host may all meet its key in the same run."""
        with _WRITES:
            if any(known.asbytes() == key.asbytes() for known in self.keys_for(name)):
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a+b") as handle:
                handle.seek(0, 2)
                newline = b""
                if handle.tell():
                    handle.seek(-1, 2)
                    newline = b"" if handle.read(1) == b"\n" else b"\n"
                handle.write(newline + f"{name} {key.get_name()} {key.get_base64()}\n".encode())
            self.entries.append(Entry(0, "", name, key.get_name(), key))


def read_known_hosts(path: Path) -> KnownHosts:
    """Every entry of a known_hosts file (none when it does not exist yet); KnownHostsError for a file gpuprov
    cannot use: a folder, an unreadable or binary file, a malformed line."""
    path = Path(path)
    shown = literal(str(path))
    if not path.exists():
        return KnownHosts(path)
    if path.is_dir():
        raise KnownHostsError(path, [f"{shown}: known_hosts: a folder, not a file"], _WHERE)
    if not path.is_file():
        raise KnownHostsError(path, [f"{shown}: known_hosts: not a regular file"], _WHERE)
    try:
        data = read_regular(path, MAX_BYTES)  # checked on the opened file: no pipe or device is read
    except NotRegular as exc:
        problem = (f"{exc.size} bytes, more than the {MAX_BYTES} a known_hosts file may have: is this the right "
                   "file?" if exc.size is not None else exc.reason)
        raise KnownHostsError(path, [f"{shown}: known_hosts: {problem}"], _WHERE) from None
    except OSError as exc:
        raise KnownHostsError(path, [f"{shown}: known_hosts: cannot read: {exc.strerror}"],
                              "give this user read access to it, or " + _WHERE) from None
    entries, errors = _parse(_text(path, data))
    if errors:
        more = len(errors) - MAX_ERRORS
        shown_errors = [f"{shown}:{line}: known_hosts: {message}" for line, message in errors[:MAX_ERRORS]]
        raise KnownHostsError(path, shown_errors + ([f"... and {more} more"] if more > 0 else []))
    return KnownHosts(path, entries)


def _text(path: Path, data: bytes) -> str:
    """The file as text; a NUL byte or bytes that are not UTF-8 mean it is not a known_hosts file."""
    shown = literal(str(path))
    if b"\0" in data:
        line = data[:data.index(b"\0")].count(b"\n") + 1
        raise KnownHostsError(path, [f"{shown}:{line}: known_hosts: binary data (a NUL byte): not a known_hosts "
                                     "file"], _WHERE)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise KnownHostsError(path, [f"{shown}:{line}: known_hosts: not UTF-8 text: not a known_hosts file"],
                              _WHERE) from None


def _parse(text: str) -> tuple[list[Entry], list[tuple[int, str]]]:
    entries, errors = [], []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        try:
            entries.append(_entry(number, line))
        except ValueError as exc:
            errors.append((number, str(exc)))
    return entries, errors


def _entry(number: int, line: str) -> Entry:
    """One key line as an Entry; ValueError saying what is wrong with it."""
    from paramiko.pkey import PKey, UnknownKeyType

    fields = _FIELDS.split(line)
    marker = fields.pop(0) if fields[0].startswith("@") else ""
    if marker and marker not in MARKERS:
        raise ValueError(f"unknown marker {_show(marker)}: the markers are {' and '.join(MARKERS)}")
    if len(fields) < 3:
        raise ValueError(f"expected {'@MARKER ' if marker else ''}HOSTS KEYTYPE KEY [COMMENT], found "
                         f"{len(fields)} field{'s' if len(fields) != 1 else ''} {_show(line)}")
    names, key_type, encoded = fields[:3]
    _check_names(names)
    try:
        blob = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise ValueError(f"the key of type {_show(key_type)} is not valid base64") from None
    inner = _blob_type(blob)
    if inner != key_type:
        raise ValueError(f"the key is of type {_show(inner)} but the line says {_show(key_type)}")
    try:
        key = PKey.from_type_string(key_type, blob)
    except UnknownKeyType:
        key = None
    except Exception as exc:  # noqa: BLE001 - paramiko and cryptography raise several kinds for bad key data
        raise ValueError(f"bad {key_type} key: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
            from None
    return Entry(number, marker, names, key_type, key)


def _check_names(names: str) -> None:
    if names.startswith("|"):
        hashed = _HASHED.fullmatch(names)
        if not hashed or any(len(_b64(part)) != sha1().digest_size for part in hashed.groups()):
            raise ValueError(f"bad hashed host name {_show(names)}: expected |1|SALT|HASH with a base64 SALT and "
                             "HASH of 20 bytes each, as ssh-keygen -H writes them")
        return
    for pattern in names.split(","):
        name = pattern.removeprefix("!")
        if not name:
            raise ValueError(f"empty host name in {_show(names)}")
        if name.startswith("["):
            ported = _PORTED.fullmatch(name)
            if not ported or not 1 <= int(ported.group(2)) <= 65535:
                raise ValueError(f"bad host {_show(name)}: a port other than 22 is written [HOST]:PORT, with a "
                                 "PORT from 1 to 65535")
        elif not _PATTERN.fullmatch(name):
            raise ValueError(f"bad host name {_show(name)}: letters, digits, '.', '-', '_', ':', '%', the "
                             "wildcards '*' and '?', or [HOST]:PORT")


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        return b""


def _blob_type(blob: bytes) -> str:
    """The key type an SSH public key blob starts with (a length-prefixed string)."""
    if len(blob) < 4:
        raise ValueError("the key is too short to be an SSH public key")
    (length,) = struct.unpack(">I", blob[:4])
    if length > len(blob) - 4:
        raise ValueError("the key is cut short: not an SSH public key")
    try:
        return blob[4:4 + length].decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("the key does not start with a key type: not an SSH public key") from None


def _host_matches(pattern: str, name: str) -> bool:
    """OpenSSH's host pattern (both lower case): `*` any run of characters, `?` one, everything else literal."""
    if "*" not in pattern and "?" not in pattern:
        return pattern == name
    return re.fullmatch("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern),
                        name) is not None


def _show(text: str) -> str:
    """A token of the file quoted for a message, escaped, and cut at 60 characters."""
    return repr(text if len(text) <= 60 else text[:57] + "...")
