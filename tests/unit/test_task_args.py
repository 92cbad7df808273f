"""Task arguments: a bad value or an unknown flag is exit 2 naming the setting and what it accepts, before any
host is contacted and with nothing written; with --json, stdout is exactly one strict JSON document, an error
included (NaN and Infinity become null)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from invoke import Collection, Config, Context, task
from invoke.exceptions import Exit

from gpuprov import __version__
from gpuprov.core.executor import Outcome
from gpuprov.core.json_text import dump_json
from gpuprov.program import GpuprovProgram
from gpuprov.tasks import facts as facts_tasks
from gpuprov.tasks import harden as harden_tasks
from gpuprov.tasks import lab as lab_tasks
from gpuprov.tasks import namespace
from gpuprov.tasks import provision as provision_tasks
from gpuprov.tasks import stack as stack_tasks

INVENTORY = textwrap.dedent("""\
    groups:
      hgx:
        vars:
          hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
    hosts:
      gpu01: {address: 192.0.2.11, groups: [hgx]}
    """)
COMPONENTS = "sources, kernel, driver, cuda, nccl, engine, container_toolkit, fabricmanager, dcgm, pins"
HOST_TASKS = {
    "facts": facts_tasks.facts,
    "harden": harden_tasks.harden,
    "preflight": provision_tasks.preflight,
    "provision": provision_tasks.provision,
    "stack.check": stack_tasks.check,
    "stack.lock": stack_tasks.lock,
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("INVOKE_"):
            monkeypatch.delenv(name)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


class Executor(list):
    """Every call of the executor (the only way to a host); each host answers `facts` when it is set."""

    facts: dict | None = None


@pytest.fixture
def contacted(monkeypatch) -> Executor:
    import gpuprov.core.executor

    calls = Executor()

    def record(hosts, work, settings, **kwargs):
        calls.append((hosts, settings))
        return [] if calls.facts is None else [Outcome(host=h, value=calls.facts) for h in hosts]

    monkeypatch.setattr(gpuprov.core.executor, "run_on_hosts", record)
    return calls


@pytest.fixture
def project(tmp_path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "inventory.yaml").write_text(INVENTORY)
    (folder / "invoke.yaml").write_text(
        f"gpuprov:\n  inventory: {folder / 'inventory.yaml'}\n  reports: {folder / 'reports'}\n"
        f"  locks: {folder / 'locks'}\n  known_hosts: {folder / 'known_hosts'}\n")
    return folder


@pytest.fixture
def ctx(project) -> Context:
    config = Config(project_location=str(project), lazy=True)
    config.load_project()
    return Context(config)


def untouched(project: Path, contacted: list) -> bool:
    return contacted == [] and not (project / "reports").exists() and not (project / "locks").exists()


def call(task, c, capsys, **kwargs) -> tuple[int, str, str]:
    """A task in-process: (exit code, stdout, stderr)."""
    try:
        task(c, **kwargs)
        code = 0
    except Exit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def run_gpuprov(project: Path, monkeypatch, capsys, *argv: str, collection: Collection | None = None):
    monkeypatch.chdir(project)
    program = GpuprovProgram(namespace=collection or namespace(), version=__version__, name="gpuprov",
                             binary="gpuprov")
    try:
        program.run(["gpuprov", *argv])
        code = 0
    except SystemExit as stop:
        code = stop.code or 0
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------------ values of flags

@pytest.mark.parametrize("name", HOST_TASKS)
@pytest.mark.parametrize("value", ["x", "0", "-3", "", "1.5", "\u0663", "1e3"])
def test_bad_parallel_names_the_flag_and_what_it_accepts(ctx, project, capsys, contacted, name, value):
    code, out, err = call(HOST_TASKS[name], ctx, capsys, host=["gpu01"], parallel=value, os="debian-12") \
        if name == "stack.lock" else call(HOST_TASKS[name], ctx, capsys, host=["gpu01"], parallel=value)
    assert (code, out, err) == (2, "", f"error: --parallel must be a whole number >= 1, not {value!r}\n")
    assert untouched(project, contacted)


@pytest.mark.parametrize("value", ["abc", "-1", "150%", "x%", "1.5"])
def test_bad_max_fail_is_refused_before_the_executor(ctx, project, capsys, contacted, value):
    code, out, err = call(provision_tasks.provision, ctx, capsys, host=["gpu01"], max_fail=value)
    assert (code, out) == (2, "")
    assert err == f"error: --max-fail must be a count like 3 or a share like 10%, got {value!r}\n"
    assert untouched(project, contacted)


@pytest.mark.parametrize(("only", "message"), [
    (",,", f"--only ',,' has an empty item; give a comma list of components: {COMPONENTS}"),
    ("driver,", f"--only 'driver,' has an empty item; give a comma list of components: {COMPONENTS}"),
    ("", f"--only '' has an empty item; give a comma list of components: {COMPONENTS}"),
    ("drvier", f"--only: unknown component 'drvier' (did you mean driver?); give a comma list of components: "
               f"{COMPONENTS}"),
    ("cuda,xyz", f"--only: unknown component 'xyz'; give a comma list of components: {COMPONENTS}"),
])
def test_bad_only_names_what_it_accepts(ctx, project, capsys, contacted, only, message):
    code, out, err = call(provision_tasks.provision, ctx, capsys, host=["gpu01"], only=only)
    assert (code, out, err) == (2, "", f"error: {message}\n")
    assert untouched(project, contacted)


@pytest.mark.parametrize(("flags", "message"), [
    ({"only": "firewall,sshd"}, "--only: unknown component 'sshd' (did you mean ssh?); give a comma list of "
                                "components: firewall, ssh, updates"),
    ({"only": "firewall,"}, "--only 'firewall,' has an empty item; give a comma list of components: firewall, ssh, "
                            "updates"),
    ({"confirm_timeout": "5"}, "--confirm-timeout must be a whole number >= 15, not '5'"),
    ({"confirm_timeout": "1m"}, "--confirm-timeout must be a whole number >= 15, not '1m'"),
])
def test_bad_harden_flags_name_what_they_accept(ctx, project, capsys, contacted, flags, message):
    code, out, err = call(harden_tasks.harden, ctx, capsys, host=["gpu01"], **flags)
    assert (code, out, err) == (2, "", f"error: {message}\n")
    assert untouched(project, contacted)


def test_bad_confirm_timeout_setting_is_located(project, capsys, contacted, ctx, monkeypatch):
    monkeypatch.setenv("INVOKE_GPUPROV_CONFIRM_TIMEOUT", "10")
    code, out, err = call(harden_tasks.harden, ctx, capsys, host=["gpu01"])
    assert (code, out) == (2, "")
    assert err == "error: INVOKE_GPUPROV_CONFIRM_TIMEOUT: must be a whole number of seconds >= 15, not 10\n"
    assert untouched(project, contacted)


def test_bad_reboot_policy(ctx, project, capsys, contacted):
    code, out, err = call(provision_tasks.provision, ctx, capsys, host=["gpu01"], reboot="maybe")
    assert (code, out, err) == (2, "", "error: --reboot must be one of never, if-needed, always, got 'maybe'\n")
    assert untouched(project, contacted)


def test_an_empty_inventory_flag_is_refused(ctx, project, capsys, contacted):
    code, _, err = call(facts_tasks.facts, ctx, capsys, host=["gpu01"], inventory="")
    assert (code, err) == (2, "error: select hosts: --inventory needs the path of an inventory file, not ''\n")
    assert untouched(project, contacted)


@pytest.mark.parametrize("hosts", ["x", "0", "-1", "2.5"])
def test_lab_up_refuses_a_bad_host_count_before_docker(ctx, capsys, monkeypatch, hosts):
    import gpuprov.lab

    monkeypatch.setattr(gpuprov.lab, "up", lambda *a, **k: pytest.fail("the lab was started"))
    code, _, err = call(lab_tasks.up, ctx, capsys, hosts=hosts)
    assert (code, err) == (2, f"error: --hosts must be a whole number >= 1, not {hosts!r}\n")


def test_good_flags_reach_the_executor(ctx, project, capsys, contacted):
    code, _, _ = call(provision_tasks.provision, ctx, capsys, host=["gpu01"], parallel="4", max_fail="10%",
                      only="driver, cuda", reboot="never", dry_run=True)
    [(hosts, used)] = contacted
    assert code == 0 and [h.name for h in hosts] == ["gpu01"]
    assert (used.parallel, used.max_fail) == (4, "10%")


# --------------------------------------------------------------------------------------- the command line

PARSE_CASES = [
    (["provision", "--hots", "a"],
     "provision: unknown option '--hots' (did you mean --host?); see: gpuprov --help provision"),
    (["facts", "--bogus"], "facts: unknown option '--bogus'; see: gpuprov --help facts"),
    (["provision", "--inventory"], "provision: --inventory needs a value; see: gpuprov --help provision"),
    (["provision", "--reboot"], "provision: --reboot needs a value; see: gpuprov --help provision"),
    (["provison"], "unknown task 'provison' (did you mean provision?); see: gpuprov --list"),
    (["provision", "--dry-run=yes"],
     "provision: 'yes' is neither an option of provision nor a task; see: gpuprov --help provision"),
    (["inventory.show"], "inventory.show: --host is required; see: gpuprov --help inventory.show"),
    (["--bogus", "facts"], "unknown option '--bogus'; see: gpuprov --help"),
    (["-f"], "--config needs a value; see: gpuprov --help"),
    (["--help", "provison"], "unknown task 'provison' (did you mean provision?); see: gpuprov --list"),
    (["--list-depth", "x"], "--list-depth must be a whole number, not 'x'"),
]


@pytest.mark.parametrize(("argv", "message"), PARSE_CASES)
def test_a_bad_command_line_is_exit_2_with_one_line(project, monkeypatch, capsys, contacted, argv, message):
    assert run_gpuprov(project, monkeypatch, capsys, *argv) == (2, "", f"error: {message}\n")
    assert untouched(project, contacted)


def test_a_bad_number_for_a_number_flag_is_exit_2(project, monkeypatch, capsys):
    @task
    def count(c, times=1):
        """A task whose flag Invoke parses as a number."""

    code, out, err = run_gpuprov(project, monkeypatch, capsys, "count", "--times", "1.5",
                                 collection=Collection(count))
    assert (code, out, err) == (2, "", "error: --times must be a whole number, not '1.5'\n")


def test_a_bad_command_line_with_json_is_one_json_document(project, monkeypatch, capsys, contacted):
    code, out, err = run_gpuprov(project, monkeypatch, capsys, "facts", "--json", "--hots", "gpu01")
    message = "facts: unknown option '--hots' (did you mean --host?); see: gpuprov --help facts"
    assert (code, err) == (2, f"error: {message}\n")
    assert json.loads(out) == {"error": message, "host": None, "step": None, "command": None, "output": None,
                               "hint": None, "exit_code": 2}
    assert untouched(project, contacted)


# ----------------------------------------------------------------------------------------------- --json

@pytest.mark.parametrize("name", ["facts", "harden", "provision", "preflight", "stack.check"])
def test_a_task_error_under_json_is_the_one_document_on_stdout(ctx, project, capsys, contacted, name):
    code, out, err = call(HOST_TASKS[name], ctx, capsys, host=["gpu01"], parallel="x", json_=True)
    message = "--parallel must be a whole number >= 1, not 'x'"
    assert (code, err) == (2, f"error: {message}\n")
    assert json.loads(out) == {"error": message, "host": None, "step": None, "command": None, "output": None,
                               "hint": None, "exit_code": 2}
    assert untouched(project, contacted)


def test_an_inventory_error_under_json_lists_every_problem(project, capsys, contacted, ctx):
    (project / "inventory.yaml").write_text("hosts:\n  gpu01: {address: 192.0.2.11, port: x}\n")
    code, out, _ = call(facts_tasks.facts, ctx, capsys, host=["gpu01"], json_=True)
    document = json.loads(out)
    assert code == 2 and document["exit_code"] == 2 and len(document["errors"]) == 1
    assert document["errors"][0].startswith(f"{project / 'inventory.yaml'}:2:")
    assert untouched(project, contacted)


def test_a_stack_conflict_under_json_names_each_conflict(ctx, capsys):
    code, out, _ = call(stack_tasks.resolve, ctx, capsys, gpu="H100-SXM", os="ubuntu-22.04", cuda="12.8",
                        driver="535", json_=True)
    document = json.loads(out)
    assert code == 2 and document["error"] == "no stack satisfies every rule" and document["exit_code"] == 2
    assert document["conflicts"] and all(isinstance(text, str) for text in document["conflicts"])


def strict(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as jq and JSON.parse do."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_facts_json_is_strict_json_with_nan_as_null(ctx, capsys, contacted):
    contacted.facts = {"gpus": [{"temperature": float("nan"), "power_w": float("inf")}], "load": -float("inf")}
    code, out, _ = call(facts_tasks.facts, ctx, capsys, host=["gpu01"], json_=True)
    assert code == 0
    assert strict(out) == {"gpu01": {"gpus": [{"temperature": None, "power_w": None}], "load": None}}


def test_dump_json_is_strict_masks_credentials_and_writes_keys_as_text():
    data = {"a": float("nan"), 1: [float("inf"), 2.5], None: True, "proxy": "http://ops:s3cret@proxy:3128/",
            "path": Path("/srv/x"), "nested": {"b": (float("-inf"),)}}
    assert dump_json(data, indent=None, sort_keys=True) == (
        '{"1": [null, 2.5], "a": null, "nested": {"b": [null]}, "null": true, "path": "/srv/x", '
        '"proxy": "http://***@proxy:3128/"}')
