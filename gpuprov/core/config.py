"""gpuprov's settings: defaults, overridden by `invoke.yaml` and INVOKE_GPUPROV_* variables, validated once.

Invoke reads its config files (/etc/invoke.yaml, ~/.invoke.yaml, the project's invoke.yaml, a runtime file
given with -f) and INVOKE_* variables itself and merges them. `settings(c)` checks every source Invoke read
before a task does anything: each problem is `FILE:LINE:COL: gpuprov.KEY: message` for a file,
`INVOKE_GPUPROV_KEY: message` for a variable, and all of them together are one `ConfigError` (exit 2).
`check_sources` runs the same checks on files Invoke is about to read, so that a file Invoke would crash on
(broken YAML, a list, `gpuprov: 3`) is a located error instead of a traceback.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invoke.util import yaml  # the YAML library Invoke reads its config files with (a vendored PyYAML)

from gpuprov.core.errors import InputError, literal

DEFAULTS: dict = {
    "inventory": "inventories/lab.yaml",
    "parallel": 32,
    "connect_timeout": 10,
    "connect_retries": 2,
    "command_timeout": 1800,
    "confirm_timeout": 60,
    "known_hosts": "~/.ssh/known_hosts",
    "ssh_config": "~/.ssh/config",
    "reports": "reports",
    "locks": "locks",
    "wheelhouse": "build/wheelhouse",
}
ENV_PREFIX = "INVOKE_GPUPROV_"
# Invoke's config file names, in the order it tries them; the first that exists is the one it reads.
FILE_SUFFIXES = ("yaml", "yml", "json", "py")
_WHOLE_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class _Kind:
    """What a setting accepts: a path, or a whole number with a minimum."""

    accepts: str
    minimum: int | None = None  # None: a path
    maximum: int | None = None
    why: str = ""  # what the maximum protects
    off: bool = False  # a path that '' or false turns off


# gpuprov.inventory.checks.MAX_SECONDS, written out: importing it would load the inventory package with every task
MAX_SECONDS = 366 * 24 * 3600
MAX_CONNECT_TIMEOUT = 3600
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_CONFIRM_TIMEOUT = 86400
_PATH = _Kind("a path (a non-empty string)")
_OPTIONAL_PATH = _Kind("a path, or '' or false for none", off=True)
KINDS: dict[str, _Kind] = {
    "inventory": _PATH,
    "parallel": _Kind("a whole number >= 1", 1, 4096, "a thread and an SSH connection each"),
    "connect_timeout": _Kind("a whole number of seconds >= 1", 1, MAX_CONNECT_TIMEOUT,
                             "an hour: a host that has not answered by then will not"),
    "connect_retries": _Kind("a whole number >= 0 (0: no retry)", 0, 100, "each retry waits the connect timeout"),
    "command_timeout": _Kind("a whole number of seconds >= 1", 1, MAX_SECONDS,
                             "a year: what Python's timers hold, with room"),
    "confirm_timeout": _Kind("a whole number of seconds >= 15", 15, MAX_CONFIRM_TIMEOUT,
                             "a day: the firewall guard's revert timer should fire while someone still waits"),
    "known_hosts": _PATH,
    "ssh_config": _OPTIONAL_PATH,
    "reports": _PATH,
    "locks": _PATH,
    "wheelhouse": _PATH,
}


@dataclass(frozen=True)
class GpuprovConfig:
    """The validated gpuprov settings; paths with `~` and environment variables expanded."""

    inventory: Path
    parallel: int
    connect_timeout: int
    connect_retries: int
    command_timeout: int
    confirm_timeout: int
    known_hosts: Path
    ssh_config: Path | None   # OpenSSH's client config (gpuprov.inventory.ssh_config); None: turned off
    reports: Path
    locks: Path
    wheelhouse: Path


class ConfigError(InputError):
    """Bad gpuprov settings; `.errors` holds every problem, one line each."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        message = self.errors[0] if len(self.errors) == 1 else (
            f"{len(self.errors)} errors in the gpuprov settings:\n  " + "\n  ".join(self.errors))
        super().__init__(message)


# ------------------------------------------------------------------------------------------ what tasks use

def settings(c) -> GpuprovConfig:
    """The gpuprov settings of an Invoke context, after checking every file and variable Invoke read and the
    merged values (overrides included); ConfigError (exit 2) with every problem otherwise."""
    config = c.config if c is not None else None
    errors = source_errors(loaded_files(config), os.environ)
    section = _merged_section(config)
    if not errors:
        errors = [f"gpuprov.{_show_key(key)}: {message}" for key, message, _ in _section_problems(section)]
    if errors:
        raise ConfigError(errors)
    values = {key: section.get(key, default) for key, default in DEFAULTS.items()}
    return GpuprovConfig(**{key: _value(KINDS[key], value) for key, value in values.items()})


def path_setting(c, key: str) -> Path | None:
    """One validated path setting (inventory, known_hosts, ssh_config, reports, locks, wheelhouse), `~` and $VARS
    expanded; None for ssh_config turned off."""
    return getattr(settings(c), key)


def check_sources(files: Iterable[Path], environ: Mapping[str, str]) -> None:
    """ConfigError (exit 2) when a config file or an INVOKE_GPUPROV_* variable is bad: run before Invoke reads
    them, as Invoke itself crashes on some bad files."""
    errors = source_errors(files, environ)
    if errors:
        raise ConfigError(errors)


def config_file(stem: str | Path) -> Path | None:
    """The config file Invoke reads for a stem (`/etc/invoke`, `~/.invoke`, `PROJECT/invoke`): the first of
    .yaml, .yml, .json and .py that exists."""
    for suffix in FILE_SUFFIXES:
        path = Path(os.path.expanduser(f"{stem}.{suffix}"))
        if os.path.lexists(path):
            return path
    return None


def loaded_files(config) -> list[Path]:
    """The config files an Invoke Config has read (system, user, project, runtime), in merge order."""
    files = []
    for level in ("system", "user", "project", "runtime"):
        # Invoke keeps these on the Config as _LEVEL_found / _LEVEL_path (no public accessor)
        if config is not None and getattr(config, f"_{level}_found", None):
            files.append(Path(getattr(config, f"_{level}_path")))
    return files


def source_errors(files: Iterable[Path], environ: Mapping[str, str]) -> list[str]:
    """Every problem in the given config files and in the INVOKE_GPUPROV_* variables."""
    errors = []
    for path in files:
        errors += file_errors(path)
    return errors + env_errors(environ)


# ------------------------------------------------------------------------------------------------- values

def _problem(key: str, value: Any) -> str | None:
    """Why a value cannot be the setting `key`, saying what it accepts; None when it can."""
    kind = KINDS[key]
    if kind.off and (value is False or value == ""):
        return None
    if kind.minimum is None and isinstance(value, str) and value.strip() != "":
        from gpuprov.inventory.checks import path_text_problem

        problem = path_text_problem(value)
        return None if problem is None else problem.replace("must be a path", "must be a path (a non-empty string)")
    if kind.minimum is None:
        ok = False
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= kind.minimum
    if ok and kind.maximum is not None and value > kind.maximum:
        return f"must be at most {kind.maximum} ({kind.why}), not {_show(value)}"
    if ok:
        return None
    if kind.minimum is not None and isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value.strip()):
        advice = " (a string: write the number without quotes)"
    elif kind.minimum is None and isinstance(value, int | float) and not isinstance(value, bool):
        advice = " (a number: quote it to use it as a path)"
    else:
        advice = ""
    return f"must be {kind.accepts}, not {_show(value)}{advice}"


def _unknown(name: str, known: Iterable[str], spell=lambda key: key) -> str:
    close = difflib.get_close_matches(name.lower(), list(known), n=1)
    guess = f" (did you mean {spell(close[0])}?)" if close else ""
    return f"unknown setting{guess}; gpuprov reads: {', '.join(spell(key) for key in known)}"


def _section_problems(section: Mapping) -> list[tuple[Any, str, bool]]:
    """(key, message, whether the key itself is wrong) for every unknown key or bad value of a gpuprov
    section."""
    problems = []
    for key, value in section.items():
        if key not in KINDS:
            problems.append((key, _unknown(str(key), KINDS), True))
        elif (problem := _problem(key, value)) is not None:
            problems.append((key, problem, False))
    return problems


def _merged_section(config) -> dict:
    if config is None:
        return {}
    section = config.get("gpuprov", None)
    return dict(section) if isinstance(section, Mapping) else {}


def _expand(value: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(value)))


def _value(kind: _Kind, value: Any) -> Any:
    """A checked setting as tasks use it: a path expanded (None for one turned off), a number as it is."""
    if kind.minimum is not None:
        return value
    return None if kind.off and value in (False, "") else _expand(value)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    return literal(repr(value))


def _show_key(key: Any) -> str:
    return literal(key) if isinstance(key, str) else _show(key)


# ------------------------------------------------------------------------------------------- environment

def env_errors(environ: Mapping[str, str]) -> list[str]:
    """`INVOKE_GPUPROV_KEY: message` for every such variable that names no setting or holds a bad value."""
    errors = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key not in KINDS:
            errors.append(f"{literal(name)}: {_unknown(key, KINDS, lambda k: ENV_PREFIX + k.upper())}")
            continue
        text = environ[name]
        value: Any = text
        if KINDS[key].minimum is not None and _WHOLE_NUMBER.fullmatch(text.strip()):
            value = int(text.strip())
        problem = _problem(key, value)
        if problem is not None:
            errors.append(f"{name}: {problem}")
    return errors


# ------------------------------------------------------------------------------------------------- files

def file_errors(path: Path) -> list[str]:
    """Every problem in one Invoke config file, located where the format allows (YAML): what Invoke cannot
    read or merge, the shape of its own sections, and each gpuprov key. invoke.py is checked once merged."""
    name = literal(str(path))
    if path.suffix == ".py":
        return []
    if path.suffix.lstrip(".") not in FILE_SUFFIXES:
        return [f"{name}: Invoke reads config files named *.yaml, *.yml, *.json or *.py"]
    if not path.exists():
        return [f"{name}: no such config file"]
    if not path.is_file():
        return [f"{name}: not a file"]
    from gpuprov.inventory.checks import NotRegular, read_regular

    try:
        data = read_regular(path, MAX_CONFIG_BYTES)  # checked on the opened file: no pipe or device is read
    except NotRegular as exc:
        return [f"{name}: {exc.reason}"]
    except OSError as exc:
        return [f"{name}: cannot read: {exc.strerror}"]
    try:
        text = _text(data)
        doc, marks = _read_json(text) if path.suffix == ".json" else _read_yaml(text)
    except _Unreadable as exc:
        return [f"{name}:{exc.line}:{exc.col}: (file): {exc.message}"]
    return _document_errors(doc, _Places(name, marks))


class _Unreadable(Exception):
    """A config file Invoke cannot parse: where and why."""

    def __init__(self, line: int, col: int, message: str):
        super().__init__(message)
        self.line, self.col, self.message = line, col, message


_KEY = object()  # in a mark's key path: the place of the key itself rather than of its value


@dataclass(frozen=True)
class _Places:
    """Error lines for one file: `FILE:LINE:COL: KEY: message`, or `FILE: KEY: message` without a mark."""

    name: str
    marks: dict[tuple, tuple[int, int]]

    def error(self, path: tuple, message: str, at_key: bool = False) -> str:
        mark = self.marks.get((*path, _KEY) if at_key else path)
        where = f"{self.name}:{mark[0]}:{mark[1]}" if mark else self.name
        return f"{where}: {'.'.join(_show_key(key) for key in path) or '(top level)'}: {message}"


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")  # as Invoke opens it; PyYAML drops one leading BOM itself
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise _Unreadable(line, exc.start - data.rfind(b"\n", 0, exc.start), "not UTF-8 text") from None


def _read_json(text: str) -> tuple[Any, dict]:
    import json

    try:
        return json.loads(text), {}
    except json.JSONDecodeError as exc:
        raise _Unreadable(exc.lineno, exc.colno, f"JSON syntax error: {exc.msg}") from None
    except RecursionError:
        raise _Unreadable(1, 1, "the JSON is nested too deeply") from None


def _read_yaml(text: str) -> tuple[Any, dict]:
    """The document as Invoke's yaml.safe_load builds it, and the place of every mapping key and value."""
    loader = root = None
    try:
        loader = yaml.SafeLoader(text)
        root = loader.get_single_node()
        doc = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        raise _syntax(exc, text) from None
    except yaml.reader.ReaderError as exc:
        line = text[:exc.position].count("\n") + 1
        raise _Unreadable(line, exc.position - text.rfind("\n", 0, exc.position),
                          f"character {chr(exc.character)!r} is not allowed in YAML") from None
    except yaml.YAMLError as exc:
        raise _Unreadable(1, 1, f"YAML error: {literal(str(exc))}") from None
    except RecursionError:
        raise _Unreadable(1, 1, "the YAML is nested too deeply") from None
    except Exception as exc:  # noqa: BLE001 - a tagged scalar PyYAML cannot build (`!!int x`, `!!int ''`)
        mark = (_unbuildable(root) or root).start_mark
        raise _Unreadable(mark.line + 1, mark.column + 1,
                          f"cannot read the YAML: {literal(str(exc) or type(exc).__name__)}") from None
    finally:
        if loader is not None:
            loader.dispose()
    marks: dict = {}
    if root is not None:
        _mark(root, (), marks)
    return doc, marks


def _syntax(exc: yaml.MarkedYAMLError, text: str) -> _Unreadable:
    """A YAML error at the place the parser noticed it, naming where the construct it was reading began; a tab
    where YAML wants indentation is named as a tab."""
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    rows = text.split("\n", line) if mark else []
    row = rows[line - 1] if len(rows) >= line else ""  # the parser may stop past the last line
    if row[col - 1:col] == "\t":
        return _Unreadable(line, col, "YAML syntax error: a tab character; YAML indents with spaces, not tabs: "
                                      "replace the tab with spaces")
    problem = literal(exc.problem or "bad YAML")
    began = exc.context_mark
    if exc.context and began is not None and (began.line, began.column) != (line - 1, col - 1):
        problem += f" ({literal(exc.context)} at line {began.line + 1}, column {began.column + 1})"
    elif exc.context:
        problem = f"{literal(exc.context)}: {problem}"
    what = "cannot read the YAML" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
    return _Unreadable(line, col, f"{what}: {problem}")


def _mark(node: yaml.Node, path: tuple, marks: dict) -> None:
    """Record the line and column of a node and, through mappings, of every key and value under it (the last
    of equal keys wins, as in the document: a key after a `<<:` merge overrides the merged one)."""
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            marks[(*path, key, _KEY)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _mark(value_node, (*path, key), marks)


def _unbuildable(node: yaml.Node | None) -> yaml.Node | None:
    """The first scalar under a node that PyYAML cannot build."""
    if isinstance(node, yaml.ScalarNode):
        try:
            _scalar(node)
        except Exception:  # noqa: BLE001 - whatever PyYAML's constructor raises
            return node
        return None
    children = node.value if isinstance(node, yaml.SequenceNode) else [
        part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else []
    return next((found for child in children if (found := _unbuildable(child)) is not None), None)


def _scalar(node: yaml.Node) -> Any:
    """A key's value as Invoke will see it (every key is a scalar once construct_document has succeeded:
    PyYAML refuses a list or a mapping as a key)."""
    return yaml.constructor.SafeConstructor().construct_object(node)


# ------------------------------------------------------------------------------------------- the document

_ANY = object()  # a key Invoke has no default for: any value merges


def _document_errors(doc: Any, places: _Places) -> list[str]:
    """What Invoke cannot merge (a list, a section of the wrong shape, a key that is not text) and every bad
    gpuprov setting."""
    from invoke import Config

    if doc is None:
        return []
    if not isinstance(doc, dict):
        return [places.error((), f"must be a mapping (gpuprov: and Invoke's sections), not {_show(doc)}")]
    errors: list[str] = []
    for key, value in doc.items():
        if not isinstance(key, str):
            errors.append(places.error((key,), "a section's name must be text", at_key=True))
        elif key == "gpuprov" and not isinstance(value, dict):
            errors.append(places.error((key,), f"must be a mapping of gpuprov settings ({', '.join(KINDS)}), "
                                               f"not {_show(value)}"))
        elif key == "gpuprov":
            errors += [places.error((key, name), message, at_key) for name, message, at_key in
                       _section_problems(value)]
        else:
            errors += _shape_errors(Config.global_defaults().get(key, _ANY), value, (key,), places)
    return errors


def _shape_errors(default: Any, value: Any, path: tuple, places: _Places) -> list[str]:
    """Invoke's own sections: a mapping where Invoke has one, a single value where it has one (Invoke cannot
    merge one into the other), keys that are text (Invoke sorts them)."""
    if default is _ANY:
        return []
    keypath = ".".join(path)
    if isinstance(default, dict) != isinstance(value, dict):
        want = "a mapping" if isinstance(default, dict) else "a single value, not a mapping"
        return [places.error(path, f"must be {want} (Invoke's {keypath} setting)")]
    errors: list[str] = []
    for key, item in value.items() if isinstance(value, dict) else ():
        if isinstance(key, str):
            errors += _shape_errors(default.get(key, _ANY), item, (*path, key), places)
        else:
            errors.append(places.error((*path, key), "a setting's name must be text", at_key=True))
    return errors
