"""gpuprov.rollout.hooks: the inventory's hook commands run for real (fake commands, written here, that record the
arguments they get and answer what the test says; no Kubernetes cluster runs in the lab), and NoScheduler over
facts."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.inventory.model import Host
from gpuprov.rollout.hooks import HookScheduler, NoScheduler, parse_busy
from gpuprov.rollout.scheduler import Job, NodeState

OURS = "gpuprov rollout r1: 550 -> 570"
FAKE = """\
import json, os, sys, time
folder, name = sys.argv[1], sys.argv[2]
with open(os.path.join(folder, "calls.jsonl"), "a") as log:
    log.write(json.dumps([name] + sys.argv[3:]) + "\\n")
def read(suffix, default):
    path = os.path.join(folder, name + suffix)
    return open(path).read() if os.path.exists(path) else default
time.sleep(float(read(".sleep", "0")))
sys.stdout.write(read(".out", ""))
sys.stderr.write(read(".err", ""))
sys.exit(int(read(".rc", "0")))
"""


class Hooks:
    """Fake hook commands in a folder: `hooks.command("cordon", "{node} k={reason}")` is the template of a command
    named cordon; `hooks.answer("state", out="ready")` sets what it prints; `hooks.calls()` is what ran."""

    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "fake.py").write_text(FAKE)

    def command(self, name: str, arguments: str) -> str:
        return f"{shlex.quote(sys.executable)} {shlex.quote(str(self.folder / 'fake.py'))} " \
               f"{shlex.quote(str(self.folder))} {name} {arguments}"

    def answer(self, name: str, out: str = "", rc: int = 0, err: str = "", sleep: float = 0) -> None:
        for suffix, value in ((".out", out), (".rc", str(rc)), (".err", err), (".sleep", str(sleep))):
            (self.folder / (name + suffix)).write_text(value)

    def calls(self) -> list[list[str]]:
        log = self.folder / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def hooks(tmp_path) -> Hooks:
    return Hooks(tmp_path)


def kubernetes(hooks: Hooks, state: bool = True, **more) -> dict:
    """The Kubernetes example of docs/rollout-schedulers.md, with fake commands in place of kubectl."""
    settings = {
        "cordon": [hooks.command("annotate", "node {node} gpuprov.io/rollout={reason} --overwrite"),
                   hooks.command("cordon", "{node}")],
        "busy": hooks.command("busy", "{node}"),
        "uncordon": [hooks.command("annotate", "node {node} gpuprov.io/rollout-"), hooks.command("uncordon", "{node}")],
        **more}
    if state:
        settings["state"] = hooks.command("state", "{node}")
    return settings


def host(scheduler: dict, name: str = "gpu07") -> Host:
    return Host(name=name, address="10.0.0.7", vars={"scheduler": scheduler})


def test_drain_annotates_then_cordons_with_the_reason_as_one_argument(hooks):
    hooks.answer("state", out="ready\n")
    HookScheduler().drain(host(kubernetes(hooks)), OURS)
    assert hooks.calls() == [["state", "gpu07"],
                             ["annotate", "node", "gpu07", f"gpuprov.io/rollout={OURS}", "--overwrite"],
                             ["cordon", "gpu07"]]


def test_drain_of_a_node_cordoned_with_the_same_reason_runs_nothing_more(hooks):
    hooks.answer("state", out=f"cordoned {OURS}\n")
    HookScheduler().drain(host(kubernetes(hooks)), OURS)
    assert hooks.calls() == [["state", "gpu07"]]


@pytest.mark.parametrize("answer", ["cordoned maintenance by alice", "cordoned"])
def test_an_admins_cordon_is_left_alone(hooks, answer):
    hooks.answer("state", out=answer + "\n")
    for call in (lambda h: HookScheduler().drain(h, OURS), HookScheduler().resume,
                 lambda h: HookScheduler().set_reason(h, OURS + " failed")):
        with pytest.raises(GpuprovError, match="cordoned by someone else"):
            call(host(kubernetes(hooks)))
    assert [call[0] for call in hooks.calls()] == ["state"] * 3


def test_nodes_reads_each_state_hook(hooks):
    scheduler = HookScheduler()
    for answer, expected in (("ready\n", NodeState("n7", state="ready")),
                             (f"cordoned {OURS}\n", NodeState("n7", drained=True, reason=OURS, state="cordoned")),
                             ("down NotReady since 10:02\n", NodeState("n7", down=True, reason="NotReady since 10:02",
                                                                       state="down"))):
        hooks.answer("state", out=answer)
        assert scheduler.nodes([host({**kubernetes(hooks), "node": "n7"})]) == {"gpu07": expected}


def test_a_state_hook_that_prints_something_else_is_an_error(hooks):
    hooks.answer("state", out="true gpuprov rollout r1\n")
    with pytest.raises(GpuprovError, match="expected `ready`, `cordoned <reason>` or `down <why>`") as caught:
        HookScheduler().nodes([host(kubernetes(hooks))])
    assert caught.value.host == "gpu07" and caught.value.step == "rollout.nodes"


def test_without_a_state_hook_nothing_is_asked(hooks):
    """Without the state hook gpuprov could not tell its cordon from an admin's: refused before any command."""
    with pytest.raises(InputError, match="scheduler.state: give a command"):
        HookScheduler().nodes([host(kubernetes(hooks, state=False))])
    assert hooks.calls() == []


def test_resume_uncordons_gpuprovs_cordon_and_nothing_else(hooks):
    hooks.answer("state", out=f"cordoned {OURS}\n")
    HookScheduler().resume(host(kubernetes(hooks)))
    hooks.answer("state", out="ready\n")
    HookScheduler().resume(host(kubernetes(hooks)))
    assert hooks.calls() == [["state", "gpu07"], ["annotate", "node", "gpu07", "gpuprov.io/rollout-"],
                             ["uncordon", "gpu07"], ["state", "gpu07"]]


def test_set_reason_runs_the_cordon_again_with_the_new_reason(hooks):
    hooks.answer("state", out=f"cordoned {OURS}\n")
    failed = "gpuprov rollout r1: failed validate: perf.matmul"
    HookScheduler().set_reason(host(kubernetes(hooks)), failed)
    assert hooks.calls()[1:] == [["annotate", "node", "gpu07", f"gpuprov.io/rollout={failed}", "--overwrite"],
                                 ["cordon", "gpu07"]]


def test_busy_lines_are_the_work_still_running(hooks):
    hooks.answer("busy", out="pod ml/train-0\njob 12 alice 3600 pretrain | stage 2\njob 13 bob - eval\n\n")
    assert HookScheduler().jobs(host(kubernetes(hooks))) == [
        Job("pod ml/train-0", "-"), Job("12", "alice", "pretrain | stage 2", 3600), Job("13", "bob", "eval", None)]
    hooks.answer("busy", out="")
    assert HookScheduler().jobs(host(kubernetes(hooks))) == []


def test_parse_busy_takes_a_line_it_cannot_read_as_a_job_for_the_workload_itself():
    assert parse_busy("job twelve\njob 1 al 5m x\n") == [Job("job twelve", "-"), Job("job 1 al 5m x", "-")]


def test_a_placeholder_is_replaced_inside_one_word_and_other_braces_pass_as_written(hooks):
    settings = kubernetes(hooks, busy=hooks.command(
        "busy", "pods --field-selector spec.nodeName={node} -o 'jsonpath={.items[*].metadata.name}' {unknown}"))
    HookScheduler().jobs(host(settings))
    assert hooks.calls() == [["busy", "pods", "--field-selector", "spec.nodeName=gpu07", "-o",
                              "jsonpath={.items[*].metadata.name}", "{unknown}"]]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=25, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30))
def test_any_reason_reaches_the_command_as_part_of_one_argument(hooks, tail):
    (hooks.folder / "calls.jsonl").unlink(missing_ok=True)
    hooks.answer("state", out="ready\n")
    HookScheduler().drain(host(kubernetes(hooks)), f"{OURS} {tail}")
    annotate = hooks.calls()[1]
    assert len(annotate) == 5 and annotate[3].startswith(f"gpuprov.io/rollout={OURS} ")


def test_a_failing_hook_names_the_host_step_command_exit_code_and_output(hooks):
    hooks.answer("busy", rc=3, out="partial\n", err="error: You must be logged in to the server (Unauthorized)\n")
    with pytest.raises(GpuprovError) as caught:
        HookScheduler().jobs(host(kubernetes(hooks)))
    error = caught.value
    assert (error.host, error.step) == ("gpu07", "rollout.jobs")
    assert "busy hook failed (exit 3)" in error.message and "Unauthorized" in error.output
    assert shlex.split(error.command)[-2:] == ["busy", "gpu07"]


def test_a_hook_past_its_timeout_is_stopped(hooks):
    hooks.answer("busy", sleep=30)
    started = time.monotonic()
    with pytest.raises(GpuprovError, match="ran past 0.5 s") as caught:
        HookScheduler().jobs(host(kubernetes(hooks, timeout=0.5)))
    assert time.monotonic() - started < 10 and caught.value.step == "rollout.jobs"


def test_a_hook_that_cannot_start_says_so():
    with pytest.raises(GpuprovError, match="could not start") as caught:
        HookScheduler().jobs(host({"cordon": "x {node} {reason}", "busy": "/nonexistent/kubectl get {node}",
                                   "uncordon": "x {node}", "state": "x {node}"}))
    assert caught.value.command == "/nonexistent/kubectl get gpu07"


@pytest.mark.parametrize(("settings", "message"), [
    ({"busy": "b {node}", "uncordon": "u {node}"}, "scheduler.cordon: give a command"),
    ({"cordon": "c {node}", "busy": "b {node}", "uncordon": "u {node}"}, "scheduler.cordon lacks {reason}"),
    ({"cordon": "c {node} {reason}", "busy": "b", "uncordon": "u {node}"}, "lacks {node}"),
    ({"cordon": "c {node} {reason}", "busy": "b {node} 'open", "uncordon": "u {node}"}, "No closing quotation"),
    ({"cordon": [], "busy": "b {node}", "uncordon": "u {node}"}, "scheduler.cordon: give a command"),
    ({"cordon": ["c {node} {reason}", 5], "busy": "b {node}", "uncordon": "u {node}"}, "give a command"),
])
def test_bad_hooks_are_refused_before_anything_runs(hooks, settings, message):
    with pytest.raises(InputError, match=message.replace("{", r"\{")):
        scheduler = HookScheduler()
        scheduler.jobs(host(settings))
        scheduler.drain(host(settings), OURS)
    assert hooks.calls() == []


def test_a_hostile_node_name_is_refused_before_anything_runs(hooks):
    with pytest.raises(InputError, match="not a plain node name"):
        HookScheduler().jobs(host({**kubernetes(hooks), "node": "--all-namespaces"}))
    assert hooks.calls() == []


def test_no_scheduler_sees_the_work_the_facts_show():
    facts = {"gpu07": {"gpu_processes": [{"pid": 4242, "process_name": "python", "used_memory_mib": 8000}],
                       "containers": [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.04-py3"},
                                      {"name": "gpuprov-dcgm-exporter", "image": "dcgm-exporter"}],
                       "slurm_jobs": []},
             "gpu08": {"gpu_processes": [], "containers": []}}
    scheduler = NoScheduler(lambda h: facts[h.name])
    gpu07, gpu08 = host({}, "gpu07"), host({"node": "n8"}, "gpu08")
    assert scheduler.jobs(gpu07) == [Job("GPU process 4242 python (8000 MiB)", "-"),
                                     Job("container trainer (nvcr.io/nvidia/pytorch:25.04-py3)", "-")]
    assert scheduler.jobs(gpu08) == []
    assert scheduler.nodes([gpu07, gpu08]) == {"gpu07": NodeState("gpu07", state="no scheduler"),
                                               "gpu08": NodeState("n8", state="no scheduler")}
    for call in (lambda h: scheduler.drain(h, OURS), scheduler.resume, lambda h: scheduler.set_reason(h, OURS)):
        assert call(gpu07) is None
    assert scheduler.kind == "none" and HookScheduler.kind == "hook"
