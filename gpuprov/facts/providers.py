"""Fact providers and the composer that runs the ones a job asks for in one shell script (one SSH round trip).

Modelled on pyinfra's `FactBase`: a fact names its command and its parser.

- `Provider(name, command, parse, unknown)`: `command` is a fixed shell string, or a function of the job's
  `FactArgs` that builds one (every value in it through `shlex.quote`); `parse(text, rc)` turns the command's
  standard output and exit status into the fact's typed value. A command starting with `need TOOL` exits
  `MISSING` (127) when TOOL is not installed: a missing tool is a fact (its parser returns null-like data).
- `Derived(name, needs, derive, unknown)`: a fact computed from other facts (`derive(*values of needs)`).
- `Registry`: the facts one document can hold (`gpuprov.facts.base.REGISTRY`, harden's in
  `gpuprov.harden.facts`); `register` adds one, `include` shares another registry's.

`Registry.script(names, args)` composes the providers behind `names` (and what their derived facts need) into one
POSIX sh script; providers whose commands are the same string share one run. Each command runs in a subshell, its
output between `@@gpuprov:NAME...` and `@@gpuprov-rc:N` marker lines, so one command that fails or exits cannot
stop the others. The script's first line names the facts asked for, so `Registry.parse(output)` needs nothing
else: it returns the document with exactly those facts, plus `complete` (the script reached its end) and
`notices`. A provider that did not answer (its parser raised `NoAnswer`, or raised at all, or its output was cut
off) yields its declared `unknown` value and a notice saying why; it never fails the whole gather.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpuprov.core.errors import InputError

T = TypeVar("T")

MISSING = 127  # `need TOOL` exits with the shell's "command not found" status
PRELUDE = """export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
have() { command -v "$1" >/dev/null 2>&1; }
need() { have "$1" || exit 127; }
"""
NAME = re.compile(r"[a-z][a-z0-9_]*")
HEADER = re.compile(r"^@@gpuprov-facts:(?P<names>.*)$", re.M)
SECTION = re.compile(r"^@@gpuprov:(?P<names>[a-z0-9_ ]+)$", re.M)
RC = re.compile(r"\n@@gpuprov-rc:(?P<rc>\d+)\n*\Z")
END = "end"


class NoAnswer(Exception):
    """Raised by a parser when its command did not answer (it failed, or printed what the parser cannot read):
    the fact is its provider's `unknown` value and the message becomes a notice."""


@dataclass(frozen=True)
class FactArgs:
    """What a job gives the commands it asks for: the files it manages (their contents come back) and the
    inventory's user (harden's group check)."""

    files: tuple[str, ...] = ()
    user: str | None = None


@dataclass(frozen=True)
class Provider(Generic[T]):
    """A fact read by one shell command and one parser (see the module docstring)."""

    name: str
    command: str | Callable[[FactArgs], str]
    parse: Callable[[str, int], T]
    unknown: T = None

    def command_for(self, args: FactArgs) -> str:
        return self.command(args) if callable(self.command) else self.command


@dataclass(frozen=True)
class Derived(Generic[T]):
    """A fact computed from other facts of the same registry: `derive(*[value of each name in needs])`."""

    name: str
    needs: tuple[str, ...]
    derive: Callable[..., T]
    unknown: T = None


Fact = Provider | Derived


class Registry:
    """The facts one kind of document can hold, by name; `default` are those gathered when a job names none."""

    def __init__(self, title: str):
        self.title = title
        self._facts: dict[str, Fact] = {}
        self.default: tuple[str, ...] = ()

    def register(self, fact: Fact, *, default: bool = True) -> Fact:
        """Add a fact (in the default set unless `default=False`: a building block of derived facts)."""
        if not NAME.fullmatch(fact.name) or fact.name == END:
            raise ValueError(f"fact name {fact.name!r} must match {NAME.pattern} and not be {END!r}")
        if fact.name in self._facts:
            raise ValueError(f"{self.title}: fact {fact.name!r} is already registered")
        for need in getattr(fact, "needs", ()):
            if need not in self._facts:
                raise ValueError(f"{self.title}: {fact.name!r} needs {need!r}, which is not registered (yet)")
        self._facts[fact.name] = fact
        if default:
            self.default = (*self.default, fact.name)
        return fact

    def include(self, other: Registry, *names: str, default: bool = True) -> None:
        """Share facts of another registry (with what they need) under the same names."""
        for name in other.closure(names):
            if name not in self._facts:
                self.register(other[name], default=default and name in names)

    def __getitem__(self, name: str) -> Fact:
        return self._facts[name]

    def closure(self, names: Iterable[str]) -> list[str]:
        """`names` and every fact they need, each after what it needs; InputError for a name not registered."""
        wanted = list(names)
        unknown = [name for name in wanted if name not in self._facts]
        if unknown:
            raise InputError(f"{self.title}: no fact named {', '.join(map(repr, unknown))}",
                             hint=f"known facts: {', '.join(self._facts)}")
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            for need in getattr(self._facts[name], "needs", ()):
                visit(need)
            order.append(name)

        for name in wanted:
            visit(name)
        return order

    def with_dependents(self, names: Iterable[str]) -> list[str]:
        """`names` and every derived fact computed from one of them, transitively (what changes when they do)."""
        out = list(dict.fromkeys(names))
        for name, fact in self._facts.items():   # registration order: a derived fact comes after what it needs
            if isinstance(fact, Derived) and name not in out and set(fact.needs) & set(out):
                out.append(name)
        return out

    def commands(self, names: Iterable[str], args: FactArgs) -> dict[str, list[str]]:
        """{command: [the providers that read it]} for `names`, in script order."""
        runs: dict[str, list[str]] = {}
        for name in self.closure(names):
            fact = self._facts[name]
            if isinstance(fact, Provider):
                runs.setdefault(fact.command_for(args), []).append(name)
        return runs

    def script(self, names: Iterable[str], args: FactArgs = FactArgs()) -> str:
        """The one POSIX sh script that gathers `names` (see the module docstring)."""
        wanted = list(names)
        lines = [f"# gpuprov {self.title}: read-only, one round trip", PRELUDE.rstrip("\n"),
                 f"printf '@@gpuprov-facts:%s\\n' '{' '.join(wanted)}'"]
        for command, readers in self.commands(wanted, args).items():
            lines += [f"printf '\\n@@gpuprov:%s\\n' '{' '.join(readers)}'", "(", command, ")",
                      "printf '\\n@@gpuprov-rc:%s\\n' \"$?\""]
        lines.append(f"printf '\\n@@gpuprov:{END}\\n'")
        return "\n".join(lines) + "\n"

    def parse(self, output: str) -> dict[str, Any]:
        """The document a script's output holds: the facts it asked for, `complete` and `notices`."""
        header = HEADER.search(output)
        wanted = header.group("names").split() if header else []
        answers, complete = split_output(output)
        values: dict[str, Any] = {}
        notices: list[str] = []
        for name in self.closure(wanted):
            fact = self._facts[name]
            if isinstance(fact, Provider):
                values[name] = self._parse_one(fact, answers.get(name), notices)
            else:
                values[name] = self._derive_one(fact, values, notices)
        document = {name: values[name] for name in wanted}
        document["complete"] = complete
        document["notices"] = notices
        return document

    @staticmethod
    def _parse_one(provider: Provider, answer: tuple[str, int | None] | None, notices: list[str]) -> Any:
        if answer is None or answer[1] is None:
            notices.append(f"{provider.name}: no answer (the script's output was cut off)")
            return copy.deepcopy(provider.unknown)
        text, rc = answer
        try:
            return provider.parse(text, rc)
        except NoAnswer as exc:
            notices.append(f"{provider.name}: {exc}")
        except Exception as exc:  # a parser is a plugin: its failure costs its fact, not the gather
            notices.append(f"{provider.name}: unreadable output ({type(exc).__name__}: {exc})")
        return copy.deepcopy(provider.unknown)

    @staticmethod
    def _derive_one(fact: Derived, values: Mapping[str, Any], notices: list[str]) -> Any:
        try:
            return fact.derive(*(values[need] for need in fact.needs))
        except Exception as exc:  # same contract as a parser's
            notices.append(f"{fact.name}: cannot be derived ({type(exc).__name__}: {exc})")
            return copy.deepcopy(fact.unknown)


def split_output(output: str) -> tuple[dict[str, tuple[str, int | None]], bool]:
    """A composed script's output -> ({provider: (its command's output, exit status or None if cut off)},
    whether the script reached its end)."""
    answers: dict[str, tuple[str, int | None]] = {}
    complete = False
    marks = list(SECTION.finditer(output))
    for index, mark in enumerate(marks):
        names = mark.group("names").split()
        if names == [END]:
            complete = True
            continue
        body = output[mark.end() + 1: marks[index + 1].start() if index + 1 < len(marks) else len(output)]
        rc = RC.search(body)
        answer = (body[: rc.start()], int(rc.group("rc"))) if rc else (body, None)
        for name in names:
            answers[name] = answer
    return answers, complete


def quoted_word(value: str, what: str) -> str:
    """`value` quoted for the shell; InputError for a value no command line can carry (a newline, a NUL)."""
    if "\n" in value or "\0" in value:
        raise InputError(f"{what} {value!r} contains a newline or NUL byte", step="facts",
                         hint="name it without control characters")
    return shlex.quote(value)
