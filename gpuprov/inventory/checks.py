"""One checker per kind of value gpuprov takes from an operator (inventory, specs, settings, flags): address,
CIDR, port (and a registry address's), integer and count, number and percent, duration, URL, path on a host,
local path, output file, the input file itself and what a public file must not hold (a private key). Every
other module asks these, so a kind of value is accepted (or refused) the same way wherever it is written.

A `*_problem` checker returns None for a good value and, for a bad one, what is wrong with it in words; a
`*_warning` checker the same for a value that is accepted but deserves a second look (the caller records it as a
warning at its place);
`ip_address` and `network` return the parsed value, or None. The caller names the place (`FILE:LINE:COL: key:`,
a flag, a setting) and raises or records the problem (exit 2). `read_regular` reads an input file: a regular
file only (not a pipe, a device or a link to one), bounded.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# an IPv6 zone (`fe80::1%eth0`) is an interface name: Linux's IFNAMSIZ allows 15 characters
ZONE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
# Python's timeouts (threading, sockets) stop at threading.TIMEOUT_MAX; systemd's timers are far beyond a
# year, which is already longer than any wait gpuprov has a use for
MAX_SECONDS = 366 * 24 * 3600
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/var/lock", "/run/lock")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_URL_FORBIDDEN = re.compile(r"[\s\"'`\\<>]")
_HOST_PATH = re.compile(r"/[A-Za-z0-9_.+@/-]*")

# A registry address images are pulled from: `host[:port][/path]`, no scheme (images.tags builds references on it).
REGISTRY_ADDRESS = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?"
                              r"(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
# A Release `Label:` apt can pin by (`Pin: release l=LABEL`): letters, digits, spaces and ._+:~/- only.
RELEASE_LABEL = re.compile(r"[\w][\w .+:~/-]*")


# ---------------------------------------------------------------------------------------------- addresses

def ip_address(text: Any, zone: bool = True) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `text` is, or None. A zone (`%eth0`) is accepted only as an interface name, and only
    with `zone` (a monitoring or cluster address, reached from other hosts, has none)."""
    if not isinstance(text, str) or not text.isascii():
        return None
    _, percent, name = text.partition("%")
    if percent and not (zone and ZONE.fullmatch(name)):
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def network(item: Any) -> tuple[str | None, str]:
    """(the network's text, "") for a CIDR like 10.0.0.0/8; (None, a hint for the message) otherwise. A zone
    makes no sense in a network (a rule matches addresses, not interfaces) and is refused."""
    if not isinstance(item, str):
        return None, ": give it as text like 10.0.0.0/8"
    if "%" in item:
        return None, ": a network has no IPv6 zone (%...); give it like fe80::/10"
    if not item.isascii():
        return None, ""
    try:
        return str(ipaddress.ip_network(item)), ""
    except ValueError:
        pass
    try:
        return None, f" (host bits set; did you mean {ipaddress.ip_network(item, strict=False)}?)"
    except ValueError:
        return None, ""


def registry_problem(value: Any) -> str | None:
    """Why `value` is not a registry address images are pulled from (`host[:port][/path]`, no scheme)."""
    if isinstance(value, str) and REGISTRY_ADDRESS.fullmatch(value) and not registry_port_problem(value):
        return None
    return f"must be a registry address like host:5000, not {value!r}"


def registry_port_problem(registry: str) -> str | None:
    """Why the port of a registry address (`host:5000/path`, `[v6]:5000`) is refused: out of 1 to 65535."""
    host = registry.split("/", 1)[0]
    head, colon, port = host.rpartition(":")
    if not colon or head.endswith(":") or not port.isdigit() or (":" in head and not head.endswith("]")):
        return None  # no port (a bare IPv6 address has colons of its own)
    return None if 1 <= int(port) <= 65535 else f"port {port} is out of range: give a port from 1 to 65535"


# ------------------------------------------------------------------------------------------------ numbers

def port_problem(value: Any, low: int = 1) -> str | None:
    """Why `value` is not a TCP/UDP port (an integer from `low`, 1 unless unprivileged, to 65535)."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= 65535:
        return None
    return f"bad port {value!r}: give an integer from {low} to 65535"


def integer_problem(value: Any, low: int, high: int | None = None) -> str | None:
    """Why `value` is not a whole number from `low` (to `high`); a count is integer_problem(value, 1)."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value and (high is None or value <= high):
        return None
    wanted = f">= {low}" if high is None else f"from {low} to {high}"
    return f"expected an integer {wanted}, not {value!r}"


def number_problem(value: Any, low: float | None = None, high: float | None = None, *,
                   above: bool = True) -> str | None:
    """Why `value` is not a finite number above `low` (at least `low` with above=False) and at most `high`.
    NaN and infinities (YAML's `.nan`, `.inf`) are never numbers here."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if above else value >= low
    if ok and high is not None:
        ok = value <= high
    if ok:
        return None
    bounds = []
    if low is not None:
        bounds.append(f"{'above' if above else 'at least'} {_figure(low)}")
    if high is not None:
        bounds.append(f"at most {_figure(high)}")
    infinite = isinstance(value, float) and not math.isfinite(value)
    return (f"must be a number{' ' + ' and '.join(bounds) if bounds else ''}, not {value!r}"
            + (" (NaN and infinity are not numbers here)" if infinite else ""))


def _figure(bound: float) -> str:
    """A bound as written: whole numbers in full (31622400, not 3.16224e+07)."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def percent_problem(value: Any) -> str | None:
    """Why `value` is not a percent: a finite number above 0 and at most 100."""
    return number_problem(value, 0, 100)


def duration_problem(value: Any, low: float = 1, high: float = MAX_SECONDS) -> str | None:
    """Why `value` is not a number of seconds from `low` to `high` (what Python's and systemd's timers hold)."""
    return number_problem(value, low, high, above=False)


# ------------------------------------------------------------------------------------------------ hardware

def hardware_warning(hardware: Any) -> str | None:
    """Why a host's `hardware` deserves a second look: the full GPU count of an HGX/DGX baseboard whose NVSwitches
    are no PCI devices (gpus.yaml hgx_gpus: 8 x B200) without `nvswitch`. The facts cannot show those NVSwitches,
    so the inventory decides, and without it gpuprov installs neither Fabric Manager nor the NVLink Subnet Manager,
    without which CUDA cannot use the GPUs. None otherwise (nvswitch given either way, another model or count)."""
    from gpuprov.catalog import FOURTH_GENERATION, find, nvswitch_generation

    if not isinstance(hardware, dict) or "nvswitch" in hardware or not isinstance(hardware.get("gpu"), str):
        return None
    model = find(hardware["gpu"])
    if (model is None or model.hgx_gpus is None or hardware.get("count") != model.hgx_gpus
            or (nvswitch_generation(model.arch) or 0) < FOURTH_GENERATION):
        return None
    return (f"{model.hgx_gpus} x {model.key} without nvswitch: an HGX {model.key} joins its {model.hgx_gpus} GPUs "
            f"through NVSwitches, which need Fabric Manager and the NVLink Subnet Manager before CUDA can use the "
            f"GPUs; these NVSwitches are no PCI devices, so the facts cannot show them and only hardware.nvswitch "
            f"tells gpuprov to install both. Set nvswitch: true (or nvswitch: false where the NVSwitches are "
            f"managed outside this host)")


# ---------------------------------------------------------------------------------------------------- URLs

def url_problem(value: Any) -> str | None:
    """Why `value` is not an http:// or https:// URL with a host (no file://, no missing scheme, no spaces or
    quotes, a port from 1 to 65535, no IPv6 zone: a URL is reached from other machines too)."""
    from gpuprov.inventory.model import is_valid_address

    if isinstance(value, str) and not _URL_FORBIDDEN.search(value) and not _CONTROL.search(value):
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a bad port
            host = parts.hostname if parts.netloc else None
        except ValueError:  # a bad port, or a bad IPv6 literal ("http://[fe80::1/")
            parts, host = urlsplit(""), None
        if parts.scheme in ("http", "https") and host and is_valid_address(host, zone=False):
            return None
    return f"bad URL {value!r}: give an http:// or https:// URL with a host name"


# ------------------------------------------------------------------------------------------------- paths

def host_path_problem(value: Any, root: bool = True) -> str | None:
    """Why `value` is not an absolute path on a host gpuprov may put in a command or a mount: plain characters
    only (letters, digits, _ . + @ / -), no `..` part, and (unless `root`) not / itself."""
    if (isinstance(value, str) and _HOST_PATH.fullmatch(value) and "/../" not in f"{value}/"
            and (root or value.strip("/"))):
        return None
    other = "" if root else " other than /"
    return f"must be an absolute path{other} (letters, digits, _ . + @ / -), not {value!r}"


def path_text_problem(value: Any) -> str | None:
    """Why `value` cannot name a local path: not text, empty, or with a control character (a newline would
    forge lines in messages, reports and commands)."""
    if not isinstance(value, str) or not value.strip():
        return f"must be a path (a non-empty string), not {value!r}"
    if _CONTROL.search(value):
        return f"must be a path without control characters (a line break, a tab, NUL), not {value!r}"
    return None


def shared_folder_problem(folder: str) -> str | None:
    """Why a host folder root writes into and another program trusts (node_exporter's textfile folder) is
    refused: it is, or is under, a folder every user may write into, where another user could plant a file or
    swap one for a link."""
    top = next((top for top in WORLD_WRITABLE if folder == top or folder.startswith(top + "/")), None)
    return None if top is None else f"{folder} is under {top}, which every user may write into"


def output_file_problem(path: Path, create_parents: bool = True) -> str | None:
    """Why a file cannot be written at `path`: control characters in it, a folder (or a link to one), a pipe or
    a device there, a file where one of its folders should be, or (unless the writer creates them) a missing
    folder."""
    problem = path_text_problem(str(path))
    if problem:
        return problem
    if path.is_dir():
        return f"{path} is a folder, not a file"
    with contextlib.suppress(OSError):  # missing (or a broken link): written as a new file
        if not stat.S_ISREG(path.stat().st_mode):  # writing into a pipe waits for a reader forever
            return f"{path} is not a regular file (a device, a pipe or a socket)"
    parent = path.absolute().parent
    for folder in (parent, *parent.parents):
        if os.path.lexists(folder):
            if not folder.is_dir():
                return f"cannot write {path}: {folder} is a file, not a folder"
            if folder != parent and not create_parents:
                return f"cannot write {path}: the folder {parent} does not exist"
            return None
    return None


class NotRegular(OSError):
    """An input that is not a regular file, or is larger than its bound: `.reason` says which, in words."""

    def __init__(self, reason: str, size: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.size = size  # the file's size when it is over the bound


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them. Opened without blocking (a FIFO
    would wait for a writer forever) and checked on the opened file itself, so that a name switched to a pipe
    or a device (`/dev/zero`, a link to one) between a check and the read is never read. NotRegular for a
    pipe, a device, a socket, a folder or a file over `limit`; OSError (FileNotFoundError, ...) otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise NotRegular("is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular("is not a regular file (a device, a pipe or a socket)")
        if info.st_size > limit:
            raise NotRegular(f"has {info.st_size} bytes; gpuprov reads up to {limit} bytes here", info.st_size)
        os.set_blocking(fd, True)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:  # it grew past the bound while being read
            raise NotRegular(f"has more than {limit} bytes; gpuprov reads up to {limit} bytes here", limit - left)
        return b"".join(chunks)
    finally:
        os.close(fd)


def private_key_problem(data: bytes) -> str | None:
    """Why a file that should hold certificates or a public key is refused: it holds a private key (PEM or
    OpenSSH `-----BEGIN ... PRIVATE KEY-----`, or an armored OpenPGP secret key), which gpuprov would copy to
    every host."""
    if re.search(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----", data):
        return "holds a private key; give only the public part (certificates, or the exported public key)"
    return None
