"""Copying the suite to a host, its config, the command that runs it (venv or container) and one whole host
validation run here: facts (given), the resolved stack, the venv from a small wheelhouse, a stand-in suite that
prints a document, the parsed results."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.local_host import LocalConn, tiny_wheelhouse

from gpuprov.core.errors import GpuprovError
from gpuprov.inventory import load_inventory
from gpuprov.validation import Layout
from gpuprov.validation.host import TEXTFILE, publish_textfile
from gpuprov.validation.remote import Remote
from gpuprov.validation.suite import files_digest, push_suite, run_suite, suite_command, write_config

# a stand-in for gpuprov/smoke: prints the document shape with one result built from its config
STAND_IN = {
    "__init__.py": b"",
    "__main__.py": textwrap.dedent("""\
        import argparse, json
        from .checks.one import result
        parser = argparse.ArgumentParser()
        parser.add_argument("--config"); parser.add_argument("--level"); parser.add_argument("--strict",
                            action="store_true"); parser.add_argument("--only")
        args = parser.parse_args()
        config = json.load(open(args.config))
        print(json.dumps({"schema": 1, "host": config["host"], "level": args.level, "started": "x",
                          "seconds": 0.1, "versions": {"torch": None, "cuda": None},
                          "results": [result(config, args)]}))
        """).encode(),
    "checks/__init__.py": b"",
    "checks/one.py": textwrap.dedent("""\
        def result(config, args):
            import gpuprov_probe
            return {"check": "host.gpus", "status": "fail" if args.strict else "pass",
                    "reason": "expected %s x %s, probe %d" % (config["expect"]["count"], config["expect"]["gpu"],
                                                                 gpuprov_probe.VALUE),
                    "figures": {"only": args.only}, "thresholds": {}, "seconds": 0.0}
        """).encode(),
}


@pytest.mark.root
def test_suite_is_copied_once_and_swapped_in(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    conn = LocalConn()
    remote = Remote(conn)
    assert push_suite(remote, None, layout, STAND_IN) is True
    copied = {str(p.relative_to(layout.smoke)) for p in Path(layout.smoke).rglob("*") if p.is_file()}
    assert copied == {*STAND_IN, ".gpuprov-digest"}
    assert Path(layout.smoke_marker).read_text().strip() == files_digest(STAND_IN)
    assert sorted(os.listdir(layout.root)) == ["smoke"]   # the root-only staging folder was moved, not left behind
    assert conn.uploads == [] and all(conn.sudo)          # over root's stdin: nothing the SSH user could write
    assert all(os.stat(p).st_uid == 0 for p in Path(layout.smoke).rglob("*"))
    conn.commands.clear()
    assert push_suite(remote, files_digest(STAND_IN), layout, STAND_IN) is False
    assert conn.commands == []
    changed = {**STAND_IN, "checks/two.py": b"X = 1\n"}
    assert push_suite(remote, files_digest(STAND_IN), layout, changed) is True
    assert (Path(layout.smoke) / "checks" / "two.py").read_bytes() == b"X = 1\n"
    assert not os.path.exists(f"{layout.smoke}.old")


def test_suite_commands():
    layout = Layout()
    assert suite_command(level="quick", strict=False) == (
        "cd /opt/gpuprov && /opt/gpuprov/venv/bin/python -E -s -B -m smoke "
        "--config /opt/gpuprov/run/config.json --level quick")
    assert suite_command(level="burn-in", strict=True, only=["host.ecc", "perf.matmul"], layout=layout).endswith(
        "--level burn-in --strict --only host.ecc,perf.matmul")
    assert suite_command(level="quick", strict=False, image="nvcr.io/nvidia/pytorch:25.04-py3") == (
        "docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 "
        "-v /opt/gpuprov/smoke:/opt/gpuprov/smoke:ro -v /opt/gpuprov/run:/opt/gpuprov/run:ro -w /opt/gpuprov "
        "-e PYTHONDONTWRITEBYTECODE=1 nvcr.io/nvidia/pytorch:25.04-py3 python3 -m smoke "
        "--config /opt/gpuprov/run/config.json --level quick")
    # validate.image_ulimits: a limit changed, one left to the engine (hosts that may not raise it)
    assert "--ipc=host --ulimit stack=8388608 -v" in suite_command(
        level="quick", strict=False, image="img:1", ulimits={"memlock": None, "stack": 8388608})


@pytest.mark.root
def test_config_and_run(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    remote = Remote(LocalConn())
    push_suite(remote, None, layout, STAND_IN)
    write_config(remote, {"host": "lab01", "expect": {"count": 8, "gpu": "H100-SXM"}}, layout)
    assert json.loads(Path(layout.config).read_text())["host"] == "lab01"
    assert [p for p in os.listdir(layout.run) if p.startswith(".")] == []    # no temporary file left
    Path(layout.venv, "bin").mkdir(parents=True)
    os.symlink(sys.executable, layout.python)
    (Path(layout.root) / "gpuprov_probe.py").write_text("VALUE = 7\n")     # found from the suite's folder
    document = run_suite(remote, suite_command(level="quick", strict=True, only=["host.gpus"], layout=layout),
                         "quick")
    assert document["results"] == [{"check": "host.gpus", "status": "fail", "reason": "expected 8 x H100-SXM, probe 7",
                                    "figures": {"only": "host.gpus"}, "thresholds": {}, "seconds": 0.0}]


@pytest.mark.root
def test_a_suite_that_differs_from_its_sums_is_not_swapped_in(tmp_path, monkeypatch):
    from gpuprov.validation import suite

    layout = Layout(root=str(tmp_path / "opt"))
    remote = Remote(LocalConn())
    push_suite(remote, None, layout, STAND_IN)
    real = suite.suite_archive
    monkeypatch.setattr(suite, "suite_archive", lambda files: real({**files, "__init__.py": b"import os\n"}))
    with pytest.raises(GpuprovError, match="command failed") as caught:
        push_suite(remote, "other", layout, {**STAND_IN, "checks/two.py": b"X = 1\n"})
    assert "__init__.py: FAILED" in caught.value.output
    assert sorted(os.listdir(layout.root)) == ["smoke"] and Path(layout.smoke, "__init__.py").read_bytes() == b""


@pytest.mark.root
@pytest.mark.parametrize("owner", ["other user", "group writable", "symlinked"])
def test_root_writes_only_into_folders_root_alone_can_change(tmp_path, owner):
    """The suite config and the textfile: a folder another user can change (where a symlink could be swapped in
    for the temporary file) is refused, and nothing is written through it."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    folder = tmp_path / "textfile"
    if owner == "symlinked":
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, -1)
        folder.symlink_to(theirs)
    else:
        folder.mkdir()
        os.chown(folder, 65534, -1) if owner == "other user" else folder.chmod(0o775)
    with pytest.raises(GpuprovError, match=f"root does not write into {folder}: ") as caught:
        publish_textfile(LocalConn(), "gpuprov_up 1\n", str(folder))
    assert "validate.textfile_dir" in caught.value.hint
    assert caught.value.message.endswith(("is owned by uid 65534, not root", "(mode 775)"))
    assert os.listdir(folder) == []
    layout = Layout(root=str(folder / "opt"))
    with pytest.raises(GpuprovError, match="root does not write into"):
        write_config(Remote(LocalConn()), {"host": "lab01"}, layout)
    assert not os.path.exists(layout.root)
    assert publish_textfile(LocalConn(), "gpuprov_up 1\n", str(target / "new")) == f"{target}/new/{TEXTFILE}"


INVENTORY = textwrap.dedent("""\
    defaults: {user: root}
    groups:
      lab:
        vars: {validate: {torch_wheel: cpu, torch_version: latest, torch_index: ""}}
    hosts:
      lab01:
        address: 127.0.0.1
        port: 42201
        groups: [lab]
        vars:
          hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
          cluster_address: 127.0.0.1
    """)


@pytest.mark.root
def test_one_host_end_to_end(tmp_path, monkeypatch):
    """validate's run on a 'host' that is this machine: the lab's CPU wheel settings, a wheelhouse, the venv,
    the suite, its config and its results."""
    from gpuprov.validation import env, host, suite

    inventory = tmp_path / "lab.yaml"
    inventory.write_text(INVENTORY)
    lab01 = load_inventory(inventory).host("lab01")
    facts = {"os": {"key": "debian-12", "family": "debian"}, "arch": "x86_64",
             "pci_gpus": [{"device_id": "2330", "model": "H100-SXM"}] * 8, "nvswitch_count": 4,
             "nvidia_smi": {"driver_version": "570.148.08", "gpus": [{"index": i} for i in range(8)]},
             "docker": None}
    requests = []
    wheelhouse = tiny_wheelhouse(tmp_path / "controller")

    def fake_wheelhouse_for(request, root, say=None, run=None):
        requests.append((request, root))
        return wheelhouse

    monkeypatch.setattr("gpuprov.facts.gather.gather", lambda conn, *args, **kwargs: facts)
    monkeypatch.setattr(env, "wheelhouse_for", fake_wheelhouse_for)
    monkeypatch.setattr(suite, "smoke_files", lambda: STAND_IN)
    layout = Layout(root=str(tmp_path / "opt"))
    options = host.RunOptions(locks_dir=tmp_path / "locks", wheelhouse=tmp_path / "wh", layout=layout)
    said = []
    conn = LocalConn("lab01")
    conn.host = lab01   # the inventory's host, as the executor's connections carry it
    run = host.ValidateJob(options).run_host(conn, said.append)

    (request, root), = requests
    assert (request.wheel, request.torch_version, request.torch_index, root) == ("cpu", None, None, tmp_path / "wh")
    assert run.results == [{"check": "host.gpus", "status": "pass", "reason": "expected 8 x H100-SXM, probe 42",
                            "figures": {"only": None}, "thresholds": {}, "seconds": 0.0}]
    assert run.env["installed"] is True and run.suite_copied is True and run.lock is None
    assert run.config["expect"]["gpu"] == "H100-SXM" and run.config["gpus_visible"] is True
    assert run.cluster_address == "127.0.0.1" and run.gpu == "H100-SXM"
    assert said[0] == "facts" and "suite (quick)" in said
    entry = run.to_dict()
    assert entry["status"] == "pass" and entry["fleet"] == {"group": "H100-SXM (CPU, quick)", "figures": {}}

    again = host.ValidateJob(options).run_host(conn, lambda what: None)
    assert again.env["installed"] is False and again.env["uploaded"] == [] and again.suite_copied is False
