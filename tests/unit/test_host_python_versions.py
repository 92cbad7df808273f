"""Every Python program gpuprov runs on hosts and in images runs on the Pythons the supported systems ship: 3.9
(RHEL/Rocky 9, Debian bullseye), 3.10 (Ubuntu 22.04, NGC images up to 24.x), 3.11, 3.12 (Ubuntu 24.04) and 3.13
(Debian trixie).

The judges are outside the code: vermin (PyPI), which knows the release that brought each language feature and
standard-library name, over the files and over the scripts gpuprov sends as `python3 -c`; and, where this
machine has them, the other interpreters themselves, which run the suite's host checks against the lab's
simulated nvidia-smi and must give the verdicts the controller's own Python gives.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.pythons import INTERPRETERS, MINORS, OLDER, lab_host, vermin

from gpuprov.core.connection import Result
from gpuprov.core.errors import GpuprovError
from gpuprov.images import verify
from gpuprov.lab import nested, registry, standins
from gpuprov.validation import Layout, env, multinode
from gpuprov.validation.remote import Remote

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "gpuprov" / "smoke"
# the scripts gpuprov sends to hosts and images as `python3 -c SCRIPT`
SCRIPTS = {"validation.env.PROBE": env.PROBE, "validation.env.STAGE": env.STAGE,
           "validation.multinode.LISTENER": multinode.LISTENER,
           "validation.multinode.OWN_ADDRESS": multinode.OWN_ADDRESS,
           "validation.multinode.CONNECTOR": multinode.CONNECTOR, "images.verify.PROBE": verify.PROBE,
           "lab.nested.SCRIPT": nested.SCRIPT, "lab.registry.TRUST_SCRIPT": registry.TRUST_SCRIPT}


def host_files() -> list[Path]:
    """The Python files that run on hosts and in images: the suite (copied to hosts and images), the all-reduce
    worker, the passive health check (gpuprov-health), and the lab hosts' programs (the stand-ins written in
    Python, lspci)."""
    standin_programs = sorted(p for p in standins.FILES.iterdir()
                              if p.is_file() and p.read_bytes().startswith(b"#!/usr/bin/python3"))
    return [*sorted(SUITE.glob("*.py")), REPO / "gpuprov/validation/allreduce_worker.py",
            REPO / "gpuprov/health/check.py", REPO / "gpuprov/lab/pci.py", *standin_programs]


def _module_names(tree: ast.Module) -> dict[str, str]:
    """The names a module binds to modules it imports (`import os`, `import xml.etree.ElementTree as ET`)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    names[alias.name.split(".")[0]] = alias.name.split(".")[0]
    return names


def _int_flags(node: ast.AST, modules: dict[str, str]) -> bool:
    """`node` is `module.NAME | module.NAME ...` whose operands Python's own modules hold as integers (os.O_RDONLY,
    os.WNOHANG): bit flags, not types."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _int_flags(node.left, modules) and _int_flags(node.right, modules)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
        try:
            return isinstance(getattr(importlib.import_module(modules[node.value.id]), node.attr), int)
        except (ImportError, AttributeError):
            return False
    return False


def union_rule_copy(source: str) -> str:
    """`source` as vermin's union-type rule (`X | Y` between types needs 3.10) can judge it, on the same lines:
    an annotation Python never evaluates (a module under `from __future__ import annotations`, PEP 563) becomes
    `(object)`, and `a | b` between integer flags of a standard module (os.O_CREAT | os.O_TRUNC) becomes `(0)`; the
    rule reads both as unions of types, the first as if it ran."""
    tree = ast.parse(source)
    spans = []
    if any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
           and any(alias.name == "annotations" for alias in node.names) for node in tree.body):
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None:
                spans.append((node.annotation, b"object"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
                spans.append((node.returns, b"object"))
            elif isinstance(node, ast.AnnAssign):
                spans.append((node.annotation, b"object"))
    modules = _module_names(tree)
    spans += [(node, b"0") for node in ast.walk(tree) if isinstance(node, ast.BinOp) and _int_flags(node, modules)]
    kept, end = [], (0, 0)
    for node, text in sorted(spans, key=lambda s: (s[0].lineno, s[0].col_offset, -s[0].end_lineno,
                                                   -s[0].end_col_offset)):
        if (node.lineno, node.col_offset) >= end:   # not inside a span kept already
            kept.append((node, text))
            end = (node.end_lineno, node.end_col_offset)
    lines = [line.encode() for line in source.splitlines(keepends=True)]   # ast's columns count UTF-8 bytes
    for node, text in reversed(kept):
        first, last = node.lineno - 1, node.end_lineno - 1
        head, tail = lines[first][: node.col_offset], lines[last][node.end_col_offset:]
        lines[first: last + 1] = [head + b"(" + text + b"\n" * (last - first) + b")" + tail]
    return "".join(line.decode() for line in lines)


def copies_for_union_rule(paths: list[Path], folder: Path) -> list[Path]:
    folder.mkdir()
    out = []
    for path in paths:
        copy = folder / f"{path.parent.name}__{path.name}"
        copy.write_text(union_rule_copy(path.read_text(encoding="utf-8")), encoding="utf-8")
        out.append(copy)
    return out


def script_files(folder: Path) -> list[Path]:
    folder.mkdir()
    out = []
    for name, text in SCRIPTS.items():
        (folder / f"{name}.py").write_text(text, encoding="utf-8")
        out.append(folder / f"{name}.py")
    return out


# ---- vermin -------------------------------------------------------------------------------------------------------


def test_the_host_files_are_the_ones_gpuprov_ships():
    names = {p.relative_to(REPO).as_posix() for p in host_files()}
    assert {"gpuprov/smoke/runner.py", "gpuprov/smoke/ddp_worker.py", "gpuprov/validation/allreduce_worker.py",
            "gpuprov/health/check.py", "gpuprov/lab/files/standins/nvidia-smi",
            "gpuprov/lab/files/standins/dcgmi"} <= names
    for text in SCRIPTS.values():
        ast.parse(text)


def test_vermin_finds_nothing_newer_than_3_9(tmp_path):
    files = [*host_files(), *script_files(tmp_path / "scripts")]
    # every rule on every line (no `# novm` exemption)
    assert vermin(files, "--no-parse-comments") == []
    # and `X | Y` between types, which 3.9 cannot evaluate, where Python evaluates it
    assert vermin(copies_for_union_rule(files, tmp_path / "copies"), "--feature", "union-types") == []


def test_vermin_as_used_here_finds_what_3_9_lacks(tmp_path):
    """The judge fails code that 3.9 cannot run (the suite's runner once used datetime.UTC, 3.11+)."""
    source = tmp_path / "new.py"
    source.write_text("\n".join([
        "from __future__ import annotations",
        "import datetime",
        "def when(tz: datetime.tzinfo | None = None) -> str | None:",   # never evaluated: fine on 3.9
        "    return str(datetime.datetime.now(datetime.UTC))",
        "def pairs(a, b):",
        "    return dict(zip(a, b, strict=True))",
        "def number(value):",
        "    return isinstance(value, int | float)",
        "Optional = str | None",
        "import os",
        "FLAGS = os.O_CREAT | os.O_TRUNC",   # integers: fine on 3.9
        ""]))
    found = vermin([source], "--no-parse-comments")
    assert [line.split(":")[1] for line in found] == ["4", "6"]
    assert "'datetime.UTC' member" in found[0] and "'zip(strict)'" in found[1]
    (copy,) = copies_for_union_rule([source], tmp_path / "copies")
    unions = vermin([copy], "--feature", "union-types")
    assert [line.split(":")[1] for line in unions if "union types" in line] == ["8", "9"]


# ---- the interpreters themselves ----------------------------------------------------------------------------------


def needs_python(minor: int):
    return pytest.param(minor, id=f"python3.{minor}", marks=pytest.mark.skipif(
        INTERPRETERS[minor] is None, reason=f"no Python 3.{minor} on this machine (PATH, /usr/bin, pyenv)"))


def run_host_checks(tmp_path: Path, python: str) -> tuple[int, dict, str]:
    """The suite copied as a plain folder (as validate copies it to a host), its checks that need no torch run
    with `python`: `python -m smoke --only host,sizing,tools`."""
    folder = tmp_path / "suite"
    shutil.copytree(SUITE, folder / "smoke", ignore=shutil.ignore_patterns("__pycache__"))
    environment, config = lab_host(tmp_path, python)
    done = subprocess.run([python, "-m", "smoke", "--config", str(config), "--only", "host,sizing,tools"],
                          cwd=folder, env=environment, capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.returncode, json.loads(lines[0]), done.stderr


# Run by each interpreter: every file compiles (a SyntaxWarning, such as an invalid escape, counts), and every
# standard module the files import exists (3.12 dropped distutils and imp, 3.13 the PEP 594 modules).
COMPILE_AND_FIND = r"""
import importlib.util, json, sys, warnings
files, modules = json.load(sys.stdin)
problems = []
for path in files:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            compile(text, path, "exec")
        except (SyntaxError, SyntaxWarning) as exc:
            problems.append("%s: %s: %s" % (path, type(exc).__name__, exc))
problems += ["no module %s" % name for name in modules if importlib.util.find_spec(name) is None]
print(json.dumps(problems))
"""


def standard_modules(files: list[Path]) -> list[str]:
    """The standard-library modules `files` import (top-level names), as this Python's library lists them."""
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                names.add(node.module.split(".")[0])
    return sorted(names & sys.stdlib_module_names)


@pytest.mark.interpreters
@pytest.mark.parametrize("minor", [needs_python(m) for m in MINORS])
def test_every_supported_python_compiles_the_host_code_and_has_its_modules(tmp_path, minor):
    files = [*host_files(), *script_files(tmp_path / "scripts")]
    modules = standard_modules(files)
    assert {"json", "os", "subprocess", "xml"} <= set(modules)
    done = subprocess.run([INTERPRETERS[minor], "-I", "-c", COMPILE_AND_FIND], input=json.dumps(
        [[str(p) for p in files], modules]), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.interpreters
@pytest.mark.skipif(INTERPRETERS[9] is None or INTERPRETERS[13] is None, reason="needs Python 3.9 and 3.13 here")
def test_the_interpreters_as_used_here_refuse_what_they_lack(tmp_path):
    source = tmp_path / "new.py"
    source.write_text("match 1:\n    case 1:\n        pass\n")
    ask = json.dumps([[str(source)], ["distutils", "json"]])
    oldest, newest = (subprocess.run([INTERPRETERS[m], "-I", "-c", COMPILE_AND_FIND], input=ask, capture_output=True,
                                     text=True, timeout=60, check=True).stdout for m in (9, 13))
    assert json.loads(oldest) == [f"{source}: SyntaxError: invalid syntax (new.py, line 1)"]   # match is 3.10+
    assert json.loads(newest) == ["no module distutils"]                                       # gone in 3.12


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The verdicts of the controller's own Python (3.11+), the one every other test of the suite runs with."""
    return run_host_checks(tmp_path_factory.mktemp("reference"), sys.executable)


@pytest.mark.interpreters
@pytest.mark.parametrize("minor", [needs_python(m) for m in MINORS])
def test_the_suite_runs_its_host_checks_on_every_supported_python(tmp_path, reference, minor):
    python = INTERPRETERS[minor]
    rc, doc, stderr = run_host_checks(tmp_path, python)
    assert doc["versions"]["python"].startswith(f"3.{minor}.")
    assert doc["started"].endswith("+00:00")
    results = {r["check"]: r for r in doc["results"]}
    assert not [name for name in results if name.startswith("import:")], stderr   # every module imports
    assert not [r["reason"] for r in results.values() if "the check raised" in r["reason"]], stderr
    assert results["host.gpus"]["status"] == "pass", results["host.gpus"]
    ref_rc, ref_doc, _ = reference
    verdicts = {r["check"]: (r["status"], r["reason"]) for r in ref_doc["results"]}
    assert {name: (r["status"], r["reason"]) for name, r in results.items()} == verdicts
    assert rc == ref_rc


# ---- the host's Python, probed before anything else ---------------------------------------------------------------


class Host:
    """This machine as the host, its python3 the interpreter given: the probe runs for real with `sh -c` (the
    root-ownership checks, `-I`, the probe script), only the system PATH's lookup answers with that interpreter."""

    def __init__(self, python: str):
        self.host = SimpleNamespace(name="lab01", user="root", address="127.0.0.1")
        self.python = python

    def run(self, command, *, sudo=False, timeout=None, stdin=None):
        lookup = f"p=$(PATH={env.SYSTEM_PATH} command -v python3)"
        assert command.count(lookup) == 1
        command = command.replace(lookup, f"p={shlex.quote(self.python)}")
        done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True,
                              timeout=timeout or 60, check=False)
        return Result(command, done.returncode, done.stdout, done.stderr, 0.0)


@pytest.mark.interpreters
@pytest.mark.parametrize("minor", [needs_python(m) for m in OLDER])
def test_a_host_python_older_than_3_9_is_refused_by_name(tmp_path, minor):
    python = os.path.realpath(INTERPRETERS[minor])
    with pytest.raises(GpuprovError) as caught:
        env.probe_host(Remote(Host(python)), Layout(root=str(tmp_path / "opt")))
    error = caught.value
    assert error.message == f"the host's python3 is Python 3.{minor} ({python}); the suite needs Python 3.9 or newer"
    assert (error.host, error.step) == ("lab01", "python env") and "-I -c" in error.command
    assert "--image" in error.hint and "alternatives --set python3" in error.hint


@pytest.mark.interpreters
@pytest.mark.parametrize("minor", [needs_python(m) for m in MINORS])
def test_every_supported_host_python_passes_the_probe(tmp_path, minor):
    python = os.path.realpath(INTERPRETERS[minor])
    found = env.probe_host(Remote(Host(python)), Layout(root=str(tmp_path / "opt")))
    assert (found.path, found.version) == (python, f"3.{minor}")
