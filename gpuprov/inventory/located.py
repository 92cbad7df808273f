"""YAML read into plain data that keeps the place (line, column) of every value and every key.

`decode` and `compose` turn bytes into a node tree, refusing with a YamlTextError (line, column, message):
text that is not UTF-8, a character YAML does not allow, a syntax error (named where the parser noticed it
and where the construct it was in began), and nesting deeper than MAX_DEPTH levels; the depth is checked on
the parser's event stream before any tree is built, since the composer recurses once per level (libyaml's
crashes the process on a file nested some 30,000 deep rather than raising). The C loader (libyaml) is used when
PyYAML has it: it keeps positions and is several times faster than the Python one.

`Located.construct` turns the tree into dicts, lists and scalars, recording where each came from. Keys are
their text (`on` and `1` are the keys "on" and "1", never a boolean or a number). Aliases are copied where
they are used, and what the copies add is bounded by MAX_ALIAS_VALUES (a "billion laughs" file is refused,
a large plain file is not). Problems are collected, each at its place, as `FILE:LINE:COL: key: message`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuprov.inventory.diagnostics import FILE_KEY, key_path, problem_line, show

MAX_DEPTH = 64
MAX_ALIAS_VALUES = 100_000

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NOT_IN_YAML = yaml.reader.Reader.NON_PRINTABLE
_YAML_TAGS = "tag:yaml.org,2002:"
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_COLLECTION_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "omap", "pairs", "set")}
_SCALARS = yaml.constructor.SafeConstructor.yaml_constructors


class YamlTextError(Exception):
    """Text that is not a YAML document gpuprov reads: where (1-based line and column) and why."""

    def __init__(self, line: int, col: int, message: str):
        super().__init__(message)
        self.line, self.col, self.message = line, col, message


def decode(data: bytes) -> str:
    """UTF-8 text (a byte order mark dropped); YamlTextError at the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise YamlTextError(line, exc.start - data.rfind(b"\n", 0, exc.start), "not UTF-8 text") from None


def compose(text: str) -> yaml.Node | None:
    """The document's node tree (None for an empty document); YamlTextError when it cannot be read."""
    bad = _NOT_IN_YAML.search(text)
    if bad:
        line, col = _line_col(text, bad.start())
        raise YamlTextError(line, col, f"character {bad.group()!r} is not allowed in YAML")
    try:
        _check_depth(text)
        return yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, text) from None
    except yaml.YAMLError as exc:
        raise YamlTextError(1, 1, f"YAML error: {exc}") from None


def _check_depth(text: str) -> None:
    """YamlTextError at the first collection nested deeper than MAX_DEPTH, found on the parser's events."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise YamlTextError(mark.line + 1, mark.column + 1, f"nested more than {MAX_DEPTH} levels deep; "
                                                                    f"gpuprov reads YAML nested up to {MAX_DEPTH}")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _syntax_error(exc: yaml.MarkedYAMLError, text: str) -> YamlTextError:
    """Where the parser noticed the problem, and where the construct it was reading began (an unclosed `[`).
    A tab where YAML wants indentation is named as a tab (the parser only says it "cannot start any token")."""
    noticed, began = exc.problem_mark or exc.context_mark, exc.context_mark
    line, col = (noticed.line + 1, noticed.column + 1) if noticed else (1, 1)
    rows = text.split("\n", line) if noticed else []
    row = rows[line - 1] if len(rows) >= line else ""  # the parser may stop past the last line
    if row[col - 1:col] == "\t":
        return YamlTextError(line, col, "YAML syntax error: a tab character; YAML indents with spaces, not tabs: "
                                        "replace the tab with spaces")
    message = f"YAML syntax error: {exc.problem or 'bad YAML'}"
    if exc.context and began is not None and (began.line + 1, began.column + 1) != (line, col):
        message += f" ({exc.context} that began at line {began.line + 1}, column {began.column + 1})"
    elif exc.context:
        message += f" ({exc.context})"
    return YamlTextError(line, col, message)


def _line_col(text: str, index: int) -> tuple[int, int]:
    return text.count("\n", 0, index) + 1, index - text.rfind("\n", 0, index)


class Located:
    """A document's data with the place of each value (`marks`) and key (`key_marks`), keyed by key path
    (a tuple of keys and list indexes), and the problems found, each at its place."""

    def __init__(self, file: Path, aliases: bool = True):
        """`aliases`: whether the text may hold aliases (`*name`); False skips the bookkeeping that bounds them."""
        self.file = file
        self.aliases = aliases
        self.marks: dict[tuple, tuple[int, int]] = {}
        self.key_marks: dict[tuple, tuple[int, int]] = {}
        self.raw: dict[tuple, str] = {}  # the source text of numbers: `cuda: 12.10` is "12.10", not 12.1
        self.tagged: dict[tuple, str] = {}  # values with a tag gpuprov does not read (`!vault`)
        self.errors: list[tuple[int, int, str]] = []
        self.warnings: list[str] = []
        self._reported: set[str] = set()
        self._built: set[int] = set()
        self._active: set[int] = set()
        self._copied = 0
        self._constructor = yaml.constructor.SafeConstructor()

    # ---------- problems and places ----------

    def error(self, path: tuple, message: str, *, at_key: bool = False, at: tuple[int, int] | None = None) -> None:
        """Record a problem at `path` (its key's place with at_key, or an explicit line and column)."""
        line, col = at or self.place(path, at_key)
        text = problem_line(self.file, line, col, key_path(path), message)
        if text not in self._reported:
            self._reported.add(text)
            self.errors.append((line, col, text))

    def file_error(self, line: int, col: int, message: str) -> None:
        """A problem with the file as a whole (not UTF-8, not YAML, not the format)."""
        self.errors.append((line, col, problem_line(self.file, line, col, FILE_KEY, message)))

    def warn(self, path: tuple, message: str) -> None:
        """Record a warning at `path`'s key (once)."""
        line, col = self.place(path, at_key=True)
        text = problem_line(self.file, line, col, key_path(path), message)
        if text not in self.warnings:
            self.warnings.append(text)

    def place(self, path: tuple, at_key: bool = False) -> tuple[int, int]:
        """Where `path` is: its key (at_key) or its value, else the nearest enclosing value that has a place."""
        if at_key and path in self.key_marks:
            return self.key_marks[path]
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return (1, 1)

    def problems(self) -> list[str]:
        """Every problem, in file order."""
        return [text for _, _, text in sorted(self.errors, key=lambda e: (e[0], e[1]))]

    # ---------- nodes -> data ----------

    def construct(self, node: yaml.Node, path: tuple = (), depth: int = 0, copy: bool = False) -> Any:
        """Plain data from a node tree, recording every value's place under its key path."""
        if self.aliases:
            copy = copy or id(node) in self._built
            if not self._may_build(node, path, copy):
                return None
        if depth > MAX_DEPTH:
            self.error(path, f"cannot read this value: nested more than {MAX_DEPTH} levels deep")
            return None
        self.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if node.tag not in _COLLECTION_TAGS:
            self.tagged.setdefault(path, node.tag)
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.construct(item, (*path, i), depth + 1, copy) for i, item in enumerate(node.value)]
            return self._mapping(node, path, depth, copy)
        finally:
            self._active.discard(id(node))

    def _may_build(self, node: yaml.Node, path: tuple, copy: bool) -> bool:
        """Whether to build `node` at `path`: not when an alias refers to itself, nor once aliases have added
        MAX_ALIAS_VALUES values (a copy is a node built again, or anything inside one)."""
        if id(node) in self._active:
            self.error(path, "cannot read this value: an alias refers to itself")
            return False
        if not copy:
            self._built.add(id(node))
            return True
        self._copied += 1
        if self._copied == MAX_ALIAS_VALUES + 1:  # at the key the copy is under (the node's place is the anchor's)
            key = next((path[:end] for end in range(len(path), 0, -1) if path[:end] in self.key_marks), ())
            self.error(path, f"aliases (*name) add more than {MAX_ALIAS_VALUES} values; gpuprov copies up to "
                             f"{MAX_ALIAS_VALUES} (is an alias expanding too far?)", at=self.key_marks.get(key, (1, 1)))
        return self._copied <= MAX_ALIAS_VALUES

    def _scalar(self, node: yaml.ScalarNode, path: tuple) -> Any:
        if node.tag == _STR_TAG:
            return node.value
        if node.tag not in _SCALARS:
            self.tagged.setdefault(path, node.tag)
            return node.value
        try:
            value = _SCALARS[node.tag](self._constructor, node)
        except Exception as exc:  # noqa: BLE001 - any constructor failure is a bad value in the file
            self.error(path, f"cannot read value {show(node.value)}: {str(exc).splitlines()[0]}")
            return None
        if isinstance(value, int | float) and not isinstance(value, bool) and not node.style:
            self.raw.setdefault(path, node.value)
        return value

    def _mapping(self, node: yaml.MappingNode, path: tuple, depth: int, copy: bool) -> dict:
        result: dict = {}
        first_at: dict[str, int] = {}
        merges = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.extend(value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node])
                continue
            key_mark = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if not isinstance(key_node, yaml.ScalarNode):
                what = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                self.error(path, f"a key must be a plain value, not {what}", at=key_mark)
                continue
            key = key_node.value
            kpath = (*path, key)
            self.key_marks.setdefault(kpath, key_mark)
            if not key_node.tag.startswith(_YAML_TAGS):
                self.error(kpath, f"unsupported YAML tag {key_node.tag!r} on a key: a key is plain text",
                           at=key_mark)
                continue
            if key in first_at:
                what = "host" if path[-1:] == ("hosts",) else "key"
                self.error(kpath, f"duplicate {what} {key!r} (first at line {first_at[key]})", at=key_mark)
                continue
            first_at[key] = key_mark[0]
            result[key] = self.construct(value_node, kpath, depth + 1, copy)
        for source in merges:  # explicit keys win; among merged mappings the first one wins
            value = self.construct(source, path, depth + 1, copy)
            if not isinstance(value, dict):
                self.error(path, "a merge key (<<) needs a mapping or a list of mappings")
                continue
            for key, item in value.items():
                result.setdefault(key, item)
        return result
