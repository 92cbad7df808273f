"""Lock files: `locks/<name>.lock.yaml` pins every package, the NGC tag and the PyTorch wheel of a stack, and the
images the hosts run (`images:`, by digest, with each image's minimum driver).

A lock that cannot be used raises `LockError` (exit 2) with every problem as `FILE:LINE:COL: key: message`;
the YAML is read with the inventory's reader, so places and key paths are found the same way.

A write that replaces a lock with a different stack keeps the replaced file, byte for byte, as
`<locks dir>/history/<name>.<UTC stamp>[.<n>].lock.yaml`; `invoke rollout --to-lock previous` takes the newest.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpuprov.core.errors import InputError, literal
from gpuprov.inventory.checks import NotRegular, read_regular
from gpuprov.inventory.diagnostics import show, type_name
from gpuprov.inventory.located import Located, YamlTextError, compose, decode

LOCK_VERSION = 1
MAX_LOCK_BYTES = 4 * 1024 * 1024  # a lock is a few kB; a larger file is not one
HEADER = """\
# gpuprov stack lock: exact versions for every host resolved from the inputs below.
# Review changes to this file like code. Provisioning installs exactly this stack and refuses to differ
# from it unless run with --update-lock. Re-create with: invoke stack.lock --group/--host NAME
"""
NEWER_PARTS = {"driver": "driver", "cuda": "cuda", "nccl": "nccl", "container_toolkit": "container toolkit",
               "dcgm": "dcgm"}
HISTORY = "history"  # the folder, inside the locks folder, of the versions a lock replaced
SUFFIX = ".lock.yaml"
_HISTORY_BASE_MAX = 255 - len(SUFFIX) - len(".20260101T000000Z") - len(".999999")  # a kept name fits NAME_MAX
_HINT = "restore the lock from version control, or re-create it with: invoke stack.lock --group/--host NAME"


class LockError(InputError):
    """A lock file that cannot be used; `.errors` holds every problem as `FILE:LINE:COL: key: message`."""

    def __init__(self, path: str | Path, errors: list[str]):
        self.errors = [literal(error) for error in errors]  # a key or path with a line break stays on its line
        message = self.errors[0] if len(self.errors) == 1 else (
            f"{literal(str(path))}: {len(self.errors)} errors:\n  " + "\n  ".join(self.errors))
        super().__init__(message, hint=_HINT)


def write_lock(path: str | Path, stack, inputs: dict, images: list[dict] | None = None) -> Path:
    """Write the lock atomically (temp file + rename); `stack` is a Stack or its dict; `images` as
    `{"name", "tag", "digest", "min_driver"}` (the section is left out when there are none)."""
    data = stack.to_dict() if hasattr(stack, "to_dict") else dict(stack)
    doc = {"lock_version": LOCK_VERSION, "inputs": dict(inputs), "stack": data}
    if images:
        doc["images"] = [dict(image) for image in images]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.")  # the name fits NAME_MAX
    kept = None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        kept = _keep_previous(path, data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        if kept is not None:  # the lock was not replaced: the copy of it is not history
            kept.unlink(missing_ok=True)
        raise
    return path


def load_lock(path: str | Path) -> dict:
    """{"lock_version", "inputs", "stack", "images"} from a lock file; LockError naming file, line, column and
    key."""
    from gpuprov.stack.resolve import Stack

    reader, doc = _read(Path(path))
    _validate(reader, doc)
    if reader.errors:
        raise LockError(path, [text for _, _, text in sorted(reader.errors)])
    Stack.from_dict(doc["stack"])
    doc.setdefault("inputs", {})
    doc.setdefault("images", [])
    return doc


def locate(path: str | Path, key: str) -> str:
    """`FILE:LINE:COL` of a key path such as `stack.driver.packages[0].version` (or of the nearest enclosing
    key the file has); just `FILE` when the file cannot be read."""
    try:
        reader, _ = _read(Path(path))
    except InputError:
        return str(path)
    line, col = reader.place(tuple(int(i) if i else k for k, i in re.findall(r"([^.\[\]]+)|\[(\d+)\]", key)))
    return f"{path}:{line}:{col}"


def package_key(lock: dict, name: str) -> str | None:
    """The key path of a package's version in a loaded lock (`stack.driver.packages[0].version`), or None."""
    stack = lock.get("stack", lock)
    for part in _parts(stack):
        for index, pkg in enumerate(stack[part]["packages"]):
            if pkg["name"] == name:
                return f"stack.{part}.packages[{index}].version"
    return None


# ---------------------------------------------------------------------------------------------- history

def lock_history(path: str | Path) -> list[Path]:
    """The kept versions of the lock at `path` (in `<its folder>/history`), newest first by the UTC stamp and
    number in their names (never by modification time)."""
    path = Path(path)
    pattern = re.compile(re.escape(_history_base(path)) + r"\.(\d{8}T\d{6}Z)(?:\.([1-9]\d*))?" + re.escape(SUFFIX))
    try:
        entries = list((path.parent / HISTORY).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [(match[1], int(match[2] or 0), entry) for entry in entries
             if (match := pattern.fullmatch(entry.name)) and entry.is_file()]
    return [entry for _, _, entry in sorted(found, reverse=True)]


def target_lock(value: str, governing: Path | None, locks_dir: Path) -> Path:
    """The lock `--to-lock VALUE` names, as an absolute path: `previous` (the newest kept version of the governing
    lock) or a lock file's path (relative to the current folder); loaded, so a corrupt one is a LockError (exit 2)."""
    if not str(value).strip():
        raise InputError("--to-lock is empty: give a lock file's path, or previous")
    if value != "previous":
        path = Path(value)
    elif governing is None:
        raise InputError(f"--to-lock previous: no lock in {locks_dir} governs these hosts, so there is no "
                         "previous one", hint="give --to-lock the path of the lock to roll out")
    else:
        kept = lock_history(governing)
        if not kept:
            raise InputError(f"--to-lock previous: {governing} has no earlier version in "
                             f"{Path(governing).parent / HISTORY}",
                             hint="history starts with the first --update-lock (or stack.lock) that replaces the "
                                  "lock after gpuprov began keeping it; give --to-lock the path of an older lock, "
                                  "e.g. one restored from version control")
        path = kept[0]
    load_lock(path)  # named as given: the error shows the path the operator typed
    return path.absolute()


def adopt_lock(source: str | Path, governing: str | Path) -> bool:
    """Make the lock at `source` the governing lock (written as write_lock writes, so the one it replaces is
    kept in history); False, and nothing written, when both already hold the same stack."""
    lock = load_lock(source)
    if _same_stack(_stack_at(Path(governing)), lock["stack"]):
        return False
    write_lock(governing, lock["stack"], lock["inputs"], lock["images"])
    return True


def _keep_previous(path: Path, stack: dict) -> Path | None:
    """Copy the lock at `path` (bytes and mode as they are) into history when `stack` differs from its stack
    (or it is not a readable lock); the copy's path, or None when nothing was kept. Never overwrites a copy."""
    try:
        data = read_regular(path, MAX_LOCK_BYTES)
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = exc.reason if isinstance(exc, NotRegular) else f"cannot read: {exc.strerror}"
        raise InputError(f"{path}: {reason}; not replaced, as the previous lock could not be kept",
                         hint=f"move {path} away, then write the lock again") from None
    if _same_stack(_stack_at(path), stack):
        return None
    folder = path.parent / HISTORY
    stamp = f"{_history_base(path)}.{_now().strftime('%Y%m%dT%H%M%SZ')}"
    try:
        folder.mkdir(exist_ok=True)
        fd, kept = _create_new(folder, stamp, mode)
    except OSError as exc:
        raise InputError(f"{folder}: cannot keep the previous lock there: {exc.strerror}; {path} not replaced",
                         hint=f"make {folder} a folder gpuprov can write, then write the lock again") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # the mode as it was, whatever the umask
            handle.write(data)
    except BaseException:
        kept.unlink(missing_ok=True)
        raise
    return kept


def _create_new(folder: Path, stamp: str, mode: int) -> tuple[int, Path]:
    """A new file `<stamp>[.<n>].lock.yaml` in `folder` (the first n free, none for the first) and its fd."""
    number = 0
    while True:
        kept = folder / f"{stamp}{f'.{number}' if number else ''}{SUFFIX}"
        try:
            return os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode), kept
        except FileExistsError:
            number += 1


def _history_base(path: Path) -> str:
    """The name a lock's kept versions start with: its file name less `.lock.yaml`, shortened with a hash when
    the kept names would not fit a file name (`~` is in no host or group name, so it names no other lock)."""
    name = path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) and path.name != SUFFIX else path.name
    if len(name.encode()) <= _HISTORY_BASE_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return name.encode()[:_HISTORY_BASE_MAX - 13].decode(errors="ignore") + "~" + digest


def _stack_at(path: Path) -> dict | None:
    """The stack of the lock at `path`, or None when there is none or it is not a usable lock."""
    try:
        return load_lock(path)["stack"]
    except InputError:
        return None


def _same_stack(old: dict | None, new: dict) -> bool:
    """Whether two stack sections are the same stack (a section an older lock lacks counts as null)."""
    from gpuprov.stack.resolve import Stack

    keys = (*Stack.REQUIRED, *Stack.OPTIONAL)
    return old is not None and {key: old.get(key) for key in keys} == {key: new.get(key) for key in keys}


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------- reading

def _read(path: Path) -> tuple[Located, Any]:
    """The document with every value's place; LockError when the file is missing or not YAML."""
    if not path.exists():
        raise InputError(f"lock file {path} does not exist", hint="create it with: invoke stack.lock")
    if not path.is_file():
        raise LockError(path, [f"{path}: not a file"])
    try:
        data = read_regular(path, MAX_LOCK_BYTES)  # checked on the opened file: no pipe or device is read
    except NotRegular as exc:
        raise LockError(path, [f"{path}: {exc.reason}"]) from None
    except OSError as exc:
        raise LockError(path, [f"{path}: cannot read: {exc.strerror}"]) from None
    reader = Located(path)
    root = _compose(path, data)
    if root is None:
        raise LockError(path, [f"{path}:1:1: (file): the file is empty"])
    return reader, reader.construct(root, (), 0)


def _compose(path: Path, data: bytes) -> yaml.Node | None:
    """The lock's node tree, read as inventories are (gpuprov.inventory.located: UTF-8, allowed characters,
    depth, a syntax error named where it was noticed and where its construct began); LockError otherwise."""
    try:
        return compose(decode(data))
    except YamlTextError as exc:
        raise LockError(path, [f"{path}:{exc.line}:{exc.col}: (file): {exc.message}"]) from None


# ------------------------------------------------------------------------------------------- validation

class _Nullable:
    """A value that may be null (fabricmanager on hosts without NVSwitch, an absent NGC tag)."""

    def __init__(self, spec):
        self.spec = spec


def _string(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"must be a string (quote it), not {show(value)}"
    return f"must be a non-empty string, not {type_name(value)}"


def _dotted(value: Any) -> str | None:
    problem = _string(value)
    if problem is None and not re.fullmatch(r"\d+(\.\d+)*", value):
        return f"bad version {show(value)}: expected digits and dots like \"570.148.08\""
    return problem


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices else f"must be one of {', '.join(choices)}, not {show(value)}"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, not {show(value)}"


def _mapping(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"must be a mapping, not {type_name(value)}"


def _lock_version(value: Any) -> str | None:
    if value == LOCK_VERSION and not isinstance(value, bool):
        return None
    return f"this gpuprov reads lock_version {LOCK_VERSION}, not {show(value)}"


def _package_word(which: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        from gpuprov.core.packages import Package

        problem = _string(value)
        if problem is not None:
            return problem
        try:
            if which == "name":
                Package(value, "0")
            else:
                Package("x", value)
        except InputError:
            return f"not a valid package {which}: {show(value)}"
        return None
    return check


def _digest(value: Any) -> str | None:
    problem = _string(value)
    if problem is None and not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
        return f"bad digest {show(value)}: expected sha256: and 64 hex digits"
    return problem


def _os_key(value: Any) -> str | None:
    from gpuprov.stack.data import OS_KEYS

    return _one_of(*OS_KEYS)(value)


_PACKAGES = [{"name": _package_word("name"), "version": _package_word("version")}]
_PART = {"version": _dotted, "packages": _PACKAGES}
_STACK = {
    "gpu": {"model": _string, "arch": _string, "compute_capability": _string, "datacenter": _boolean},
    "os": _os_key,
    "driver": {"branch": _string, "version": _dotted, "kernel_modules": _one_of("open", "proprietary"),
               "packages": _PACKAGES},
    "cuda": _PART, "forward_compat": _boolean, "nccl": _PART, "container_toolkit": _PART,
    "fabricmanager": _Nullable(_PART), "dcgm": _PART, "ngc_pytorch": _Nullable(_string),
    "pytorch": _Nullable({"version": _string, "wheel": _string}),
    "nscq": _Nullable(_PART), "nvlsm": _Nullable(_PART),
}
_IMAGES = [{"name": _string, "tag": _string, "digest": _digest, "min_driver": _Nullable(_dotted)}]
_LOCK = {"lock_version": _lock_version, "inputs": _mapping, "stack": _STACK, "images": _IMAGES}
# absent from older locks: inputs, and the NVSwitch sections added after the first locks were written; images
# only where stack.lock was given --image
_OPTIONAL = {("inputs",), ("stack", "nscq"), ("stack", "nvlsm"), ("images",)}


def _validate(reader: Located, doc: Any) -> None:
    """Record every problem of a lock document at its place: unknown YAML tags, then the shape."""
    for path, tag in reader.tagged.items():
        reader.error(path, f"unsupported YAML tag {tag!r}: a lock holds plain values only")
    if not isinstance(doc, dict):
        reader.error((), f"must be a mapping with lock_version, inputs and stack, not {type_name(doc)}")
        return
    for key in doc.keys() - _LOCK.keys():
        reader.error((key,), "unknown key; a lock has lock_version, inputs, stack and images", at_key=True)
    _walk(reader, doc, _LOCK, ())


def _walk(reader: Located, value: Any, spec, path: tuple) -> None:
    """Check `value` against `spec`: a mapping of required keys, a one-item list (a non-empty list of such
    items), a nullable spec or a leaf check returning a message."""
    if path in reader.tagged:
        return
    if isinstance(spec, _Nullable):
        if value is None:
            return
        spec = spec.spec
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            reader.error(path, f"must be a mapping, not {type_name(value)}")
            return
        for key, sub in spec.items():
            if key in value:
                _walk(reader, value[key], sub, (*path, key))
            elif (*path, key) not in _OPTIONAL:
                reader.error((*path, key), "missing")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            reader.error(path, f"must be a list, not {type_name(value)}")
        elif not value:
            reader.error(path, "must not be empty")
        for index, item in enumerate(value if isinstance(value, list) else []):
            _walk(reader, item, spec[0], (*path, index))
    elif (problem := spec(value)) is not None:
        reader.error(path, problem)


# ------------------------------------------------------------------------------------------- semantics

def _parts(stack: dict) -> list[str]:
    """The stack's sections that list packages (driver, cuda, ...), in the stack's order."""
    return [key for key, part in stack.items() if isinstance(part, dict) and "packages" in part]


def _flat(stack: dict) -> dict[str, str]:
    return {pkg["name"]: pkg["version"] for part in _parts(stack) for pkg in stack[part]["packages"]}


def drift(lock: dict, stack) -> list[str]:
    """How `stack` differs from the lock (a loaded lock doc or its stack dict); empty when identical."""
    locked = lock.get("stack", lock)
    new = stack.to_dict() if hasattr(stack, "to_dict") else stack
    out = []
    old_pkgs, new_pkgs = _flat(locked), _flat(new)
    for name in sorted(old_pkgs.keys() | new_pkgs.keys()):
        before, after = old_pkgs.get(name), new_pkgs.get(name)
        if before != after:
            out.append(f"package {name}: lock {before or 'absent'} -> now {after or 'absent'}")
    for key in ("os", "forward_compat", "ngc_pytorch", "pytorch"):
        if locked.get(key) != new.get(key):
            out.append(f"{key}: lock {locked.get(key)} -> now {new.get(key)}")
    for part in dict.fromkeys([*_parts(locked), *_parts(new)]):
        a, b = (locked.get(part) or {}), (new.get(part) or {})
        if a.get("version") != b.get("version"):
            out.append(f"{part} version: lock {a.get('version')} -> now {b.get('version')}")
    if (locked.get("driver") or {}).get("kernel_modules") != (new.get("driver") or {}).get("kernel_modules"):
        out.append(f"kernel modules: lock {locked['driver'].get('kernel_modules')} -> now "
                   f"{new['driver'].get('kernel_modules')}")
    return out


def newer_notice(lock: dict, resolved) -> str | None:
    """One line naming each component whose newly resolved version is higher than the lock's, or None."""
    from gpuprov.stack.data import vkey

    locked = lock.get("stack", lock)
    new = resolved.to_dict() if hasattr(resolved, "to_dict") else resolved
    newer = [f"{label} {locked[part]['version']} -> {new[part]['version']}" for part, label in NEWER_PARTS.items()
             if vkey(new[part]["version"]) > vkey(locked[part]["version"])]
    if not newer:
        return None
    return f"a newer stack exists: {', '.join(newer)}; run with --update-lock to move the lock"


def lock_path_for(host, locks_dir: Path) -> Path | None:
    """The lock file that governs a host: its own, else the first of its groups' that exists."""
    for name in (host.name, *host.groups):
        path = Path(locks_dir) / f"{name}.lock.yaml"
        if path.exists():
            return path
    return None


def _per_host(hosts, locks_dir: Path, part: str) -> dict:
    """{host name: `part` of its lock} for the hosts a lock governs, each lock file loaded once."""
    loaded: dict[Path, Any] = {}
    out = {}
    for host in hosts:
        path = lock_path_for(host, locks_dir)
        if path is not None:
            if path not in loaded:
                loaded[path] = load_lock(path)[part]
            out[host.name] = loaded[path]
    return out


def locked_images(hosts, locks_dir: Path) -> dict[str, list[dict]]:
    """{host name: the images its lock records} for the hosts a lock governs (LockError for a corrupt lock)."""
    return _per_host(hosts, locks_dir, "images")


def locks_for(hosts, locks_dir: Path) -> dict[str, dict]:
    """{host name: its lock's stack} for the hosts a lock governs, each lock file loaded once; a corrupt one
    is LockError (exit 2), found before any host is contacted."""
    return _per_host(hosts, locks_dir, "stack")
