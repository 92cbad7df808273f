"""User-given stack pins and GPU names, checked against gpuprov's data: the one place that owns these rules.

The inventory schema (`stack:` and `hardware.gpu`) and the resolver (`invoke stack.resolve`, `stack.lock`) both
call `stack_pin` and `gpu_model`, so a value one accepts the other accepts, and with the same normalized form.
A `PinError`'s text is the whole message (what is wrong and what is accepted), without the key path.
"""

from __future__ import annotations

import re
import unicodedata

from gpuprov.stack.data import minor_of, table, vkey

PIN_KEYS = ("cuda", "driver", "nccl", "ngc", "pytorch")
_WHAT = {"cuda": "CUDA version", "driver": "driver", "nccl": "NCCL version", "ngc": "NGC PyTorch tag",
         "pytorch": "PyTorch release"}
_BRANCH = re.compile(r"[0-9]+")
_DRIVER_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+")
_MINOR = re.compile(r"[0-9]+\.[0-9]+")
_PATCH = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
_SHOWN = 60   # characters of a bad value quoted back in a message


class PinError(ValueError):
    """A pin or GPU name that gpuprov's data does not know; str(exc) says what is accepted."""


def stack_pin(key: str, text: str) -> str:
    """`text` pinned under stack `key` (cuda, driver, nccl, ngc, pytorch), normalized: "R570" -> "570",
    "25.04-py3" -> "25.04", surrounding spaces dropped. PinError unless gpuprov's data has it."""
    if key not in PIN_KEYS:
        raise ValueError(f"stack_pin: unknown key {key!r}, not one of {', '.join(PIN_KEYS)}")
    if not isinstance(text, str):
        raise PinError(f"{_WHAT[key]} must be text such as {_EXAMPLE[key]}, not {_kind(text)}")
    value = text.strip()
    _refuse_foreign_digits(_WHAT[key], value)
    return _CHECKS[key](value)


def gpu_model(name: str) -> str:
    """The catalog key of a GPU named by catalog key, alias or nvidia-smi name (case-insensitive); PinError with
    the catalog's closest names otherwise."""
    from gpuprov.catalog import close_names, find, models

    if not isinstance(name, str):
        raise PinError(f"GPU model must be text such as H100-SXM, not {_kind(name)}")
    _refuse_foreign_digits("GPU model", name.strip())
    model = find(name)
    if model is not None:
        return model.key
    close = close_names(name)
    hint = f" (did you mean {', '.join(repr(n) for n in close)}?)" if close else ""
    raise PinError(f"unknown GPU model {_show(name.strip())}{hint}. Accepted: a catalog model "
                   f"({', '.join(models())}), one of its aliases, or the name nvidia-smi prints for it; "
                   "invoke stack.matrix --component gpus lists them all")


# ----------------------------------------------------------------------------------------------- per key

def _cuda(value: str) -> str:
    releases = table("cuda")["releases"]
    accepted = f"Accepted: {', '.join(releases)}, or an update of one such as 12.8.1"
    if _MINOR.fullmatch(value):
        if value in releases:
            return value
        raise PinError(f"unknown CUDA release {_show(value)}. {accepted}")
    if _PATCH.fullmatch(value):
        minor = minor_of(value)
        if minor not in releases:
            raise PinError(f"unknown CUDA release {minor} (in {_show(value)}). {accepted}")
        updates = releases[minor]["updates"]
        if value in updates:
            return value
        raise PinError(f"unknown CUDA update {_show(value)}. CUDA {minor} updates: {', '.join(updates)}")
    raise PinError(f"bad CUDA version {_show(value)}: give a release such as 12.8 or an update such as 12.8.1. "
                   f"{accepted}")


def _driver(value: str) -> str:
    text = value[1:] if value[:1] in ("R", "r") else value
    if _BRANCH.fullmatch(text):
        _published(text)
        return text
    if _DRIVER_VERSION.fullmatch(text):
        branch = text.split(".")[0]
        versions = _published(branch)
        if text in versions:
            return text
        raise PinError(f"NVIDIA never published {text} as far as gpuprov's data knows; published {branch} "
                       f"versions: {', '.join(versions)}; pin the branch ({branch}) or add the version to "
                       "gpuprov/data/drivers.yaml")
    raise PinError(f"bad driver version {_show(value)}: give a branch such as 570 (or R570) or a published "
                   f"version such as 570.148.08. Accepted branches: {', '.join(_pinnable_branches())}")


def _published(branch: str) -> list[str]:
    """The published versions of a driver branch; PinError for a branch gpuprov cannot pin."""
    rows = table("drivers")["branches"]
    if branch not in rows:
        raise PinError(f"unknown driver branch {_show(branch)}. Accepted: {', '.join(_pinnable_branches())} "
                       "(or R570, or a published version such as 570.148.08)")
    if not rows[branch]["versions"]:
        raise PinError(f"driver branch {branch} has no published version in gpuprov's data, so it cannot be "
                       f"installed. Accepted: {', '.join(_pinnable_branches())}; or add {branch}'s versions to "
                       "gpuprov/data/drivers.yaml")
    return list(rows[branch]["versions"])


def _pinnable_branches() -> list[str]:
    return [branch for branch, row in table("drivers")["branches"].items() if row["versions"]]


def _nccl(value: str) -> str:
    releases = sorted(table("nccl")["releases"], key=vkey)
    if _PATCH.fullmatch(value) and value in releases:
        return value
    if _MINOR.fullmatch(value) and any(r.startswith(value + ".") for r in releases):
        return value
    raise PinError(f"unknown NCCL version {_show(value)}. Accepted: {', '.join(releases)}, or a release such as "
                   "2.26 (its newest build)")


def _ngc(value: str) -> str:
    tag = value.lower().removesuffix("-py3")
    tags = table("ngc_pytorch")["tags"]
    if tag in tags:
        return tag
    raise PinError(f"unknown NGC PyTorch tag {_show(value)}. Accepted: {', '.join(tags)} (with or without -py3)")


def _pytorch(value: str) -> str:
    releases = table("pytorch_wheels")["releases"]
    if value in releases:
        return value
    raise PinError(f"unknown PyTorch release {_show(value)}. Accepted: {', '.join(releases)}")


_CHECKS = {"cuda": _cuda, "driver": _driver, "nccl": _nccl, "ngc": _ngc, "pytorch": _pytorch}
_EXAMPLE = {"cuda": '"12.8"', "driver": '"570"', "nccl": '"2.26"', "ngc": '"25.04"', "pytorch": '"2.7"'}


# ----------------------------------------------------------------------------------------------- helpers

def _refuse_foreign_digits(what: str, value: str) -> None:
    """Digits outside 0-9 ("５７０", "12.８", "²") look like numbers but are not; say so rather than "unknown"."""
    foreign = [ch for ch in value if not ch.isascii() and unicodedata.category(ch) in ("Nd", "No", "Nl")]
    if foreign:
        shown = ", ".join(repr(ch) for ch in dict.fromkeys(foreign))
        raise PinError(f"{what} {_show(value)} has digits that are not ASCII ({shown}); write it with the digits 0-9")


def _kind(value: object) -> str:
    """What a non-text value is, in YAML's words: "null", "a number", "a list"..."""
    kinds = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "a list",
             dict: "a mapping"}
    return kinds.get(type(value), type(value).__name__)


def _show(value: str) -> str:
    """A user value quoted for a message: repr (control characters escaped), long values cut."""
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")
