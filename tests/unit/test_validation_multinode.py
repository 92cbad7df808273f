"""--multi-node: the join check names a host that cannot join, torchrun's command, and a real two-node
all-reduce (gloo, one small process per node) between two 'hosts' that are this machine."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_validation_env import LocalConn

from gpuprov.errors import GpuprovError
from gpuprov.executor import Outcome, Settings
from gpuprov.validation import Layout
from gpuprov.validation.host import HostValidation
from gpuprov.validation.multinode import Node, nodes_for, parse_output, run_multinode, torchrun_command

SETTINGS = Settings(known_hosts=Path("/nonexistent"), parallel=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_run_on_hosts(hosts, work, settings, *, jump_of=None, on_event=None):
    """run_on_hosts over LocalConn 'hosts', all at once (as run_multinode asks: parallel = every host)."""
    assert settings.parallel >= len(hosts)
    outcomes = {}

    def one(h):
        try:
            outcomes[h.name] = Outcome(h, value=work(LocalConn(h.name)))
        except GpuprovError as exc:
            outcomes[h.name] = Outcome(h, error=exc)

    threads = [threading.Thread(target=one, args=(h,)) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [outcomes[h.name] for h in hosts]


def hosts(*names):
    return [SimpleNamespace(name=name, address="127.0.0.1") for name in names]


@pytest.fixture
def layout(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    Path(layout.venv, "bin").mkdir(parents=True)
    Path(layout.python).symlink_to(sys.executable)
    return layout


def test_two_nodes_all_reduce(layout):
    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "127.0.0.1", 1, "cpu", True)]
    outcome = run_multinode(nodes, hosts("lab01", "lab02"), SETTINGS, jump_of=lambda h: None, port=free_port(),
                            level="quick", layout=layout, run_on_hosts=local_run_on_hosts, join_seconds=20)
    summary = outcome["summary"]
    assert summary["status"] == "pass", summary
    result = outcome["results"]["lab02"]
    assert result["check"] == "multinode.allreduce" and result["status"] == "pass"
    assert result["reason"].startswith("all-reduce over 2 nodes (2 processes, gloo) correct; bus bandwidth ")
    assert result["figures"]["wrong_elements"] == 0 and result["figures"]["world_size"] == 2
    assert result["figures"]["size_bytes"] == 16 * 1024 * 1024 and result["figures"]["busbw_gbs"] > 0


def test_a_host_that_cannot_join_is_named(layout):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: lab02 cannot take part; lab03's validation failed
    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "192.0.2.1", 1, "cpu", True),
             Node("lab03", "127.0.0.1", 1, "cpu", False, "cannot reach 127.0.0.1:42203 after 3 attempts")]
    outcome = run_multinode(nodes, hosts("lab01", "lab02", "lab03"), SETTINGS, jump_of=lambda h: None,
                            port=free_port(), level="quick", layout=layout, run_on_hosts=local_run_on_hosts,
                            join_seconds=2)
    summary = outcome["summary"]
    assert summary["status"] == "fail" and set(summary["not_joined"]) == {"lab02", "lab03"}
    assert summary["not_joined"]["lab02"].startswith("its cluster_address 192.0.2.1 is not an address of this host")
    assert summary["not_joined"]["lab03"] == "cannot reach 127.0.0.1:42203 after 3 attempts"
    assert all(r["status"] == "fail" for r in outcome["results"].values())
    assert "did not join the rendezvous at 127.0.0.1:" in outcome["results"]["lab01"]["reason"]
    assert "lab02 (its cluster_address 192.0.2.1" in outcome["results"]["lab01"]["reason"]


def test_a_host_whose_address_is_not_its_own_is_not_waited_for(layout):
    import time

    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "192.0.2.1", 1, "cpu", True)]
    started = time.monotonic()
    outcome = run_multinode(nodes, hosts("lab01", "lab02"), SETTINGS, jump_of=lambda h: None, port=free_port(),
                            level="quick", layout=layout, run_on_hosts=local_run_on_hosts, join_seconds=30)
    assert time.monotonic() - started < 15    # named at once, not after the 30 s join timeout
    assert list(outcome["summary"]["not_joined"]) == ["lab02"]


def test_an_unreachable_rendezvous_is_named(layout):
    port = free_port()
    with socket.socket() as busy:        # the first host cannot listen: the port is taken
        busy.bind(("127.0.0.1", port))
        busy.listen(1)
        nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "127.0.0.1", 1, "cpu", True)]
        outcome = run_multinode(nodes, hosts("lab01", "lab02"), SETTINGS, jump_of=lambda h: None, port=port,
                                level="quick", layout=layout, run_on_hosts=local_run_on_hosts, join_seconds=2)
    not_joined = outcome["summary"]["not_joined"]
    assert not_joined["lab01"].startswith(f"the rendezvous host cannot listen on 127.0.0.1:{port}")


def test_torchrun_command():
    nodes = [Node("gpu01", "10.1.0.11", 8, "cuda", True), Node("gpu02", "10.1.0.12", 8, "cuda", True)]
    command = torchrun_command(nodes[1], nodes, port=29400, rdzv_id="gpuprov-abc", level="quick")
    assert command.startswith("cd /opt/gpuprov/multinode || exit 1; IFACE=$(ip -o addr show")
    assert ("exec /opt/gpuprov/venv/bin/python -m torch.distributed.run --nnodes=2 --nproc_per_node=8 "
            "--rdzv_backend=c10d --rdzv_endpoint=10.1.0.11:29400 --rdzv_id=gpuprov-abc "
            "--rdzv_conf=join_timeout=60,read_timeout=60,is_host=0 --local_addr=10.1.0.12 --max_restarts=0 "
            "allreduce_worker.py --inventory-name gpu02 --size-mib 256 --iters 10") in command
    assert "is_host=1" in torchrun_command(nodes[0], nodes, port=29400, rdzv_id="x", level="quick")
    image = torchrun_command(nodes[0], nodes, port=29400, rdzv_id="x", level="burn-in", image="nvcr.io/x:1")
    assert "docker run --rm --gpus all --ipc=host --network host --ulimit memlock=-1 --ulimit stack=67108864" in image
    assert "nvcr.io/x:1 python3 -m" in image
    assert "--iters 100" in image


def test_nodes_from_validation_runs():
    gpu = HostValidation("gpu01", results=[{"check": "host.gpus", "status": "pass"}], versions={"cuda": "12.8"},
                         config={"gpus_visible": True, "expect": {"count": 8}})
    lab = HostValidation("lab01", results=[{"check": "host.gpus", "status": "pass"}], versions={"cuda": None},
                         config={"gpus_visible": True, "expect": {"count": 8}})
    down = HostValidation("gpu02", error={"error": "cannot reach 10.1.0.12:22"})
    settings = {"gpu01": "10.1.0.11", "lab01": "172.20.0.2", "gpu02": "10.1.0.12"}
    found = nodes_for([gpu, lab, down], hosts("gpu01", "lab01", "gpu02"),
                      lambda h: SimpleNamespace(cluster_address=settings[h.name]))
    assert found == [Node("gpu01", "10.1.0.11", 8, "cuda", True), Node("lab01", "172.20.0.2", 1, "cpu", True),
                     Node("gpu02", "10.1.0.12", 1, "cpu", False, "cannot reach 10.1.0.12:22")]


def test_parse_output():
    text = "W0101 warning\nGPUPROV-MULTINODE {\"world_size\": 16}\n[rank0]: done"
    assert parse_output(text) == {"world_size": 16}
    assert parse_output("RendezvousTimeoutError") is None
