"""The checks of a spec's plain fields. Each takes the document, the value and its key path, records a located
error for a bad value and returns INVALID, or returns the checked value. A number is read as it was written
(`ubuntu: 24.04` is "24.04", `cudnn: 9` is "9")."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprov.core.errors import literal
from gpuprov.images.model import PURPOSES, Healthcheck, User
from gpuprov.inventory.checks import MAX_SECONDS, NotRegular, duration_problem, private_key_problem, read_regular
from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.levels import INVALID, known_keys
from gpuprov.inventory.located import Located
from gpuprov.stack.inputs import PinError, gpu_model

NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")          # one component of a Docker repository name
APT_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")              # Debian Policy 5.6.1
DEB_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
PIP_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")   # PEP 508
PIP_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
                         r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?")   # PEP 440, public and local versions
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
DURATION = re.compile(r"[0-9]+[smh]")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MAX_NAME = 64
MAX_CA_BYTES = 1024 * 1024
MAX_ID = 2**31 - 1
HEALTHCHECK_KEYS = ("test", "interval", "timeout", "start_period", "retries")
USER_KEYS = ("name", "uid", "gid")
# Debian and Ubuntu packages that depend on others at exactly their own version (`(= ${binary:Version})` in
# python3-defaults' debian/control; `apt-cache show python3` prints them). Pinning one without those would let apt
# take the newer ones from the release's -updates, which the pinned one refuses: the build breaks at the next
# point release. A spec pins the family together: each package here with every package it names, at one version
# (the release's own pocket keeps that version installable).
EXACT_DEPENDS = {
    "python3": ("python3-minimal", "libpython3-stdlib"),
    "python3-venv": ("python3",),
    "python3-dev": ("python3", "libpython3-dev"),
    "python3-full": ("python3", "python3-venv"),
    "python3-dbg": ("python3", "libpython3-dbg"),
    "python3-nopie": ("python3",),
    "python3-all": ("python3",),
}
# set by gpuprov from the image's CUDA (the NVIDIA container contract), or by the image's Python
RESERVED_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA", "PATH",
                "VIRTUAL_ENV")


def text(doc: Located, value: Any, path: tuple, what: str, example: str) -> Any:
    """A value as text: a string with no control characters, or a number as it was written."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return doc.raw.get(path, str(value))
    if isinstance(value, str) and value.strip() and literal(value) == value:
        return value.strip()
    doc.error(path, f"{what} must be text such as {example}, not {_what(value)}")
    return INVALID


def label_text(doc: Located, value: Any, path: tuple, what: str, example: str) -> Any:
    """Text that goes into an ENV or LABEL value: no backslash, which Docker and Dockerfile tools (hadolint) read
    differently inside quotes."""
    checked = text(doc, value, path, what, example)
    if checked is not INVALID and "\\" in checked:
        doc.error(path, f"{what} {show(checked)} has a backslash: write it without one (Docker and Dockerfile "
                        "linters read a backslash in a quoted value differently)")
        return INVALID
    return checked


def name(doc: Located, value: Any, path: tuple) -> Any:
    if isinstance(value, str) and NAME.fullmatch(value) and len(value) <= MAX_NAME:
        return value
    doc.error(path, f"bad image name {show(value)}: lower-case letters, digits and single '.', '_' or '-' "
                    f"between them, at most {MAX_NAME} characters (a Docker repository name)")
    return INVALID


def purpose(doc: Located, value: Any, path: tuple) -> Any:
    if value in PURPOSES:
        return value
    doc.error(path, f"bad purpose {show(value)}: give {' or '.join(PURPOSES)}{suggest(value, PURPOSES)}")
    return INVALID


def description(doc: Located, value: Any, path: tuple) -> Any:
    return label_text(doc, value, path, "description", "'PyTorch for multi-GPU training'")


def gpus(doc: Located, value: Any, path: tuple) -> Any:
    """The GPU models the image is for: catalog names, checked against the image's CUDA and PyTorch wheel."""
    if not isinstance(value, list) or not value:
        doc.error(path, f"gpus must be a non-empty list of GPU models such as [H100-SXM, L40S], not {_what(value)}")
        return INVALID
    models, ok = [], True
    for i, item in enumerate(value):
        try:
            model = gpu_model(item)
        except PinError as exc:
            doc.error((*path, i), str(exc))
            ok = False
            continue
        if model in models:
            doc.error((*path, i), f"{model} is listed twice")
            ok = False
        models.append(model)
    return tuple(models) if ok else INVALID


def apt(doc: Located, value: Any, path: tuple) -> Any:
    """`{package: version}`, every package pinned to a Debian version, and with it (at that version) every package
    it depends on at exactly its own version (EXACT_DEPENDS)."""
    pins = _pins(doc, value, path, "apt", APT_NAME, DEB_VERSION,
                 lambda pkg: f"apt-cache policy {pkg} lists its versions", "Debian package name")
    if pins is INVALID:
        return INVALID
    pinned, ok = dict(pins), True
    for package, version in pins:
        family = _exact_family(package)
        wrong = [name for name in family if pinned.get(name) != version]
        if wrong:
            doc.error((*path, package), f"{package} {version} depends on {_listed(family)} at exactly its version: "
                                        f"pin {_listed(wrong)} to {version} too (else apt takes a newer one "
                                        "from the release's updates, which this pin refuses, and the build breaks)",
                      at_key=True)
            ok = False
    return pins if ok else INVALID


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _exact_family(package: str) -> list[str]:
    """Every package `package` needs at exactly its own version, directly or through another (EXACT_DEPENDS)."""
    found: list[str] = []
    todo = list(EXACT_DEPENDS.get(package, ()))
    while todo:
        name = todo.pop(0)
        if name not in found:
            found.append(name)
            todo += EXACT_DEPENDS.get(name, ())
    return found


def pip(doc: Located, value: Any, path: tuple) -> Any:
    """`{package: version}`, every package pinned to a release (`name==version`)."""
    pins = _pins(doc, value, path, "pip", PIP_NAME, PIP_VERSION,
                 lambda pkg: f"pip index versions {pkg} lists its releases", "Python package name")
    if pins is INVALID:
        return INVALID
    for package, _ in pins:
        if package.lower() == "torch":
            doc.error((*path, package), "torch comes from the spec's pytorch: (or the NGC tag): remove it from pip",
                      at_key=True)
            return INVALID
    return pins


def _pins(doc: Located, value: Any, path: tuple, what: str, name_re: re.Pattern, version_re: re.Pattern,
          listing: Callable[[str], str], kind: str) -> Any:
    if value is None:
        return ()
    if not isinstance(value, dict):
        doc.error(path, f"{what} must be a mapping of package: version, not {_what(value)}")
        return INVALID
    pins, ok = [], True
    for package, version in value.items():
        kpath = (*path, package)
        if not name_re.fullmatch(package):
            doc.error(kpath, f"bad {kind} {show(package)}", at_key=True)
            ok = False
            continue
        if version is None or version == "":
            doc.error(kpath, f"unpinned {what} package {package!r}: give its version ({listing(package)})",
                      at_key=True)
            ok = False
            continue
        shown = text(doc, version, kpath, f"the version of {package}", '"1.2-3"')
        if shown is INVALID:
            ok = False
        elif not version_re.fullmatch(shown):
            doc.error(kpath, f"bad version {show(shown)} for {what} package {package!r} ({listing(package)})")
            ok = False
        else:
            pins.append((package, shown))
    return tuple(pins) if ok else INVALID


def user(doc: Located, value: Any, path: tuple) -> Any:
    """The non-root user jobs run as: `{name, uid, gid}` (gid defaults to uid)."""
    if not isinstance(value, dict):
        doc.error(path, f"user must be a mapping like {{name: gpuprov, uid: 1000}}, not {_what(value)}")
        return INVALID
    known_keys(doc, value, path, USER_KEYS, "user")
    ok = all(key in USER_KEYS for key in value)
    for key in ("name", "uid"):
        if key not in value:
            doc.error(path, f"user needs {key}")
            ok = False
    login = value.get("name")
    if "name" in value and (not isinstance(login, str) or not USER_NAME.fullmatch(login) or login == "root"):
        why = "the image's user must not be root" if login == "root" else (
            "lower-case letters, digits, '_' and '-', starting with a letter or '_', at most 32")
        doc.error((*path, "name"), f"bad user name {show(login)}: {why}")
        ok = False
    ids = {key: _id(doc, value[key], (*path, key)) for key in ("uid", "gid") if key in value}
    if not ok or INVALID in ids.values():
        return INVALID
    return User(login, ids["uid"], ids.get("gid", ids["uid"]))


def _id(doc: Located, value: Any, path: tuple) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ID:
        return value
    why = " (0 is root: the image's user must not be root)" if value == 0 and not isinstance(value, bool) else ""
    doc.error(path, f"expected a whole number from 1 to {MAX_ID}, not {show(value)}{why}")
    return INVALID


def env(doc: Located, value: Any, path: tuple) -> Any:
    """`{NAME: value}`: the settings jobs on multi-GPU hosts need (NCCL, PyTorch)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        doc.error(path, f"env must be a mapping of NAME: value, not {_what(value)}")
        return INVALID
    pairs, ok = [], True
    for key, item in value.items():
        kpath = (*path, key)
        if not ENV_NAME.fullmatch(key):
            doc.error(kpath, f"bad environment variable name {show(key)}: letters, digits and '_'", at_key=True)
            ok = False
        elif key in RESERVED_ENV:
            doc.error(kpath, f"{key} is set by gpuprov (the NVIDIA contract from the image's CUDA, and the "
                             "image's Python): remove it", at_key=True)
            ok = False
        elif isinstance(item, bool) or item is None:
            doc.error(kpath, f"the value of {key} must be text or a number, not {type_name(item)} "
                             f"(quote it: {key}: \"...\")")
            ok = False
        else:
            checked = label_text(doc, item, kpath, f"the value of {key}", '"1"') if item != "" else ""
            ok = ok and checked is not INVALID
            pairs.append((key, checked))
    return tuple(pairs) if ok else INVALID


def ports(doc: Located, value: Any, path: tuple) -> Any:
    if not isinstance(value, list) or not value:
        doc.error(path, f"ports must be a non-empty list of TCP ports such as [8000], not {_what(value)}")
        return INVALID
    out, ok = [], True
    for i, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool) or not 1 <= item <= 65535:
            doc.error((*path, i), f"bad port {show(item)}: a whole number from 1 to 65535")
            ok = False
        elif item in out:
            doc.error((*path, i), f"port {item} is listed twice")
            ok = False
        else:
            out.append(item)
    return tuple(out) if ok else INVALID


def healthcheck(doc: Located, value: Any, path: tuple) -> Any:
    """`{test: [argv...], interval, timeout, start_period, retries}` (Docker's HEALTHCHECK options)."""
    if not isinstance(value, dict):
        doc.error(path, f"healthcheck must be a mapping with test: [command, args...], not {_what(value)}")
        return INVALID
    known_keys(doc, value, path, HEALTHCHECK_KEYS, "healthcheck")
    ok = all(key in HEALTHCHECK_KEYS for key in value)
    if "test" not in value:
        doc.error(path, "healthcheck needs test: the command that exits 0 when the container is healthy")
        return INVALID
    test = command(doc, value["test"], (*path, "test"))
    options = {}
    for key in ("interval", "timeout", "start_period"):
        if key in value:
            item = value[key]
            low = 0 if key == "start_period" else 1
            if isinstance(item, str) and DURATION.fullmatch(item) and duration_problem(
                    int(item[:-1]) * UNIT_SECONDS[item[-1]], low) is None:
                options[key] = item
            else:
                doc.error((*path, key), f"bad duration {show(item)}: a whole number of s, m or h, like 30s, from "
                                        f"{low}s to {MAX_SECONDS // 3600}h")
                ok = False
    if "retries" in value:
        retries = value["retries"]
        if isinstance(retries, int) and not isinstance(retries, bool) and 1 <= retries <= 100:
            options["retries"] = retries
        else:
            doc.error((*path, "retries"), f"bad retries {show(retries)}: a whole number from 1 to 100")
            ok = False
    return Healthcheck(test, **options) if ok and test is not INVALID else INVALID


def command(doc: Located, value: Any, path: tuple) -> Any:
    """A command as a list of arguments (Docker's exec form: no shell in between)."""
    if not isinstance(value, list) or not value:
        doc.error(path, f"a command must be a non-empty list of arguments like [python3, -c, ...], not {_what(value)}")
        return INVALID
    args = [item if item == "" else text(doc, item, (*path, i), "an argument", "python3")
            for i, item in enumerate(value)]
    for i, item in enumerate(args):
        # Docker reads ["x\\"] as JSON, hadolint (and other Dockerfile readers) take the `\"` for an escaped quote
        # and the whole CMD for the shell form
        if isinstance(item, str) and item.endswith("\\"):
            doc.error((*path, i), f"an argument ending in a backslash ({show(item)}): Dockerfile readers such as "
                                  "hadolint take it for an escaped quote; put the command in a script")
            args[i] = INVALID
    return INVALID if INVALID in args else tuple(args)


def digest(doc: Located, value: Any, path: tuple) -> Any:
    if isinstance(value, str) and DIGEST.fullmatch(value):
        return value
    doc.error(path, f"bad digest {show(value)}: give sha256: and 64 lower-case hex digits (docker buildx "
                    "imagetools inspect IMAGE, or docker inspect --format '{{index .RepoDigests 0}}' IMAGE, shows it)")
    return INVALID


def ca_file(doc: Located, value: Any, path: tuple, folder: Path) -> Any:
    """An extra CA certificate (PEM), relative to the spec's folder: a regular file of at most MAX_CA_BYTES
    with a certificate and no private key (it is copied into the image)."""
    if not isinstance(value, str) or not value.strip() or literal(value) != value:
        doc.error(path, f"ca_file must be the path of a PEM certificate, not {_what(value)}")
        return INVALID
    resolved = Path(value).expanduser()
    resolved = resolved if resolved.is_absolute() else folder / resolved
    try:
        data = read_regular(resolved, MAX_CA_BYTES)
    except (FileNotFoundError, NotRegular) as exc:
        why = exc.reason if isinstance(exc, NotRegular) else "is not a file"
        doc.error(path, f"ca_file {resolved} {why} (relative paths are relative to the spec's folder)")
        return INVALID
    except OSError as exc:
        doc.error(path, f"ca_file {resolved} cannot be read: {exc.strerror}")
        return INVALID
    if b"-----BEGIN CERTIFICATE-----" not in data:
        doc.error(path, f"ca_file {resolved} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        return INVALID
    problem = private_key_problem(data)
    if problem:
        doc.error(path, f"ca_file {resolved} {problem}")
        return INVALID
    return resolved


def _what(value: Any) -> str:
    """A bad value in a message: its text for a string, else what kind of value it is."""
    return show(value) if isinstance(value, str) else type_name(value)
