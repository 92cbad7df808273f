"""Ansible's `group_vars/` and `host_vars/` beside an inventory file, read as ansible-core's host_group_vars plugin
reads them.

For each group of the inventory (`all` and `ungrouped` too) and each host, the first of `group_vars/NAME`,
`NAME.yml`, `NAME.yaml` and `NAME.json` that exists is read; when it is a folder, every file in it (and in its
folders, recursively), in sorted order, with no extension or one of those, skipping names starting with `.` or
ending in `~`. Each file is a YAML (or JSON) mapping of variables, read like the inventory's `vars` (connection
settings, ssh args, become, dropped `ansible_*` keys); a later file's key replaces an earlier one's.
gpuprov.inventory.merge applies them in Ansible's precedence. A name in `group_vars/` or `host_vars/` that is no group
or host of the inventory is a warning (Ansible ignores it; a typo would be lost silently).

Every problem in a vars file is told as `FILE:LINE:COL: key: message` with that file's name and place: a
`VarsDocument` is the inventory's Located with the places of each vars file's values under a `VarsFile` key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuprov.inventory.ansible import ansible_variables
from gpuprov.inventory.checks import NotRegular, read_regular
from gpuprov.inventory.diagnostics import FILE_KEY, key_path, problem_line, suggest, type_name
from gpuprov.inventory.levels import AnsibleOrder, Level, Levels
from gpuprov.inventory.located import Located, YamlTextError, compose, decode

EXTENSIONS = (".yml", ".yaml", ".json")
MAX_FILE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class VarsFile:
    """The first part of the key path of every value read from one vars file."""

    file: Path
    rank: int  # the order problems are told in: the inventory's own first, then each file as read


class VarsDocument(Located):
    """The inventory's Located, also holding the places of the values of its vars files: a path that starts with
    a VarsFile is told in that file, with the rest of the path as its key."""

    def __init__(self, file: Path, aliases: bool = True):
        super().__init__(file, aliases)
        self._ranks: dict[str, int] = {}
        self._files = 0

    def next_rank(self) -> int:
        """The rank of the next vars file read."""
        self._files += 1
        return self._files

    def error(self, path: tuple, message: str, *, at_key: bool = False, at: tuple[int, int] | None = None) -> None:
        if not path or not isinstance(path[0], VarsFile):
            super().error(path, message, at_key=at_key, at=at)
            return
        line, col = at or self.place(path, at_key)
        self._add(path[0], line, col, problem_line(path[0].file, line, col, key_path(path[1:]), message))

    def warn(self, path: tuple, message: str) -> None:
        if not path or not isinstance(path[0], VarsFile):
            super().warn(path, message)
            return
        line, col = self.place(path, at_key=True)
        text = problem_line(path[0].file, line, col, key_path(path[1:]), message)
        if text not in self.warnings:
            self.warnings.append(text)

    def problems(self) -> list[str]:
        """Every problem: the inventory's in file order, then each vars file's."""
        ordered = sorted(self.errors, key=lambda e: (self._ranks.get(e[2], 0), e[0], e[1]))
        return [text for _, _, text in ordered]

    def add_file(self, origin: VarsFile, read: Located) -> None:
        """The places, numbers' text, tags, problems and warnings of a vars file read into `read`."""
        self.marks[(origin,)] = (1, 1)
        for mine, theirs in ((self.marks, read.marks), (self.key_marks, read.key_marks), (self.raw, read.raw),
                             (self.tagged, read.tagged)):
            mine.update({(origin, *path): value for path, value in theirs.items()})
        for line, col, text in read.errors:
            self._add(origin, line, col, text)
        self.warnings.extend(text for text in read.warnings if text not in self.warnings)

    def _add(self, origin: VarsFile, line: int, col: int, text: str) -> None:
        if text not in self._ranks:
            self._ranks[text] = origin.rank
            self.errors.append((line, col, text))


def read_vars_dirs(doc: VarsDocument, levels: Levels, folder: Path) -> None:
    """Add the levels of `folder`'s group_vars/ and host_vars/ files to an Ansible inventory's levels (`folder`:
    the inventory file's folder, as its path was given, so that errors name the files as the user sees them)."""
    order = levels.ansible if levels.ansible is not None else AnsibleOrder()
    levels.ansible = order
    for subdir, names, files, what in (("group_vars", ("all", *levels.groups), order.group_files, "group"),
                                       ("host_vars", tuple(levels.hosts), order.host_files, "host")):
        reader = _FileReader(doc, levels, folder, subdir)
        if reader.entries is None:
            continue
        for name in names:
            found = reader.entity(name)
            if found:
                files[name] = found
        reader.unknown(set(names), what)


class _FileReader:
    """One vars folder (group_vars or host_vars) beside the inventory."""

    def __init__(self, doc: VarsDocument, levels: Levels, folder: Path, subdir: str):
        self.doc, self.levels, self.folder, self.subdir = doc, levels, folder / subdir, subdir
        self.entries: set[str] | None = None  # the folder's names (None: no such folder)
        if self.folder.is_dir():
            try:
                self.entries = {entry.name for entry in self.folder.iterdir()}
            except OSError as exc:
                doc.warnings.append(problem_line(self.folder, 1, 1, FILE_KEY, f"not read: {exc.strerror}"))
        elif self.folder.exists():
            doc.warnings.append(problem_line(self.folder, 1, 1, FILE_KEY,
                                             "not read: not a folder (Ansible skips it too)"))

    def entity(self, name: str) -> list[Level]:
        """The levels of a group's or host's vars files, in the order Ansible reads them."""
        try:
            paths = find_vars_files(self.folder, name, self.entries or set())
        except OSError as exc:
            where = Path(exc.filename) if exc.filename else self.folder / name
            unread = Located(where)
            unread.file_error(1, 1, f"cannot be read: {exc.strerror}")
            self.doc.add_file(VarsFile(where, rank=self.doc.next_rank()), unread)
            return []
        return [level for path in paths if (level := self.read(path)) is not None]

    def read(self, path: Path) -> Level | None:
        """One vars file's level (None for an empty file or one that cannot be read, its problem recorded)."""
        origin = VarsFile(path, rank=self.doc.next_rank())
        read = Located(path)
        value = None
        try:
            text = decode(read_regular(path, MAX_FILE_BYTES))
            if text.startswith("$ANSIBLE_VAULT"):
                raise YamlTextError(1, 1, "encrypted with ansible-vault: gpuprov does not decrypt; read the "
                                          "inventory through ansible-inventory with --inventory-plugin ansible")
            read.aliases = "*" in text
            root = compose(text)
            value = None if root is None else read.construct(root)
        except YamlTextError as exc:
            read.file_error(exc.line, exc.col, exc.message)
        except NotRegular as exc:
            what = exc.reason if exc.size is None else f"has {exc.size} bytes; gpuprov reads up to {MAX_FILE_BYTES}"
            read.file_error(1, 1, f"not read: the file {what}")
        except OSError as exc:
            read.file_error(1, 1, f"cannot be read: {exc.strerror}")
        self.doc.add_file(origin, read)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.doc.error((origin,), f"a vars file must be a mapping of variables, not {type_name(value)}")
            return None
        level = Level(f"{self.subdir}/{path.relative_to(self.folder)}", (origin,))
        ansible_variables(self.doc, self.levels, value, (origin,), level)
        return level

    def unknown(self, names: set[str], what: str) -> None:
        """A warning for each entry of the folder that names no group (or host) of the inventory."""
        for entry in sorted(self.entries or ()):
            suffix = Path(entry).suffix
            stem = entry[:-len(suffix)] if suffix in EXTENSIONS else entry
            if entry.startswith(".") or entry.endswith("~") or stem in names:
                continue
            message = (f"no {what} {stem!r} in the inventory{suggest(stem, sorted(names))}: this is not read "
                       "(Ansible ignores it too)")
            self.doc.warnings.append(problem_line(self.folder / entry, 1, 1, FILE_KEY, message))


def find_vars_files(folder: Path, name: str, entries: set[str]) -> list[Path]:
    """ansible-core's DataLoader.find_vars_files: the first of NAME (a file or a folder), NAME.yml, NAME.yaml and
    NAME.json among `folder`'s `entries`; for a folder, its vars files."""
    for ext in ("", *EXTENSIONS):
        if f"{name}{ext}" in entries:
            path = folder / f"{name}{ext}"
            return _folder_files(path) if path.is_dir() else [path]
    return []


def _folder_files(folder: Path, seen: frozenset[Path] = frozenset()) -> list[Path]:
    """Every file in `folder` and its folders without an extension, sorted by name, whose name has no extension
    or a vars one, skipping hidden and backup files (DataLoader._get_dir_vars_files); a folder linked into itself
    is read once."""
    real = folder.resolve()
    if real in seen:
        return []
    found: list[Path] = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            found.extend(_folder_files(entry, seen | {real}))
        elif entry.is_file() and (not entry.suffix or entry.suffix in EXTENSIONS):
            found.append(entry)
    return found
