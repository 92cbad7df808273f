"""The command line as people type it (issue 22, item 1): `TASK -h` is help, one meaning per short flag across every
task, value names in the help, -v/-q on host tasks, quiet ends in a closed pipe and at a third Ctrl-C, -j is --json
and every JSON error has one shape, one table width in a pipe, --inventory-plugin. Hosts are stand-ins
(`contacted`); the programs run in this process, or as real processes where a pipe or a signal is the point."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from invoke import Config, Context, Program
from invoke.exceptions import Exit

from gpuprov.program import GpuprovProgram
from gpuprov.tasks import namespace

ROOT = Path(__file__).resolve().parents[2]
# the short flags this project gives (README, "CLI conventions"); written out here, not read from the code
SHORT = {"H": "host", "g": "group", "a": "all", "i": "inventory", "P": "parallel", "j": "json", "n": "dry-run",
         "v": "verbose", "q": "quiet"}
# the fields of every JSON error document: GpuprovError's (README: error, host, step, command, output, hint) and the
# exit code
ERROR_KEYS = {"error", "host", "step", "command", "output", "hint", "exit_code"}
HOST_TASKS = {"facts", "harden", "images.run", "monitoring.deploy", "preflight", "provision", "rollout", "stack.lock",
              "stack.check", "validate.validate", "health.deploy"}


def tasks() -> dict[str, object]:
    """Every task of the namespace by its dotted name (a collection's default task under its own name too)."""
    ns = namespace()
    return {name: ns[name] for name in ns.task_names}


def env() -> dict[str, str]:
    """The environment of a program run from this checkout (whatever the installed package points at)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}


def run_gpuprov(argv: list[str], capsys) -> tuple[int, str, str]:
    """The gpuprov program in this process: (exit code, stdout, stderr)."""
    try:
        GpuprovProgram(namespace=namespace(), name="gpuprov", binary="gpuprov").run(["gpuprov", *argv])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def context(tmp_path) -> Context:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n" + "".join(f"  gpu0{i}: {{address: 192.0.2.{i}}}\n" for i in range(1, 3)))
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "reports": str(tmp_path / "reports"), "locks": str(tmp_path / "locks"),
        "known_hosts": str(tmp_path / "known_hosts"), "wheelhouse": str(tmp_path / "wheelhouse")}}))


# ------------------------------------------------------------------------------------------------ -h is help

def test_dash_h_after_any_task_is_its_help_in_the_gpuprov_program(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in tasks():
        code, out, err = run_gpuprov([name, "-h"], capsys)
        assert (code, err) == (0, ""), name
        assert out.startswith(f"Usage: gpuprov [--core-opts] {name} "), name
        assert "Options:" in out and "inventory" not in err


def test_dash_h_after_any_task_is_its_help_in_the_invoke_binary(tmp_path):
    """Invoke's own program, as `invoke TASK -h` runs it from the checkout (tasks.py), for every task."""
    names = list(tasks())
    script = textwrap.dedent(f"""
        import sys
        from invoke.main import program
        for name in {names!r}:
            print("=== " + name, flush=True)
            program.run(["invoke", "--search-root", {str(ROOT)!r}, name, "-h"], exit=False)
            sys.stdout.flush()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    shown = dict(part.split("\n", 1) for part in done.stdout.split("=== ")[1:])
    assert list(shown) == names
    for name, text in shown.items():
        assert text.startswith(f"Usage: inv[oke] [--core-opts] {name} "), name


# ---------------------------------------------------------------------------------- short flags: one meaning

def test_a_short_flag_means_one_long_option_in_every_task_and_h_is_never_one():
    core = {name for arg in Program().core_args() + Program().task_args() for name in arg.names if len(name) == 1}
    meaning: dict[str, set[str]] = {}
    for name, task in tasks().items():
        for arg in task.get_arguments():
            for short in (n for n in arg.names if len(n) == 1):
                meaning.setdefault(short, set()).add(arg.names[0])
                assert short not in core, f"{name}: -{short} is Invoke's own -{short}"
    assert "h" not in meaning
    assert {short: sorted(longs) for short, longs in meaning.items()} == {short: [long]
                                                                          for short, long in SHORT.items()}


def test_short_flags_work_as_their_long_options(tmp_path, capsys, contacted, monkeypatch):
    """`-H gpu02 -j` selects as `--host gpu02 --json` does (the program parses them)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("known_hosts: kh\nhosts:\n  gpu01: {address: 192.0.2.1}\n  gpu02: {address: 192.0.2.2}\n")
    monkeypatch.chdir(tmp_path)
    answers = []
    for argv in (["facts", "-H", "gpu02", "-i", str(inventory), "-j"],
                 ["facts", "--host", "gpu02", "--inventory", str(inventory), "--json"]):
        contacted.clear()
        code, out, _ = run_gpuprov(argv, capsys)
        answers.append((code, sorted(json.loads(out)), list(contacted)))
    assert answers[0] == answers[1] == (1, ["gpu02"], ["gpu02"])


# ----------------------------------------------------------------------------------- the help text of options

def test_every_option_that_takes_a_value_names_it_and_no_help_is_cut(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, task in tasks().items():
        _, out, _ = run_gpuprov(["--help", name], capsys)
        assert "%%" not in out and "=STRING" not in out and "=INT" not in out, name
        assert not re.search(r"\b(STRING|INT)\b", out), name
        words = out.split()
        for arg in task.get_arguments():
            long = f"--{arg.names[0]}"
            if arg.kind is not bool:   # `--group NAME`: a value name in capitals (or its choices) after the flag
                assert re.search(rf"{re.escape(long)} \[?[A-Z]+|{re.escape(long)} [a-z]+\|", out), (name, long)
            for word in (arg.help or "").split():   # every word whole: no help wrapped through a word or cut off
                assert word in words, (name, long, word)


def test_the_task_list_shows_each_task_in_a_whole_sentence(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_gpuprov(["--list"], capsys)
    assert code == 0
    entries: dict[str, str] = {}
    current = None
    for line in out.splitlines()[2:]:
        match = re.match(r"  (\S+)(?: \([^)]*\))?\s+(.*)", line)   # `validate.validate (validate)  Run ...`
        if match and not line.startswith("   "):
            current = match[1].rstrip("*")
            entries[current] = match[2]
        elif current and line.strip():
            entries[current] += " " + line.strip()
    for name, task in tasks().items():
        summary = " ".join((inspect.getdoc(task) or "").split("\n\n")[0].split())
        assert summary.endswith("."), name
        if name in entries:
            assert entries[name] == summary, name


# ------------------------------------------------------------------------------------------ -v and -q on hosts

def test_every_host_task_takes_verbose_quiet_and_the_inventory_plugin():
    found = tasks()
    assert set(found) >= HOST_TASKS
    for name in HOST_TASKS:
        names = {arg.names[0]: list(arg.names[1:]) for arg in found[name].get_arguments()}
        assert names["verbose"] == ["v"] and names["quiet"] == ["q"], name
        assert "inventory-plugin" in names, name
    for name in ("inventory.check", "inventory.show"):
        assert "inventory-plugin" in {arg.names[0] for arg in found[name].get_arguments()}


@pytest.mark.parametrize("name", ["facts", "preflight"])
def test_verbose_prints_each_command_on_each_host(tmp_path, capsys, contacted, name):
    from gpuprov.tasks import facts, provision

    task = {"facts": facts.facts, "preflight": provision.preflight}[name]
    with pytest.raises(Exit):      # the stand-ins answer nothing: facts fail, after the command ran
        task(context(tmp_path), all=True, verbose=True)
    err = capsys.readouterr().err
    for host in ("gpu01", "gpu02"):
        assert re.search(rf"^{host}: \$ \S", err, re.MULTILINE), err
        assert re.search(rf"^{host}: exit 0 \(\d+\.\ds\)$", err, re.MULTILINE), err
    with pytest.raises(Exit):
        task(context(tmp_path), all=True)
    assert not re.search(r"^gpu01: \$ ", capsys.readouterr().err, re.MULTILINE)


def test_quiet_prints_only_errors_and_the_summary(tmp_path, capsys, contacted):
    from gpuprov.tasks.provision import preflight

    with pytest.raises(Exit):
        preflight(context(tmp_path), all=True)
    plain = capsys.readouterr()
    with pytest.raises(Exit) as caught:
        preflight(context(tmp_path), all=True, quiet=True)
    quiet = capsys.readouterr()
    progress = re.compile(r"^\s+(failed|ok|\.\.\.) gpu0", re.MULTILINE)
    assert progress.search(plain.err) and not progress.search(quiet.err)
    assert caught.value.code == 1
    assert "gpu01: FAILED" in quiet.out and "gpu02: FAILED" in quiet.out   # the errors
    assert "preflight" in quiet.out and "report: " in quiet.out            # the summary table and its report


def test_verbose_and_quiet_together_is_bad_input(tmp_path, capsys, contacted):
    from gpuprov.tasks.facts import facts

    with pytest.raises(Exit) as caught:
        facts(context(tmp_path), all=True, verbose=True, quiet=True)
    assert caught.value.code == 2 and contacted == []
    assert "--verbose and --quiet" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ a closed pipe

@pytest.mark.parametrize("argv", [["-m", "invoke", "--list"], ["-m", "invoke", "stack.matrix"],
                                  ["-c", "from gpuprov.program import main; main()", "--list"],
                                  ["-c", "from gpuprov.program import main; main()", "stack.matrix"]])
def test_output_into_a_closed_pipe_ends_quietly_with_141(argv):
    """The reader of stdout is gone before the program writes (`| head` that already exited): no traceback, and
    the exit code a shell reports for git or coreutils there (128 + SIGPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env(), stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (128 + signal.SIGPIPE, "")


def test_a_pipe_that_stays_open_gets_everything():
    done = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.startswith("Available tasks:") and "stack.matrix" in done.stdout


# ------------------------------------------------------------------------------------------ Ctrl-C three times

HANGING_RUN = """
import sys, threading
from pathlib import Path
import gpuprov.core.executor as executor
from gpuprov.core.executor import Settings
from gpuprov.core.runtime import Fleet, HostJob, run_fleet
from gpuprov.inventory import Host


class Stuck:       # a connection whose host never answers and never lets go of its thread
    def __init__(self, host):
        self.host = host
    def open(self):
        return self
    def close(self):
        pass


class Hang(HostJob):
    kind = "hang"
    def run_host(self, conn, say):
        print("started", file=sys.stderr, flush=True)
        threading.Event().wait()


class Inventory:
    @staticmethod
    def jump_host(host):
        return None


executor.connect = lambda host, settings, known_hosts, jump=None: Stuck(host)
folder = Path(sys.argv[1])
fleet = Fleet(Inventory(), [Host(name="gpu01", address="192.0.2.1")], Settings(known_hosts=folder / "kh"),
              folder / "reports")
sys.exit(run_fleet(fleet, Hang()))
"""


def test_a_third_ctrl_c_ends_quietly_after_the_first_two_did_their_part(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING_RUN)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []

        def wait_for(text: str) -> None:
            while line := proc.stderr.readline():    # each step waits for the program to say it got there
                seen.append(line)
                if text in line:
                    return
            raise AssertionError(f"never printed {text!r}: {''.join(seen)}")

        wait_for("started")
        proc.send_signal(signal.SIGINT)          # 1st: no new host; waits for gpu01
        wait_for("interrupted: no new host starts")
        time.sleep(0.5)                          # a person's pause: the run is back to waiting for its hosts
        proc.send_signal(signal.SIGINT)          # 2nd: stops waiting, writes the report
        wait_for("interrupted (Ctrl-C): the report")
        time.sleep(0.5)
        assert proc.poll() is None               # gpu01's thread still holds the process
        proc.send_signal(signal.SIGINT)          # 3rd: ends it
        rest = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(seen) + rest
    assert proc.returncode == 130
    assert "interrupted again: exiting now" in rest and "Traceback" not in err and "KeyboardInterrupt" not in err
    report = json.loads((tmp_path / "reports" / "hang-latest.json").read_text())
    assert report["interrupted"] is True
    assert report["hosts"][0]["error"]["error"].startswith("interrupted (Ctrl-C) while in progress")


# ------------------------------------------------------------------------------------------ -j and --json

def test_dash_j_is_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    resolve = ["stack.resolve", "--gpu", "H100-SXM", "--os", "ubuntu-22.04"]
    long, short = run_gpuprov([*resolve, "--json"], capsys), run_gpuprov([*resolve, "-j"], capsys)
    assert long == short and long[0] == 0 and json.loads(long[1])["os"] == "ubuntu-22.04"


@pytest.mark.parametrize("argv", [
    ["stack.resolve", "--os", "ubuntu-22.04"],                         # the task's own check (--gpu missing)
    ["stack.resolve", "--gpu", "H100-SXM", "--os", "ubuntu-22.04", "--bogus"],   # a parse error
    ["stack.resolve", "--gpus"],                                       # a flag without its value
    ["facts", "--all", "--parallel", "x"],                             # a number that is not one
    ["facts", "--all", "--inventory", "missing.yaml"],                 # bad input in the task
    ["facts", "--all", "--inventory-plugin", "chef"],                  # a choice that is not one
])
@pytest.mark.parametrize("flag", ["--json", "-j", "-nj"])
def test_every_json_error_has_one_shape(tmp_path, monkeypatch, capsys, contacted, argv, flag):
    monkeypatch.chdir(tmp_path)
    if flag == "-nj" and argv[0] == "stack.resolve":
        flag = "-j"    # stack.resolve has no --dry-run
    code, out, err = run_gpuprov([*argv, flag], capsys)
    document = json.loads(out)
    assert code == 2 and set(document) - {"errors"} == ERROR_KEYS and document["exit_code"] == 2
    assert err.startswith("error: ") and document["error"] in err and contacted == []


# ------------------------------------------------------------------------------------------ tables in a pipe

PIN = "570.148.08-0ubuntu1~22.04.1+gpuprov.build.20260401.really.570.133.20-1"


def test_tables_in_a_pipe_have_one_width_and_keep_a_version_pin_whole(capsys, monkeypatch):
    from gpuprov.core.report import summary_table
    from gpuprov.tasks.lab import _table

    monkeypatch.setenv("COLUMNS", "60")       # a pipe: the width is gpuprov's, whatever the environment says
    filler = "a long explanation of what happened on this host " * 3
    summary_table("provision", [{"host": f"gpu0{i}", "driver": PIN, "detail": filler} for i in range(3)],
                  ["host", "driver", "detail"])
    first = capsys.readouterr().out.splitlines()
    host = type("LabHost", (), {"name": "gpuprov-lab-01", "profile": PIN, "release": "bookworm", "state": "running",
                                "port": 2201, "internal_ip": "172.30.0.130"})
    _table([host] * 2)
    second = capsys.readouterr().out.splitlines()
    widths = {len(line) for line in first[1:] + second}
    assert max(widths) == 160 and all(width <= 160 for width in widths)   # the same width in both, past COLUMNS
    for lines in (first, second):
        text = "\n".join(lines)
        assert "…" not in text and sum(PIN in line for line in lines) == (3 if lines is first else 2)


def test_a_table_wider_than_the_pipe_folds_rather_than_cuts(capsys):
    from gpuprov.core.report import summary_table

    pins = [PIN + f"-{i}" * 20 for i in range(4)]     # no room for all of them at once: folded, never dropped
    summary_table("stack", [{name: pin for name, pin in zip("abcd", pins, strict=True)}], list("abcd"))
    out = capsys.readouterr().out
    assert "…" not in out and all(len(line) <= 160 for line in out.splitlines())
    cells = ["".join(piece) for piece in zip(*[[cell.strip() for cell in line.split("│")[1:-1]]
                                              for line in out.splitlines() if line.startswith("│")], strict=True)]
    assert cells == pins


# ------------------------------------------------------------------------------------------ --inventory-plugin

@pytest.mark.parametrize(("plugin", "expected"), [(None, {}), ("ansible", {"plugin": "ansible"}),
                                                  ("gpuprov", {"plugin": "gpuprov"})])
def test_the_inventory_plugin_reaches_load_inventory_only_when_given(tmp_path, monkeypatch, capsys, contacted,
                                                                      plugin, expected):
    from gpuprov.core.errors import InputError
    from gpuprov.tasks.facts import facts
    from gpuprov.tasks.inventory import check, show

    calls = []

    def load_inventory(path, **kwargs):
        calls.append(kwargs)
        raise InputError("stand-in inventory")

    monkeypatch.setattr("gpuprov.inventory.load_inventory", load_inventory)
    c = context(tmp_path)
    extra = {} if plugin is None else {"inventory_plugin": plugin}
    for task, args in ((facts, {"all": True}), (check, {}), (show, {"host": "gpu01"})):
        with pytest.raises(Exit) as caught:
            task(c, **args, **extra)
        assert caught.value.code == 2
    assert calls == [expected] * 3 and contacted == []


@pytest.mark.parametrize("task_name", ["facts", "check"])
def test_an_unknown_inventory_plugin_is_bad_input_naming_the_choices(tmp_path, capsys, contacted, task_name):
    from gpuprov.tasks.facts import facts
    from gpuprov.tasks.inventory import check

    task, args = {"facts": (facts, {"all": True}), "check": (check, {})}[task_name]
    with pytest.raises(Exit) as caught:
        task(context(tmp_path), inventory_plugin="chef", **args)
    assert caught.value.code == 2 and contacted == []
    assert "--inventory-plugin must be one of gpuprov, ansible, not 'chef'" in capsys.readouterr().err
