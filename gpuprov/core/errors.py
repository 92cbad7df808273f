"""Errors with exit codes that mean something: 1 a host or step failed, 2 bad input."""

from __future__ import annotations

import re

from gpuprov.core.secrets import mask as mask_credentials  # the one masking function, under its old name

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def literal(text: str) -> str:
    """User text made safe to print on one line: control characters (a newline in a host name, an escape
    sequence) shown as Python escapes, so no input can forge an extra output line or recolour a terminal."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def literal_lines(text: str) -> str:
    """`literal` for each line of a message whose line breaks are gpuprov's own (a list of located errors);
    the values put into such a message are escaped where they are put in."""
    return "\n".join(literal(line) for line in text.split("\n"))


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
        # masked before the layout too: a secret cut by a line break or the tail's indent would escape the mask
        shown = self._masked_fields()
        parts = []
        if shown["host"]:
            parts.append(f"[{literal(shown['host'])}]")
        if shown["step"]:
            parts.append(f"{literal(shown['step'])}:")
        parts.append(literal_lines(shown["error"]))
        text = " ".join(parts)
        if shown["command"]:
            text += "\n  command: " + literal_lines(shown["command"]).replace("\n", "\n    ")
        if shown["output"]:
            tail = "\n".join(literal(line) for line in shown["output"].rstrip().splitlines()[-15:])
            text += "\n  output (tail):\n    " + tail.replace("\n", "\n    ")
        if shown["hint"]:
            text += "\n  next: " + literal_lines(shown["hint"]).replace("\n", "\n    ")
        return mask_credentials(text)

    def _masked_fields(self) -> dict:
        fields = {"error": self.message, "host": self.host, "step": self.step,
                  "command": self.command, "output": self.output, "hint": self.hint}
        return {key: mask_credentials(value) if isinstance(value, str) else value for key, value in fields.items()}

    def to_dict(self) -> dict:
        return self._masked_fields()


class InputError(GpuprovError):
    """Bad input: an inventory, an argument, an unknown name. Exit code 2."""

    exit_code = 2
