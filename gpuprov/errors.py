"""Errors with exit codes that mean something: 1 a host or step failed, 2 bad input."""

from __future__ import annotations

import re

# up to the last @ before the host, as URL parsers split it: a password may hold an unescaped @ ("p@ss")
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/\s\"']+@")
# A secret value: up to whitespace, a quote or an escaped line break; other backslash escapes (JSON `\"`,
# `\\`) count as one character, so masking JSON text keeps it valid.
_SECRET = r"(?:\\[^nrt]|[^\s\"'\\])+"
# apt_auth.conf(5) entries (`machine HOST login USER password SECRET`) and `password=` / `proxy_password=`
# lines of dnf .repo files.
_AUTH_CONF_PASSWORD = re.compile(r"(\bmachine\s+\S+\s+login\s+\S+\s+password\s+)" + _SECRET)
_PASSWORD_SETTING = re.compile(r"(password\s*=\s*)" + _SECRET)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def literal(text: str) -> str:
    """User text made safe to print on one line: control characters (a newline in a host name, an escape
    sequence) shown as Python escapes, so no input can forge an extra output line or recolour a terminal."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def literal_lines(text: str) -> str:
    """`literal` for each line of a message whose line breaks are gpuprov's own (a list of located errors);
    the values put into such a message are escaped where they are put in."""
    return "\n".join(literal(line) for line in text.split("\n"))


def mask_credentials(text: str) -> str:
    """Replace every secret gpuprov handles by ***: the user:password part of URLs (proxies, mirrors), the
    password of apt auth.conf entries and the value of `password=` settings. The one masking function."""
    text = _URL_CREDENTIALS.sub("***@", text)
    text = _AUTH_CONF_PASSWORD.sub(r"\g<1>***", text)
    return _PASSWORD_SETTING.sub(r"\g<1>***", text)


class GpuprovError(Exception):
    """A failure on a host or in a step. Exit code 1."""

    exit_code = 1

    def __init__(self, message: str, *, host: str | None = None, step: str | None = None,
                 command: str | None = None, output: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.host = host
        self.step = step
        self.command = command
        self.output = output
        self.hint = hint

    def __str__(self) -> str:
        parts = []
        if self.host:
            parts.append(f"[{literal(self.host)}]")
        if self.step:
            parts.append(f"{literal(self.step)}:")
        parts.append(literal_lines(self.message))
        text = " ".join(parts)
        if self.command:
            text += "\n  command: " + literal_lines(self.command).replace("\n", "\n    ")
        if self.output:
            tail = "\n".join(literal(line) for line in self.output.rstrip().splitlines()[-15:])
            text += "\n  output (tail):\n    " + tail.replace("\n", "\n    ")
        if self.hint:
            text += "\n  next: " + literal_lines(self.hint).replace("\n", "\n    ")
        return mask_credentials(text)

    def to_dict(self) -> dict:
        fields = {"error": self.message, "host": self.host, "step": self.step,
                  "command": self.command, "output": self.output, "hint": self.hint}
        return {key: mask_credentials(value) if isinstance(value, str) else value for key, value in fields.items()}


class InputError(GpuprovError):
    """Bad input: an inventory, an argument, an unknown name. Exit code 2."""

    exit_code = 2
