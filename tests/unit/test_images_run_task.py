"""`invoke images.run` on the fleet runtime: the image each host pulls (its lock's digest, else the tag) and what
run_image is asked, the report (images-run-<stamp>.json) with each host's entry, each host's output or error
printed, exit 1 when a host failed, and Ctrl-C (exit 130, the report has what completed). Hosts are stand-ins:
the connection is a LocalConn answering nothing and run_image plays the host."""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers.local_host import LocalConn
from invoke import Config, Context
from invoke.exceptions import Exit

import gpuprov.core.executor
import gpuprov.images.run_job
from gpuprov.core.errors import GpuprovError
from gpuprov.core.executor import Outcome, RunInterrupted
from gpuprov.images.run import RunVars, Started
from gpuprov.stack.lock import write_lock
from gpuprov.tasks import images as image_tasks

IMAGE = "cuda-onnxruntime-infer"
DIGEST = "sha256:" + "cd" * 32
TAGGED = "10.0.0.5:5000/cuda-onnxruntime-infer:2.8.0-cu128-infer"
PINNED = f"10.0.0.5:5000/cuda-onnxruntime-infer@{DIGEST}"
INVENTORY = textwrap.dedent("""\
    defaults: {user: root}
    hosts:
      gpu01:
        address: 192.0.2.11
        vars: {stack: {forward_compat: true}, data_dir: /data}
      gpu02: {address: 192.0.2.12}
    """)


@pytest.fixture
def ctx(tmp_path) -> Context:
    """Two hosts; gpu02's lock records the image by digest with its own minimum driver."""
    from gpuprov.stack.resolve import resolve

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    (tmp_path / "locks").mkdir()
    write_lock(tmp_path / "locks" / "gpu02.lock.yaml",
               resolve("H100-SXM", "ubuntu-22.04", gpus=8, nvswitch=True, driver="570").to_dict(), {},
               [{"name": IMAGE, "tag": "2.8.0-cu128-infer", "digest": DIGEST, "min_driver": "570.86.10"}])
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "locks": str(tmp_path / "locks"), "reports": str(tmp_path / "reports"),
        "known_hosts": str(tmp_path / "known_hosts")}}))


def hosts_play(monkeypatch, fail: set[str] = frozenset()) -> list[dict]:
    """run_image replaced: each host prints two lines, or fails (those in `fail`); returns what each was asked."""
    asked = []

    def run_image(conn, image, **kwargs):
        asked.append({"host": conn.host.name, "image": image, **kwargs})
        kwargs["say"]("pull")
        if conn.host.name in fail:
            raise GpuprovError("docker pull failed (exit 1)", host=conn.host.name, step="images.run",
                               command="docker pull x", output="denied", hint="check the registry")
        return Started(conn.host.name, image, kwargs["container"], "docker run --rm job", 0, "loss 0.5\n",
                       "warn\n", "forward compatibility" if conn.host.name == "gpu01" else None)

    monkeypatch.setattr(gpuprov.images.run_job, "run_image", run_image)
    return asked


def run(ctx, capsys, **flags) -> tuple[int, str, str]:
    """The task on both hosts: its exit code, stdout and stderr."""
    code = 0
    try:
        image_tasks.run(ctx, all=True, name=IMAGE, registry="10.0.0.5:5000", container="job", **flags)
    except Exit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def report(tmp_path) -> dict:
    return json.loads((tmp_path / "reports" / "images-run-latest.json").read_text())


def test_each_host_pulls_its_image_and_the_report_has_each_hosts_entry(ctx, tmp_path, capsys, contacted,
                                                                         monkeypatch):
    asked = hosts_play(monkeypatch)
    code, out, _ = run(ctx, capsys)
    assert code == 0 and contacted == ["gpu01", "gpu02"]
    say = [entry.pop("say") for entry in asked]
    assert all(callable(s) for s in say)
    assert asked == [
        {"host": "gpu01", "image": TAGGED, "min_driver": "525.60.13", "forward_compat": True,
         "settings": RunVars(data_dir="/data"), "container": "job", "detach": False, "command": []},
        {"host": "gpu02", "image": PINNED, "min_driver": "570.86.10", "forward_compat": False,
         "settings": RunVars(), "container": "job", "detach": False, "command": []}]
    document = report(tmp_path)
    assert (document["image"], document["container"], document["detach"], document["interrupted"]) == (
        IMAGE, "job", False, False)
    assert [{key: entry[key] for key in ("host", "status", "image", "container", "command", "rc", "stdout", "stderr",
                                         "note")} for entry in document["hosts"]] == [
        {"host": "gpu01", "status": "ran", "image": TAGGED, "container": "job", "command": "docker run --rm job",
         "rc": 0, "stdout": "loss 0.5\n", "stderr": "warn\n", "note": "forward compatibility"},
        {"host": "gpu02", "status": "ran", "image": PINNED, "container": "job", "command": "docker run --rm job",
         "rc": 0, "stdout": "loss 0.5\n", "stderr": "warn\n", "note": None}]
    assert len(list((tmp_path / "reports").glob("images-run-2*.json"))) == 1
    lines = out.splitlines()
    assert lines[:4] == ["[gpu01] note: forward compatibility", "[gpu01] docker run --rm job", "[gpu01] loss 0.5",
                         "[gpu01] warn"]
    assert lines[4:7] == ["[gpu02] docker run --rm job", "[gpu02] loss 0.5", "[gpu02] warn"]


def test_detach_starts_and_the_json_document_has_the_report(ctx, tmp_path, capsys, contacted, monkeypatch):
    hosts_play(monkeypatch)
    code, out, _ = run(ctx, capsys, detach=True, json_=True)
    document = json.loads(out)
    assert code == 0 and [entry["status"] for entry in document["hosts"]] == ["started", "started"]
    assert document["report"].startswith(f"{tmp_path}/reports/images-run-") and document["detach"] is True
    assert report(tmp_path)["hosts"] == document["hosts"]


def test_a_failing_host_is_exit_1_and_its_entry_says_why(ctx, tmp_path, capsys, contacted, monkeypatch):
    hosts_play(monkeypatch, fail={"gpu02"})
    code, out, _ = run(ctx, capsys)
    assert code == 1
    ok, failed = report(tmp_path)["hosts"]
    assert ok["status"] == "ran"
    assert (failed["status"], failed["image"], failed["container"]) == ("failed", PINNED, "job")
    assert failed["error"] == {"error": "docker pull failed (exit 1)", "host": "gpu02", "step": "images.run",
                               "command": "docker pull x", "output": "denied", "hint": "check the registry"}
    assert out.splitlines()[4:9] == ["[gpu02] images.run: docker pull failed (exit 1)", "  command: docker pull x",
                                     "  output (tail):", "    denied", "  next: check the registry"]


def test_ctrl_c_is_exit_130_and_the_report_has_what_completed(ctx, tmp_path, capsys, contacted, monkeypatch):
    hosts_play(monkeypatch)

    def interrupted(hosts, work, settings, **kwargs):
        first, second = hosts
        done = Outcome(first, value=work(LocalConn(first, answer=lambda command, stdin: "")))
        raise RunInterrupted([done, Outcome(second, error=GpuprovError("not started: interrupted (Ctrl-C)",
                                                                       host=second.name), skipped=True)])

    monkeypatch.setattr(gpuprov.core.executor, "run_on_hosts", interrupted)
    code, _, err = run(ctx, capsys)
    assert code == 130
    document = report(tmp_path)
    assert document["interrupted"] is True
    assert [(entry["host"], entry["status"]) for entry in document["hosts"]] == [("gpu01", "ran"),
                                                                                ("gpu02", "skipped")]
    assert document["hosts"][0]["stdout"] == "loss 0.5\n"
    assert document["hosts"][1]["error"]["error"] == "not started: interrupted (Ctrl-C)"
    assert f"interrupted (Ctrl-C): the report {tmp_path}/reports/images-run-" in err
