"""Tests say what they need: a test whose skip condition asks for root (`os.geteuid() != 0`), a tool on PATH
(`shutil.which`) or another Python (`INTERPRETERS`) carries the marker that deselects it (`root`, `tool`,
`interpreters`), so `pytest -m "not root and not tool and not docker and not interpreters and not lab"` runs what
needs nothing. The conditions are read from the test files' own text (decorators, module `pytestmark`, and the
names they use, such as tests/judges.py's `needs_sshd`)."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent
JUDGES = UNIT.parent / "judges.py"
NEEDS = {"root": ("geteuid() != 0",), "tool": ("shutil.which(", "os.path.exists(SSHD)"),
         "interpreters": ("INTERPRETERS[", "PY39 is None")}


def definitions(tree: ast.Module, source: str) -> dict[str, tuple[str, ast.AST]]:
    """Module-level names (assignments and functions): their source text and node."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = (ast.get_source_segment(source, node.value), node.value)
        elif isinstance(node, ast.FunctionDef):
            found[node.name] = (ast.get_source_segment(source, node), node)
    return found


def expanded(nodes: list[ast.AST], names: dict[str, tuple[str, ast.AST]], seen: frozenset = frozenset()) -> str:
    """The source of every module-level name `nodes` use, recursively."""
    used = {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)} - seen
    return "".join(names[name][0] + expanded([names[name][1]], names, seen | used)
                   for name in sorted(used) if name in names)


def unmarked(source: str, shared: dict[str, tuple[str, ast.AST]]) -> list[str]:
    """`test: needs` for every test whose skip conditions need something its markers do not say."""
    tree = ast.parse(source)
    names = {**shared, **definitions(tree, source)}
    module = [node.value for node in tree.body if isinstance(node, ast.Assign)
              and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "pytestmark"]
    problems = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
            continue
        decorators = [*module, *node.decorator_list]
        conditions = "".join(ast.get_source_segment(source, d) for d in decorators) + expanded(decorators, names)
        marks = {d.attr for top in decorators for d in ast.walk(top)
                 if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Attribute) and d.value.attr == "mark"}
        needed = {mark for mark, signs in NEEDS.items() if any(sign in conditions for sign in signs)}
        problems += [f"{node.name}: {mark}" for mark in sorted(needed - marks)]
    return problems


def shared_names() -> dict[str, tuple[str, ast.AST]]:
    source = JUDGES.read_text()
    return definitions(ast.parse(source), source)


def test_every_test_that_skips_without_root_a_tool_or_another_python_is_marked_so():
    shared = shared_names()
    found = {path.name: unmarked(path.read_text(), shared) for path in sorted(UNIT.glob("test_*.py"))}
    assert {name: problems for name, problems in found.items() if problems} == {}


def test_a_skip_without_its_marker_is_found():
    source = ("import os, shutil\nimport pytest\nfrom judges import needs_sshd\n"
              "needs_apt = pytest.mark.skipif(shutil.which('apt-config') is None, reason='no apt')\n\n"
              "@needs_apt\ndef test_apt(): pass\n\n"
              "@pytest.mark.skipif(os.geteuid() != 0, reason='root')\n@pytest.mark.tool\ndef test_root(): pass\n\n"
              "@needs_sshd\n@pytest.mark.root\ndef test_sshd(): pass\n\n"
              "@pytest.mark.tool\n@needs_apt\ndef test_marked(): pass\n\n"
              "@pytest.mark.skipif(os.geteuid() == 0, reason='root may write anywhere')\ndef test_not_root(): pass\n")
    assert unmarked(source, shared_names()) == ["test_apt: tool", "test_root: root", "test_sshd: tool"]
