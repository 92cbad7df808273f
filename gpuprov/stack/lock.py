"""Lock files: `locks/<name>.lock.yaml` pins every package, the NGC tag and the PyTorch wheel of a stack."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from gpuprov.errors import InputError

LOCK_VERSION = 1
HEADER = """\
# gpuprov stack lock: exact versions for every host resolved from the inputs below.
# Review changes to this file like code. Provisioning installs exactly this stack and refuses to differ
# from it unless run with --update-lock. Re-create with: invoke stack.lock --group/--host NAME
"""


def write_lock(path: str | Path, stack, inputs: dict) -> Path:
    """Write the lock atomically (temp file + rename); `stack` is a Stack or its dict."""
    data = stack.to_dict() if hasattr(stack, "to_dict") else dict(stack)
    doc = {"lock_version": LOCK_VERSION, "inputs": dict(inputs), "stack": data}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_lock(path: str | Path) -> dict:
    """{"lock_version", "inputs", "stack"} from a lock file; InputError naming the file when it is unusable."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"lock file {path} does not exist", hint="create it with invoke stack.lock") from None
    except yaml.YAMLError as exc:
        raise InputError(f"lock file {path} is not valid YAML: {exc}", hint="restore it from version control") from None
    if not isinstance(doc, dict) or doc.get("lock_version") != LOCK_VERSION or not isinstance(doc.get("stack"), dict):
        raise InputError(f"lock file {path} is not a gpuprov lock (version {LOCK_VERSION})",
                         hint="re-create it with invoke stack.lock")
    from gpuprov.stack.resolve import Stack

    Stack.from_dict(doc["stack"])
    doc.setdefault("inputs", {})
    return doc


def _flat(stack: dict) -> dict[str, str]:
    out = {}
    for part in ("driver", "fabricmanager", "cuda", "nccl", "container_toolkit", "dcgm"):
        for pkg in (stack.get(part) or {}).get("packages", []):
            out[pkg["name"]] = pkg["version"]
    return out


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
    for part in ("driver", "cuda", "nccl", "container_toolkit", "dcgm", "fabricmanager"):
        a, b = (locked.get(part) or {}), (new.get(part) or {})
        if a.get("version") != b.get("version"):
            out.append(f"{part} version: lock {a.get('version')} -> now {b.get('version')}")
    if (locked.get("driver") or {}).get("kernel_modules") != (new.get("driver") or {}).get("kernel_modules"):
        out.append(f"kernel modules: lock {locked['driver'].get('kernel_modules')} -> now "
                   f"{new['driver'].get('kernel_modules')}")
    return out


def lock_path_for(host, locks_dir: Path) -> Path | None:
    """The lock file that governs a host: its own, else the first of its groups' that exists."""
    for name in (host.name, *host.groups):
        path = Path(locks_dir) / f"{name}.lock.yaml"
        if path.exists():
            return path
    return None
