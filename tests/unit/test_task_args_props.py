"""Property: whatever the task arguments, invoke.yaml values and INVOKE_GPUPROV_* variables are, a task either
runs (and the executor gets sane settings) or exits 2 with one `error:` line per problem and no traceback,
before the executor is called; with --json, stdout is then exactly one strict JSON document."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Config, Context
from invoke.exceptions import Exit

from gpuprov import __version__
from gpuprov.program import GpuprovProgram
from gpuprov.tasks import facts as facts_tasks
from gpuprov.tasks import namespace
from gpuprov.tasks import provision as provision_tasks

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
INVENTORY = "hosts:\n  gpu01: {address: 192.0.2.11}\n"
KEYS = ["inventory", "parallel", "connect_timeout", "connect_retries", "command_timeout", "known_hosts",
        "reports", "locks"]
PATH_KEYS = {"inventory", "known_hosts", "reports", "locks"}

# Path values stay inside the test's folder: relative names only (a report is written where `reports` says).
safe_names = st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="-_. "),
                     max_size=8).filter(lambda name: name.strip(". ") != "")
numbers_as_text = st.one_of(st.integers(-5, 10**12).map(str), st.sampled_from(
    ["", " ", "x", "1.5", "1e3", "+3", "0x10", "\u0663", "\u00b2", "3 ", "10%", "0%", "100%", "101%", "nan%",
     "-1%", "%", "1_000", "\n2", "NaN", "inf"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
                    numbers_as_text, st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.sampled_from(["a", "max"]), st.integers(), max_size=2))
section_values = {key: st.one_of(scalars, safe_names) if key in PATH_KEYS else scalars for key in KEYS}
sections = st.fixed_dictionaries({}, optional={**section_values, "paralel": scalars, "Parallel": scalars})
env_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
environments = st.dictionaries(
    st.sampled_from(["INVOKE_GPUPROV_PARALLEL", "INVOKE_GPUPROV_CONNECT_TIMEOUT", "INVOKE_GPUPROV_CONNECT_RETRIES",
                     "INVOKE_GPUPROV_COMMAND_TIMEOUT", "INVOKE_GPUPROV_PARALEL"]),
    st.one_of(numbers_as_text, env_text), max_size=2)
components = st.lists(st.sampled_from(["driver", "cuda", "pins", "drvier", "", " ", ",", "DRIVER", "x"]),
                      max_size=4).map(",".join)
arguments = st.fixed_dictionaries({"host": st.just(["gpu01"])}, optional={
    "parallel": st.one_of(numbers_as_text, st.integers(-3, 3), st.booleans()),
    "max_fail": numbers_as_text,
    "only": components,
    "reboot": st.sampled_from(["never", "if-needed", "always", "maybe", "", "Always"]),
    "dry_run": st.booleans(),
    "json_": st.booleans(),
})


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("INVOKE_"):
            monkeypatch.delenv(name)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def contacted(monkeypatch) -> list:
    import gpuprov.core.executor

    calls: list = []

    def record(hosts, work, settings, **kwargs):
        calls.append(settings)
        return []

    monkeypatch.setattr(gpuprov.core.executor, "run_on_hosts", record)
    return calls


def strict(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def assert_clean_refusal(out: str, err: str, json_: bool) -> None:
    """Exit 2 as promised: `error:` lines (continuations indented), no traceback; stdout empty or one JSON
    error document."""
    assert err.startswith("error: ") and "Traceback" not in err
    assert all(line.startswith(("error: ", "  ")) for line in err.splitlines())
    if json_:
        document = strict(out)
        assert document["exit_code"] == 2 and document["error"]
    else:
        assert out == ""


@SETTINGS
@given(section=sections, environment=environments, args=arguments)
def test_any_arguments_settings_and_overrides_run_or_exit_2_before_the_executor(
        tmp_path, contacted, capsys, section, environment, args):
    folder = Path(tmp_path)
    (folder / "inventory.yaml").write_text(INVENTORY)
    document = {"inventory": "inventory.yaml", "known_hosts": "known_hosts", **section}
    (folder / "invoke.yaml").write_text(yaml.safe_dump({"gpuprov": document}))
    config = Config(project_location=str(folder), lazy=True)
    config.load_project()
    contacted.clear()
    with mock.patch.dict(os.environ, environment), contextlib.chdir(folder):
        task = provision_tasks.provision if "only" in args or "reboot" in args else facts_tasks.facts
        kwargs = args if task is provision_tasks.provision else {
            k: v for k, v in args.items() if k in ("host", "parallel", "json_")}
        try:
            task(Context(config), **kwargs)
            code = 0
        except Exit as stop:
            code = stop.code
    out, err = capsys.readouterr()
    if code == 2:
        assert contacted == []
        assert_clean_refusal(out, err, bool(kwargs.get("json_")))
        return
    assert code == 0, err
    [used] = contacted
    assert used.parallel >= 1 and used.connect_timeout >= 1 and used.connect_retries >= 0
    assert used.command_timeout >= 1
    if "parallel" in kwargs:
        assert used.parallel == int(str(kwargs["parallel"]).strip())
    if kwargs.get("json_"):
        strict(out)


TOKENS = ["gpuprov:", "gpuprov: ", "\n", "  ", "    ", "- ", ": ", "{", "}", "[", "]", ", ", "&a ", "*a",
          "<<: ", "!!int ", "!!str ", "'", '"', "#", "|", "---", "? ", "null", "~", "yes", "1", "0", "-1",
          "32", "1.5", ".nan", "x", "inventory", "parallel", "parallel:", "connect_timeout:", "connect_retries:",
          "command_timeout:", "known_hosts:", "reports:", "locks:", "paralel:", "run:", "tasks:", "dedupe:",
          "\t", "\x00", "\ufeff", "%YAML 1.1\n"]


@SETTINGS
@given(text=st.lists(st.sampled_from(TOKENS), max_size=30).map("".join))
def test_any_invoke_yaml_text_runs_or_exits_2_under_the_gpuprov_program(tmp_path, contacted, capsys, text):
    folder = Path(tmp_path)
    (folder / "inventory.yaml").write_text(INVENTORY)
    (folder / "invoke.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    program = GpuprovProgram(namespace=namespace(), version=__version__, name="gpuprov", binary="gpuprov")
    with contextlib.chdir(folder):
        try:
            program.run(["gpuprov", "inventory.check", "--inventory", "inventory.yaml"])
            code = 0
        except SystemExit as stop:
            code = stop.code
    out, err = capsys.readouterr()
    if code == 0:
        assert out.startswith("inventory.yaml: ok")
        return
    assert code == 2
    assert_clean_refusal(out, err, json_=False)
    located = re.compile(re.escape(str(folder / "invoke.yaml")) + r"(:\d+:\d+)?: ")
    problems = err.splitlines()[1:] if re.match(r"error: \d+ errors", err) else [err.splitlines()[0][7:]]
    assert all(located.match(line.strip()) for line in problems), err
