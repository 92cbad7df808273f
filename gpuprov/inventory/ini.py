"""Ansible's INI inventory format, turned into the document its YAML form would be (gpuprov.inventory.ansible
then reads both the same way)::

    gpu00 ansible_host=10.0.0.9          # before any section: a host in `ungrouped`
    [hgx]                                # a group and its hosts, one host pattern a line
    gpu[01:08] ansible_user=ops rack=r1  # with the host's variables as key=value
    [hgx:vars]                           # the group's variables, one key=value a line
    hardware={"gpu": "H100-SXM", "count": 8}
    [fleet:children]                     # child groups, one a line; each needs a [name] or [name:children]
    hgx
    [all:vars]                           # the defaults
    ansible_user=gpuadmin

Values are read as Ansible reads them: a Python literal (a number, 'quoted text', a list, a dict, True, False,
None) is that value, anything else stays text. A host line is split like a shell line (quotes group words, `#`
starts a comment). Lines starting with `#` or `;` are comments. Key paths in errors are those of the YAML form
(`hgx.hosts.gpu[01:08].rack`, `hgx.vars.hardware`, `fleet.children.hgx`).
"""

from __future__ import annotations

import ast
import io
import re
import shlex
import warnings
from typing import Any

from gpuprov.inventory.located import Located

_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?", re.ASCII)
# a first line that begins a YAML document: a key (`all:`, `"all":`), a directive, a marker, a list item, a flow
# collection, a tag, an anchor, an alias, a block scalar or a quoted scalar; a host line (`gpu01 k=v`) is none of them
_YAML_LINE = re.compile(r"""(?:---|\.\.\.|%|[-?:](?:\s|$)|[{\[!&*|>'"])|[^\s#]*\s*:(?:\s|$)""")
_GROUP_LINE = re.compile(r"([^:\]\s]+)\s*(?:#.*)?")
_KINDS = ("hosts", "vars", "children")
_ALWAYS_DECLARED = ("all", "ungrouped")


def looks_like_ini(text: str, host_lines: bool = True) -> bool:
    """Whether the first line that is not blank or a comment is an INI section header (`[name]`, `[name:vars]`)
    or, with `host_lines`, a host line (an ungrouped host, as Ansible's INI reader takes it), not the start of a
    YAML document."""
    for line in io.StringIO(text):
        stripped = line.strip()
        if stripped and stripped[0] not in "#;":
            return bool(_SECTION.fullmatch(stripped)) or (host_lines and not _YAML_LINE.match(stripped))
    return False


def read_ini(doc: Located, text: str) -> dict:
    """The Ansible YAML-form document of an INI inventory, with every place recorded in `doc`."""
    reader = _Reader(doc)
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and stripped[0] not in "#;":
            reader.line(number, len(line) - len(line.lstrip()) + 1, stripped)
    reader.finish()
    return reader.data


class _Reader:
    def __init__(self, doc: Located):
        self.doc = doc
        self.data: dict = {}
        self.group, self.kind = "all", "hosts"
        self.declared: set[str] = set(_ALWAYS_DECLARED)
        self.undeclared: dict[str, tuple] = {}  # group -> (path, (line, col), message) if no section declares it

    def line(self, number: int, col: int, text: str) -> None:
        if (text.startswith("[") and text.endswith("]")) or _SECTION.fullmatch(text):
            self.section(number, col, text)
        elif not self.group:  # the lines of a section whose header was refused
            return
        elif self.kind == "hosts":
            self.host_line(number, col, text)
        elif self.kind == "vars":
            self.vars_line(number, col, text)
        else:
            self.child_line(number, col, text)

    def section(self, number: int, col: int, text: str) -> None:
        match = _SECTION.fullmatch(text)
        if not match:
            self.doc.file_error(number, col, f"bad section header {text!r}: write [NAME], [NAME:vars] or "
                                             "[NAME:children], without spaces")
            self.group = ""
            return
        self.group, kind = match.group(1), match.group(2) or "hosts"
        path, at = (self.group,), (number, col + 1)
        self.mark(path, *at)
        self.data.setdefault(self.group, {})
        if kind not in _KINDS:
            self.doc.error(path, f"unknown section type {kind!r}: give [{self.group}], [{self.group}:vars] or "
                                 f"[{self.group}:children]", at=at)
            self.group = ""
            return
        self.kind = kind
        if kind == "vars":
            self.undeclared.setdefault(self.group, (path, at, f"[{self.group}:vars] is for a group no section "
                                                              f"declares: add a [{self.group}] section"))
        else:
            self.declared.add(self.group)

    def host_line(self, number: int, col: int, text: str) -> None:
        try:
            tokens = _tokens(text)
        except ValueError as exc:
            self.doc.file_error(number, col, f"cannot split the host line: {exc}")
            return
        if not tokens:
            return
        (pattern, start), *assignments = tokens
        hosts = self.body("hosts")
        path = (self.group, "hosts", pattern)
        self.mark(path, number, col + start)
        host_vars = hosts.setdefault(pattern, {})
        for token, at in assignments:
            key, equals, value = token.partition("=")
            if not equals or not key:
                self.doc.error(path, f"expected key=value after the host, not {token!r}", at=(number, col + at))
                continue
            self.assign(host_vars, (*path, key), value, number, col + at, col + at + len(key) + 1)

    def vars_line(self, number: int, col: int, text: str) -> None:
        key, equals, value = text.partition("=")
        path = (self.group, "vars")
        if not equals or not key.strip():
            self.doc.error(path, f"expected key=value, not {text!r}", at=(number, col))
            return
        value_col = col + len(key) + 1 + len(value) - len(value.lstrip())
        self.assign(self.body("vars"), (*path, key.strip()), value.strip(), number, col, value_col)

    def child_line(self, number: int, col: int, text: str) -> None:
        match = _GROUP_LINE.fullmatch(text)
        path = (self.group, "children")
        if not match:
            self.doc.error(path, f"expected a group name, not {text!r}", at=(number, col))
            return
        child = match.group(1)
        self.mark((*path, child), number, col)
        self.body("children").setdefault(child, None)
        self.undeclared.setdefault(child, ((*path, child), (number, col), f"group {child!r} is not declared: add a "
                                           f"[{child}] section (Ansible needs one for every child group)"))

    def finish(self) -> None:
        for group, (path, at, message) in self.undeclared.items():
            if group not in self.declared:
                self.doc.error(path, message, at=at)

    # ---------- helpers ----------

    def body(self, key: str) -> dict:
        """The current group's `hosts`, `vars` or `children` mapping."""
        section = self.data.setdefault(self.group, {})
        if key not in section:
            section[key] = {}
            self.doc.marks.setdefault((self.group, key), self.doc.marks.get((self.group,), (1, 1)))
        return section[key]

    def assign(self, mapping: dict, path: tuple, text: str, number: int, key_col: int, value_col: int) -> None:
        value, numbers = python_value(text)
        mapping[path[-1]] = value
        self.doc.key_marks[path] = (number, key_col)
        self.doc.marks[path] = (number, value_col)
        for inner, written in numbers.items():
            self.doc.raw[(*path, *inner)] = written

    def mark(self, path: tuple, number: int, col: int) -> None:
        self.doc.marks.setdefault(path, (number, col))
        self.doc.key_marks.setdefault(path, (number, col))


def _tokens(text: str) -> list[tuple[str, int]]:
    """A line split like a shell line (Ansible: shlex, comments on), each word with its 0-based column."""
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    tokens = []
    while True:
        before = lexer.instream.tell()
        token = lexer.get_token()
        if token is None:
            return tokens
        rest = text[before:]
        tokens.append((token, before + len(rest) - len(rest.lstrip())))


def python_value(text: str) -> tuple[Any, dict[tuple, str]]:
    """A Python literal's value as Ansible reads it, else the text; and the source text of every number in it by
    its key path inside the value (`{"cuda": 12.10}` has 12.10 written as "12.10"). Tuples and sets become
    lists, bytes text, and mapping keys text."""
    source = text.lstrip(" \t")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(source, mode="eval")
            value = ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text, {}
    return _plain(value), _numbers(tree.body, source, ())


def _numbers(node: ast.expr, source: str, path: tuple) -> dict[tuple, str]:
    if isinstance(node, ast.Dict):
        found: dict[tuple, str] = {}
        for key, item in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant):
                found |= _numbers(item, source, (*path, key.value if isinstance(key.value, str) else str(key.value)))
        return found
    if isinstance(node, ast.List | ast.Tuple):
        found = {}
        for index, item in enumerate(node.elts):
            found |= _numbers(item, source, (*path, index))
        return found
    if isinstance(node, ast.Constant | ast.UnaryOp):
        value = ast.literal_eval(node)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return {path: ast.get_source_segment(source, node)}
    return {}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key if isinstance(key, str) else str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, complex) or value is Ellipsis:
        return "..." if value is Ellipsis else str(value)
    return value
