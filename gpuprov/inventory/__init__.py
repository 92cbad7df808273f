"""Load and validate inventories (native YAML, Ansible YAML, Ansible INI), select hosts, merge variables.

The modules, one job each:
    model        Host, Group, Inventory (selection, jump hosts), parse_jump, is_valid_address
    located      YAML read into data that keeps every value's and key's place
    diagnostics  how a problem is told: `FILE:LINE:COL: key path: message`, literal, credentials masked
    native       gpuprov's own format (defaults / groups / hosts)
    ansible      Ansible's YAML form (all: / children: / hosts: / vars:); patterns: its host ranges
    ini          Ansible's INI form, turned into the YAML form's document
    ansible_vars an Ansible inventory's group_vars/ and host_vars/ beside it
    ansible_program  `ansible-inventory --list` run as a program (load_inventory's plugin="ansible")
    settings     connection settings (address, port, user, identity_file, jump, sudo) and local paths
    checks       one checker per kind of value (address, CIDR, port, integer, number, percent, duration, URL,
                 host path, registry address, local path, input file)
    variables    the registry of variables: each capability declares what it reads (Spec, in its own
                 `variables` module: provision, harden, monitoring, validation, images)
    schema       each declared variable checked where it is written, by its kind; undeclared ones are data
    hardening    what the hardening variables must agree on once merged (a service open to a network variable)
    merge        group cycles, precedence, each host's merged settings and variables, jump checks
    slurm        a native inventory's `slurm:` source: nodes, partitions, gres, features and states from sinfo

The file is read only when it is a regular file (checked on the opened file: a pipe or /dev/zero is refused, not
read). Size guards, each checked before what it protects is read: the file's size (MAX_BYTES, before reading it),
the nesting depth (located.MAX_DEPTH, on the parser's events before any tree is built), what aliases add
(located.MAX_ALIAS_VALUES) and what host ranges add (patterns.MAX_RANGE_HOSTS, counted before expanding).

A file is read as INI when its name ends in `.ini` or its first line that is not blank or a comment is a
section header (`[gpus]`) or, in a file not named .yaml, .yml or .json, a host line (`bastion ansible_host=...`,
not a YAML key); as Ansible YAML when its top level has `all:`; else as the native format. An Ansible inventory
(INI or YAML) also takes the `group_vars/` and `host_vars/` beside it, in Ansible's precedence
(gpuprov.inventory.merge). With plugin="ansible" the inventory is what `ansible-inventory --list` says of the path
(gpuprov.inventory.ansible_program).
A native file with a `slurm:` source is read twice: alone first (every error in it is told before any host is
contacted), then, with Slurm's nodes from its controller (sinfo --json), merged below the file's own levels.
Paths (known_hosts, identity_file, mirror key_file and ca_file) expand `~`; relative paths are relative to
the inventory's folder; identity_file and ca_file must be regular files, and ca_file and key_file (copied to
hosts) hold no private key. Every problem found is collected,
each as `FILE:LINE:COL: key path: message`, and raised together as one InventoryError.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

from gpuprov.core.errors import InputError, literal
from gpuprov.inventory.ansible import read_ansible
from gpuprov.inventory.ansible_program import load_with_ansible
from gpuprov.inventory.ansible_vars import VarsDocument, read_vars_dirs
from gpuprov.inventory.checks import NotRegular, read_regular
from gpuprov.inventory.diagnostics import FILE_KEY, InventoryError, problem_line, type_name
from gpuprov.inventory.ini import looks_like_ini, read_ini
from gpuprov.inventory.levels import Levels
from gpuprov.inventory.located import Located, YamlTextError, compose, decode
from gpuprov.inventory.merge import build_inventory
from gpuprov.inventory.model import Group, Host, Inventory, is_valid_address, parse_jump
from gpuprov.inventory.native import read_native
from gpuprov.inventory.slurm import (
    NodeReader,
    SlurmSource,
    add_to_levels,
    check_controller,
    from_controller,
    no_hosts_problem,
    read_source,
)

__all__ = ["Group", "Host", "Inventory", "InventoryError", "is_valid_address", "load_inventory", "parse_jump"]

MAX_BYTES = 32 * 1024 * 1024
PLUGINS = ("gpuprov", "ansible")
YAML_SUFFIXES = (".yaml", ".yml", ".json")  # read as YAML unless a section header comes first


def load_inventory(path: str | Path, slurm: NodeReader | None = None, plugin: str | None = None) -> Inventory:
    """Load and validate an inventory file; InputError if it is missing, InventoryError if it is bad. A native file
    with a `slurm:` source gets Slurm's nodes too, read by `slurm` (by default sinfo --json on its controller,
    gpuprov.inventory.slurm.from_controller; a GpuprovError naming the controller when that fails). `plugin`:
    None or "gpuprov" reads the file; "ansible" runs `ansible-inventory --list` on it."""
    path = Path(path)
    if "\0" in str(path):
        raise InputError(f"inventory {literal(repr(str(path)))}: a path cannot hold a NUL character", step="inventory",
                         hint="give --inventory PATH")
    if plugin not in (None, *PLUGINS):
        raise InputError(f"unknown inventory plugin {literal(repr(plugin))}", step="inventory",
                         hint=f"give one of: {', '.join(PLUGINS)}")
    if plugin == "ansible":
        if not path.exists():
            raise InputError(f"inventory {literal(str(path))} not found", step="inventory",
                             hint="give --inventory PATH of a file or folder ansible-inventory reads")
        with _collector_paused():
            return load_with_ansible(path)
    try:
        data = read_regular(path, MAX_BYTES)  # a pipe, a device or a file over the bound: not a byte read
    except FileNotFoundError:
        raise InputError(f"inventory {literal(str(path))} not found", step="inventory",
                         hint="give --inventory PATH or set gpuprov.inventory in invoke.yaml "
                              "(inventories/example.yaml shows the format)") from None
    except NotRegular as exc:
        if exc.size is not None:
            too_big = (f"the file has {exc.size} bytes; gpuprov reads inventories of up to {MAX_BYTES} bytes "
                       f"({MAX_BYTES // 2**20} MiB)")
            raise InventoryError(path, [problem_line(path, 1, 1, FILE_KEY, too_big)]) from None
        raise InputError(f"inventory {literal(str(path))} {exc.reason}", step="inventory",
                         hint="give --inventory PATH of a regular file") from None
    except OSError as exc:
        raise InputError(f"cannot read inventory {literal(str(path))}: {exc.strerror}", step="inventory",
                         hint="check the file's permissions") from None
    with _collector_paused():
        return read_inventory(path, data, slurm)


def read_inventory(path: Path, data: bytes, slurm: NodeReader | None = None) -> Inventory:
    """The Inventory in `data`, the bytes of the file at `path`; InventoryError with every problem found. `slurm`:
    as load_inventory's."""
    base = path.parent.absolute()
    try:
        text = decode(data)
        doc = VarsDocument(path, aliases="*" in text)
        suffix = path.suffix.lower()
        if suffix == ".ini" or looks_like_ini(text, host_lines=suffix not in YAML_SUFFIXES):
            levels = read_ansible(doc, read_ini(doc, text), "no hosts: add a [group] section with host lines")
            read_vars_dirs(doc, levels, path.parent)
            return build_inventory(doc, levels, "ansible-ini", base)
        document = _yaml_document(doc, text)
    except YamlTextError as exc:
        raise InventoryError(path, [problem_line(path, exc.line, exc.col, FILE_KEY, exc.message)]) from None
    if "all" in document:
        levels = read_ansible(doc, document, "no hosts: add hosts: under all: or one of its children")
        read_vars_dirs(doc, levels, path.parent)
        return build_inventory(doc, levels, "ansible", base)
    source = read_source(doc, document)
    levels = read_native(doc, document, base)
    if source is None:
        return build_inventory(doc, levels, "native", base)
    return _with_slurm(path, text, doc, levels, source, slurm or from_controller)


def _with_slurm(path: Path, text: str, doc: Located, levels: Levels, source: SlurmSource,
                slurm: NodeReader) -> Inventory:
    """The file's inventory merged over Slurm's nodes. The file alone is checked first (its errors are told before
    any controller is asked) and gives the controller's settings; then it is read again with Slurm's levels below."""
    base = path.parent.absolute()
    check_controller(doc, source, levels.hosts)
    nodes = slurm(source, build_inventory(doc, levels, "native", base))
    doc = Located(path, aliases="*" in text)
    levels = read_native(doc, _yaml_document(doc, text), base)
    below = add_to_levels(doc, levels, source, nodes)
    if not levels.hosts:
        doc.error(("slurm",), no_hosts_problem(source, nodes), at_key=True)
    return build_inventory(doc, levels, "native+slurm", base, below)


def _yaml_document(doc: Located, text: str) -> dict:
    """The top-level mapping of a YAML inventory (its node tree is freed on return, before the hosts are built)."""
    root = compose(text)
    if root is None:
        raise YamlTextError(1, 1, "the file is empty; an inventory needs a hosts: mapping (inventories/example.yaml "
                                  "shows the format)")
    document = doc.construct(root)
    if not isinstance(document, dict):
        doc.error((), f"the top level must be a mapping with hosts:, groups:, defaults: (or an Ansible inventory "
                      f"with all:), not {type_name(document)}; an Ansible INI inventory starts with a [group] "
                      "line or has a name ending in .ini")
        raise InventoryError(doc.file, doc.problems())
    return document


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while an inventory is built: reading creates many objects and
    next to no cycles, and a large fleet loads several times faster without the collector's repeated scans."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
