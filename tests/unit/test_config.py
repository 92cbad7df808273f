"""invoke.yaml and INVOKE_GPUPROV_* variables are checked before any task does anything: every bad form is
exit 2 with `FILE:LINE:COL: gpuprov.KEY: message` (or the variable's name) and what the setting accepts, no
traceback, no host contacted and nothing written — under the gpuprov program, under `invoke`, in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from invoke import Config, Context
from invoke.exceptions import Exit

from gpuprov import __version__
from gpuprov.core.config import settings
from gpuprov.program import GpuprovProgram
from gpuprov.tasks import facts as facts_tasks
from gpuprov.tasks import inventory as inventory_tasks
from gpuprov.tasks import lab as lab_tasks
from gpuprov.tasks import namespace
from gpuprov.tasks import provision as provision_tasks
from gpuprov.tasks import stack as stack_tasks

REPO = Path(__file__).resolve().parents[2]
INVENTORY = textwrap.dedent("""\
    groups:
      hgx:
        vars:
          hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
    hosts:
      gpu01: {address: 192.0.2.11, groups: [hgx]}
    """)
KEYS = ("inventory, parallel, connect_timeout, connect_retries, command_timeout, confirm_timeout, known_hosts, "
        "ssh_config, reports, locks, wheelhouse")
ENV_KEYS = ("INVOKE_GPUPROV_INVENTORY, INVOKE_GPUPROV_PARALLEL, INVOKE_GPUPROV_CONNECT_TIMEOUT, "
            "INVOKE_GPUPROV_CONNECT_RETRIES, INVOKE_GPUPROV_COMMAND_TIMEOUT, INVOKE_GPUPROV_CONFIRM_TIMEOUT, "
            "INVOKE_GPUPROV_KNOWN_HOSTS, INVOKE_GPUPROV_SSH_CONFIG, INVOKE_GPUPROV_REPORTS, INVOKE_GPUPROV_LOCKS, "
            "INVOKE_GPUPROV_WHEELHOUSE")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No INVOKE_* variable and no ~/.invoke.yaml of the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("INVOKE_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


@pytest.fixture
def contacted(monkeypatch) -> list:
    """Every call of the executor (the only way to a host); a test of bad input expects none."""
    import gpuprov.core.executor

    calls: list = []

    def record(hosts, work, settings, **kwargs):
        calls.append((hosts, settings))
        return []

    monkeypatch.setattr(gpuprov.core.executor, "run_on_hosts", record)
    return calls


@pytest.fixture
def project(tmp_path) -> Path:
    """A working folder with an inventory and a settings file naming folders inside it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "inventory.yaml").write_text(INVENTORY)
    return folder


def gpuprov_section(project: Path, **overrides) -> str:
    values = {"inventory": str(project / "inventory.yaml"), "reports": str(project / "reports"),
              "locks": str(project / "locks"), "known_hosts": str(project / "known_hosts"), **overrides}
    return "gpuprov:\n" + "".join(f"  {key}: {value}\n" for key, value in values.items())


def context(project: Path, text: str) -> Context:
    """An Invoke context that has read PROJECT/invoke.yaml, as `invoke` and `gpuprov` do."""
    (project / "invoke.yaml").write_text(text)
    config = Config(project_location=str(project), lazy=True)
    config.load_project()
    return Context(config)


def untouched(project: Path, contacted: list) -> bool:
    return contacted == [] and not (project / "reports").exists() and not (project / "locks").exists()


def run_gpuprov(project: Path, monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """The gpuprov console script, in-process, run from the project folder: (exit code, stdout, stderr)."""
    monkeypatch.chdir(project)
    program = GpuprovProgram(namespace=namespace(), version=__version__, name="gpuprov", binary="gpuprov")
    try:
        program.run(["gpuprov", *argv])
        code = 0
    except SystemExit as stop:
        code = stop.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def run_invoke(project: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The plain `invoke` binary on a copy of the repository's tasks.py (beside the test's invoke.yaml)."""
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    environ = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    environ.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=project, env=environ,
                          capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------------ values Invoke merges

VALUE_CASES = [
    ("parallel", "many", "3:13: gpuprov.parallel: must be a whole number >= 1, not 'many'"),
    ("parallel", "0", "3:13: gpuprov.parallel: must be a whole number >= 1, not 0"),
    ("parallel", '"16"', "3:13: gpuprov.parallel: must be a whole number >= 1, not '16' "
                         "(a string: write the number without quotes)"),
    ("parallel", "true", "3:13: gpuprov.parallel: must be a whole number >= 1, not true"),
    ("parallel", "2.5", "3:13: gpuprov.parallel: must be a whole number >= 1, not 2.5"),
    ("connect_timeout", "-5", "3:20: gpuprov.connect_timeout: must be a whole number of seconds >= 1, not -5"),
    ("connect_timeout", "0", "3:20: gpuprov.connect_timeout: must be a whole number of seconds >= 1, not 0"),
    ("command_timeout", "0", "3:20: gpuprov.command_timeout: must be a whole number of seconds >= 1, not 0"),
    ("connect_retries", "-1", "3:20: gpuprov.connect_retries: must be a whole number >= 0 (0: no retry), not -1"),
    ("inventory", "null", "3:14: gpuprov.inventory: must be a path (a non-empty string), not null"),
    ("inventory", '""', "3:14: gpuprov.inventory: must be a path (a non-empty string), not ''"),
    ("known_hosts", "[a, b]", "3:16: gpuprov.known_hosts: must be a path (a non-empty string), not a list"),
    ("reports", "2024", "3:12: gpuprov.reports: must be a path (a non-empty string), not 2024 "
                        "(a number: quote it to use it as a path)"),
]


def bad_value_file(project: Path, key: str, value: str) -> str:
    """Line 3 holds the bad value; the other lines point the paths into the project folder."""
    rest = "".join(line + "\n" for line in gpuprov_section(project).splitlines()[1:]
                   if not line.startswith(f"  {key}:"))
    return f"# settings\ngpuprov:\n  {key}: {value}\n{rest}"


@pytest.mark.parametrize(("key", "value", "message"), VALUE_CASES)
def test_a_bad_value_in_invoke_yaml_is_located_bad_input(project, contacted, capsys, key, value, message):
    c = context(project, bad_value_file(project, key, value))
    with pytest.raises(Exit) as caught:
        facts_tasks.facts(c, host=["gpu01"])
    err = capsys.readouterr().err
    assert caught.value.code == 2
    assert err == f"error: {project / 'invoke.yaml'}:{message}\n"
    assert untouched(project, contacted)


def test_every_bad_key_is_reported_at_once_with_its_line(project, contacted, capsys):
    c = context(project, textwrap.dedent("""\
        gpuprov:
          paralel: 8
          parallel: x
          connect_retries: -2
        """))
    with pytest.raises(Exit) as caught:
        provision_tasks.provision(c, host=["gpu01"])
    path = project / "invoke.yaml"
    assert caught.value.code == 2
    assert capsys.readouterr().err == (
        "error: 3 errors in the gpuprov settings:\n"
        f"  {path}:2:3: gpuprov.paralel: unknown setting (did you mean parallel?); gpuprov reads: {KEYS}\n"
        f"  {path}:3:13: gpuprov.parallel: must be a whole number >= 1, not 'x'\n"
        f"  {path}:4:20: gpuprov.connect_retries: must be a whole number >= 0 (0: no retry), not -2\n")
    assert untouched(project, contacted)


def test_connect_retries_may_be_zero_and_the_values_reach_the_executor(project, contacted):
    c = context(project, gpuprov_section(project, connect_retries=0, parallel=3, connect_timeout=4,
                                         command_timeout=60))
    facts_tasks.facts(c, host=["gpu01"])
    [(_, used)] = contacted
    assert (used.parallel, used.connect_timeout, used.connect_retries, used.command_timeout) == (3, 4, 0, 60)
    assert used.known_hosts == project / "known_hosts"


def test_paths_expand_the_home_folder(project, monkeypatch):
    c = context(project, "gpuprov:\n  reports: ~/gpu-reports\n")
    assert settings(c).reports == Path(os.environ["HOME"]) / "gpu-reports"


# Every task checks the settings before anything else, including those that touch no host.
EVERY_TASK = [
    (facts_tasks.facts, {"host": ["gpu01"]}),
    (provision_tasks.provision, {"host": ["gpu01"]}),
    (provision_tasks.preflight, {"host": ["gpu01"]}),
    (stack_tasks.lock, {"host": ["gpu01"], "os": "debian-12"}),
    (stack_tasks.check, {"host": ["gpu01"]}),
    (stack_tasks.resolve, {"gpu": "H100-SXM", "os": "debian-12"}),
    (stack_tasks.matrix, {}),
    (inventory_tasks.check, {}),
    (inventory_tasks.show, {"host": "gpu01"}),
    (lab_tasks.up, {"hosts": "0"}),
    (lab_tasks.status, {}),
    (lab_tasks.down, {}),
]


@pytest.mark.parametrize(("task", "kwargs"), EVERY_TASK, ids=lambda v: getattr(v, "name", ""))
def test_every_task_checks_the_settings_first(project, contacted, capsys, task, kwargs):
    c = context(project, gpuprov_section(project, command_timeout=0))
    with pytest.raises(Exit) as caught:
        task(c, **kwargs)
    assert caught.value.code == 2
    assert capsys.readouterr().err == (f"error: {project / 'invoke.yaml'}:6:20: gpuprov.command_timeout: "
                                       "must be a whole number of seconds >= 1, not 0\n")
    assert untouched(project, contacted)


# ------------------------------------------------------------------------------- files Invoke cannot merge

BROKEN_FILES = [
    ("gpuprov:\n  parallel: [1\n", "3:1: (file): YAML syntax error: expected ',' or ']', but got '<stream end>' "
                                   "(while parsing a flow sequence at line 2, column 13)"),
    ("- gpuprov\n- parallel\n", "1:1: (top level): must be a mapping (gpuprov: and Invoke's sections), "
                                "not a list"),
    ("gpuprov: 3\n", f"1:10: gpuprov: must be a mapping of gpuprov settings ({KEYS}), not 3"),
    ("gpuprov:\n", f"1:9: gpuprov: must be a mapping of gpuprov settings ({KEYS}), not null"),
    ("gpuprov: [parallel]\n", f"1:10: gpuprov: must be a mapping of gpuprov settings ({KEYS}), not a list"),
    ("gpuprov:\n  parallel: {max: 4}\n", "2:13: gpuprov.parallel: must be a whole number >= 1, not a mapping"),
    ("run: 3\n", "1:6: run: must be a mapping (Invoke's run setting)"),
    ("tasks: {dedupe: {a: 1}}\n", "1:17: tasks.dedupe: must be a single value, not a mapping "
                                  "(Invoke's tasks.dedupe setting)"),
    ("? [a]\n: 1\n", "1:3: (file): cannot read the YAML: found unhashable key "
                     "(while constructing a mapping at line 1, column 1)"),
    ("gpuprov: {parallel: !!int x}\n", "1:21: (file): cannot read the YAML: invalid literal for int() with base "
                                       "10: 'x'"),
    ("gpuprov:\n  parallel: \x00\n", "2:13: (file): character '\\x00' is not allowed in YAML"),
    ("gpuprov: {}\n1: x\n", "2:1: 1: a section's name must be text"),
    ("run:\n  1: x\n", "2:3: run.1: a setting's name must be text"),
]


@pytest.mark.parametrize(("text", "message"), BROKEN_FILES)
def test_a_file_invoke_cannot_read_is_located_bad_input_under_gpuprov(project, monkeypatch, capsys, contacted,
                                                                      text, message):
    (project / "invoke.yaml").write_text(text)
    code, out, err = run_gpuprov(project, monkeypatch, capsys, "facts", "--host", "gpu01",
                                 "--inventory", str(project / "inventory.yaml"))
    assert (code, out) == (2, "")
    assert err == f"error: {project / 'invoke.yaml'}:{message}\n"
    assert untouched(project, contacted)


def test_a_file_that_is_not_utf8_or_not_a_file(project, monkeypatch, capsys):
    (project / "invoke.yaml").write_bytes(b"gpuprov:\n  inventory: caf\xe9\n")
    code, _, err = run_gpuprov(project, monkeypatch, capsys, "inventory.check")
    assert (code, err) == (2, f"error: {project / 'invoke.yaml'}:2:17: (file): not UTF-8 text\n")
    (project / "invoke.yaml").unlink()
    (project / "invoke.yaml").mkdir()
    code, _, err = run_gpuprov(project, monkeypatch, capsys, "inventory.check")
    assert (code, err) == (2, f"error: {project / 'invoke.yaml'}: not a file\n")


def test_an_invoke_json_is_checked_too(project, monkeypatch, capsys):
    path = project / "invoke.json"
    path.write_text('{\n\t"gpuprov": {"parallel": 0, "inventory": "inventory.yaml"}\n}\n')
    code, _, err = run_gpuprov(project, monkeypatch, capsys, "inventory.check")
    assert (code, err) == (2, f"error: {path}: gpuprov.parallel: must be a whole number >= 1, not 0\n")
    path.write_text('{"gpuprov": {"parallel": 4}\n')
    code, _, err = run_gpuprov(project, monkeypatch, capsys, "inventory.check")
    assert (code, err) == (2, f"error: {path}:2:1: (file): JSON syntax error: Expecting ',' delimiter\n")
    path.write_text('{\n\t"gpuprov": {"parallel": 4, "inventory": "inventory.yaml"}\n}\n')
    code, out, _ = run_gpuprov(project, monkeypatch, capsys, "inventory.check")
    assert code == 0 and out.startswith("inventory.yaml: ok")


def test_the_users_invoke_yaml_and_a_runtime_file_are_checked_too(project, monkeypatch, capsys):
    (Path(os.environ["HOME"]) / ".invoke.yaml").write_text("gpuprov: [1]\n")
    code, _, err = run_gpuprov(project, monkeypatch, capsys, "inventory.check")
    user_file = Path(os.environ["HOME"]) / ".invoke.yaml"
    assert (code, err) == (2, f"error: {user_file}:1:10: gpuprov: must be a mapping of gpuprov settings "
                              f"({KEYS}), not a list\n")
    user_file.unlink()
    code, _, err = run_gpuprov(project, monkeypatch, capsys, "-f", str(project / "missing.yaml"), "inventory.check")
    assert (code, err) == (2, f"error: {project / 'missing.yaml'}: no such config file\n")


def test_a_broken_file_under_json_is_one_json_document_on_stdout(project, monkeypatch, capsys):
    (project / "invoke.yaml").write_text("gpuprov:\n  parallel: -1\n")
    code, out, err = run_gpuprov(project, monkeypatch, capsys, "facts", "--host", "gpu01", "--json")
    message = f"{project / 'invoke.yaml'}:2:13: gpuprov.parallel: must be a whole number >= 1, not -1"
    assert code == 2 and err == f"error: {message}\n"
    assert json.loads(out) == {"error": message, "host": None, "step": None, "command": None, "output": None,
                               "hint": None, "exit_code": 2, "errors": [message]}


@pytest.mark.parametrize(("text", "message"), [BROKEN_FILES[0], BROKEN_FILES[1], BROKEN_FILES[2]])
def test_a_file_invoke_cannot_read_is_located_bad_input_under_invoke(project, text, message):
    (project / "invoke.yaml").write_text(text)
    proc = run_invoke(project, "facts", "--host", "gpu01")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: {project / 'invoke.yaml'}:{message}\n"
    assert not (project / "reports").exists()


# ------------------------------------------------------------------------------------ environment overrides

ENV_CASES = [
    ("INVOKE_GPUPROV_PARALLEL", "-1", "INVOKE_GPUPROV_PARALLEL: must be a whole number >= 1, not '-1'"),
    ("INVOKE_GPUPROV_PARALLEL", "0", "INVOKE_GPUPROV_PARALLEL: must be a whole number >= 1, not 0"),
    ("INVOKE_GPUPROV_CONNECT_TIMEOUT", "abc",
     "INVOKE_GPUPROV_CONNECT_TIMEOUT: must be a whole number of seconds >= 1, not 'abc'"),
    ("INVOKE_GPUPROV_CONNECT_RETRIES", "1.5",
     "INVOKE_GPUPROV_CONNECT_RETRIES: must be a whole number >= 0 (0: no retry), not '1.5'"),
    ("INVOKE_GPUPROV_COMMAND_TIMEOUT", "\u0663",
     "INVOKE_GPUPROV_COMMAND_TIMEOUT: must be a whole number of seconds >= 1, not '\u0663'"),
    ("INVOKE_GPUPROV_INVENTORY", "", "INVOKE_GPUPROV_INVENTORY: must be a path (a non-empty string), not ''"),
    ("INVOKE_GPUPROV_PARALEL", "8",
     f"INVOKE_GPUPROV_PARALEL: unknown setting (did you mean INVOKE_GPUPROV_PARALLEL?); gpuprov reads: {ENV_KEYS}"),
]


@pytest.mark.parametrize(("name", "value", "message"), ENV_CASES)
def test_a_bad_environment_override_is_bad_input_in_process(project, monkeypatch, capsys, contacted, name, value,
                                                            message):
    monkeypatch.setenv(name, value)
    c = context(project, gpuprov_section(project))
    with pytest.raises(Exit) as caught:
        provision_tasks.provision(c, host=["gpu01"])
    assert caught.value.code == 2 and capsys.readouterr().err == f"error: {message}\n"
    assert untouched(project, contacted)


@pytest.mark.parametrize(("name", "value", "message"), [ENV_CASES[0], ENV_CASES[2]])
def test_a_bad_environment_override_is_bad_input_under_both_programs(project, monkeypatch, capsys, contacted, name,
                                                                     value, message):
    (project / "invoke.yaml").write_text(gpuprov_section(project))
    proc = run_invoke(project, "facts", "--host", "gpu01", env={name: value})
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {message}\n")
    monkeypatch.setenv(name, value)
    assert run_gpuprov(project, monkeypatch, capsys, "facts", "--host", "gpu01") == (2, "", f"error: {message}\n")
    assert untouched(project, contacted)


def test_good_environment_overrides_reach_the_executor(project, monkeypatch, capsys, contacted):
    (project / "invoke.yaml").write_text(gpuprov_section(project))
    monkeypatch.setenv("INVOKE_GPUPROV_PARALLEL", "7")
    monkeypatch.setenv("INVOKE_GPUPROV_CONNECT_RETRIES", "0")
    code, _, _ = run_gpuprov(project, monkeypatch, capsys, "facts", "--host", "gpu01", "--json")
    [(hosts, used)] = contacted
    assert code == 0 and [h.name for h in hosts] == ["gpu01"]
    assert (used.parallel, used.connect_retries) == (7, 0)
