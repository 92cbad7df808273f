"""Connection settings (address, port, user, identity_file, jump, sudo) and local paths, checked where written."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Container
from pathlib import Path
from typing import Any

from gpuprov.inventory.checks import port_problem
from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.levels import INVALID, Level, as_mapping, known_keys
from gpuprov.inventory.located import Located
from gpuprov.inventory.model import USER, is_valid_address, parse_jump, parse_port

SETTING_KEYS = ("address", "port", "user", "identity_file", "jump", "sudo")
SUDO_KEYS = ("password_env", "nopasswd")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class SettingChecks:
    """Checks each level's connection settings; a refused one is left out (its error is recorded)."""

    def __init__(self, doc: Located, base: Path, host_names: Container[str]):
        self.doc = doc
        self.base = base
        self.host_names = host_names

    def check(self, level: Level) -> dict:
        """{key: (checked value, path)} for the settings that pass."""
        out = {}
        for key, (value, path) in level.settings.items():
            checked = getattr(self, key)(value, path)
            if checked is not INVALID:
                out[key] = (checked, path)
        return out

    def address(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and is_valid_address(value):
            return value
        self.doc.error(path, f"bad address {show(value)}: give a host name (RFC 1123) or an IP address")
        return INVALID

    def port(self, value: Any, path: tuple) -> Any:
        return port_number(self.doc, value, path)

    def user(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and USER.fullmatch(value):
            return value
        self.doc.error(path, f"bad user {show(value)}: letters, digits, '_', '.', '-' (up to 32, not starting "
                             "with a digit or '-')")
        return INVALID

    def identity_file(self, value: Any, path: tuple) -> Any:
        if value is None:
            return None
        resolved = local_path(self.doc, value, path, "identity file", self.base, must_exist=True)
        return INVALID if resolved is None else resolved

    def jump(self, value: Any, path: tuple) -> Any:
        if value is None or (isinstance(value, str) and value in self.host_names):
            return value
        if not isinstance(value, str):
            self.doc.error(path, f"jump must be a host name or user@address[:port], not {type_name(value)}")
            return INVALID
        if "@" not in value:
            self.doc.error(path, f"unknown jump host {show(value)}{suggest(value, self.host_names)}: name an "
                                 "inventory host or give user@address[:port]")
            return INVALID
        try:
            parse_jump(value)
        except ValueError as exc:
            self.doc.error(path, f"bad jump {show(value)}: {exc}")
            return INVALID
        return value

    def sudo(self, value: Any, path: tuple) -> Any:
        body = as_mapping(self.doc, value, path, "sudo")
        if body is None:
            return INVALID
        known_keys(self.doc, body, path, SUDO_KEYS, "sudo")
        env = body.get("password_env")
        nopasswd = body.get("nopasswd", False)
        ok = True
        if env is not None and not (isinstance(env, str) and _ENV_NAME.fullmatch(env)):
            self.doc.error((*path, "password_env"), f"bad environment variable name {show(env)}")
            ok = False
        if not isinstance(nopasswd, bool):
            self.doc.error((*path, "nopasswd"), f"nopasswd must be true or false, not {show(nopasswd)}")
            ok = False
        elif nopasswd and env is not None:
            self.doc.error(path, "give either password_env or nopasswd: true, not both")
            ok = False
        return {"password_env": env, "nopasswd": nopasswd} if ok else INVALID


def port_number(doc: Located, value: Any, path: tuple) -> Any:
    """A port: an integer from 1 to 65535 (text, even of ASCII digits, is refused: write the number)."""
    if port_problem(value) is None:
        return value
    message = f"bad port {show(value)}: give an integer from 1 to 65535"
    if isinstance(value, str):
        try:
            parse_port(value)
            message += " (without quotes)"
        except ValueError as exc:
            message = str(exc)
    doc.error(path, message)
    return INVALID


def local_path(doc: Located, value: Any, path: tuple, what: str, base: Path, must_exist: bool) -> str | None:
    """A path on this machine: `~` expanded, relative to the inventory's folder `base`. With must_exist, it
    must be a regular file (not missing, not a folder, not a device or a pipe)."""
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        doc.error(path, f"{what} must be a path, not {show(value)}")
        return None
    resolved = Path(os.path.expanduser(value))
    relative = not resolved.is_absolute()
    if relative:
        resolved = Path(os.path.normpath(base / resolved))
    problem = _not_a_file(resolved) if must_exist else None
    if problem:
        where = f" (relative paths are relative to the inventory's folder {base})" if relative else ""
        doc.error(path, f"{what} {resolved} {problem}{where}")
        return None
    return str(resolved)


def _not_a_file(path: Path) -> str | None:
    """Why `path` is not a regular file gpuprov can read, or None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "not found"
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a device, a pipe or a socket)"
    return None
