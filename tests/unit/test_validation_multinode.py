"""--multi-node: the join check names a host that cannot join, torchrun's command, and a real two-node
all-reduce (gloo, one small process per node) between two 'hosts' that are this machine. Runs that reach torchrun
(which firewalls the rendezvous port with nftables) happen in a network namespace of their own, and the judge of
the firewall is the kernel: connections between two namespaces joined by a veth pair. The workers run as root
here (the test's venv is this machine's Python below /root); the lab runs them as gpuprov-validate."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.local_host import LocalConn

from gpuprov.core.errors import GpuprovError
from gpuprov.core.executor import Outcome, Settings
from gpuprov.validation import Layout
from gpuprov.validation.host import ValidationRecord
from gpuprov.validation.multinode import (
    Node,
    firewall_rules,
    host_transport,
    nodes_for,
    parse_output,
    run_multinode,
    torchrun_command,
)

SETTINGS = Settings(known_hosts=Path("/nonexistent"), parallel=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NetnsConn(LocalConn):
    """LocalConn whose commands run in network namespace `netns` (None: this machine's), with `env`."""

    def __init__(self, name, netns=None, env=None):
        super().__init__(name, env=env)
        self.netns = netns

    def run(self, command, *, sudo=False, timeout=None, stdin=None):
        if self.netns:
            command = f"exec ip netns exec {self.netns} sh -c {shlex.quote(command)}"
        return super().run(command, sudo=sudo, timeout=timeout, stdin=stdin)


def local_run_on_hosts(hosts, work, settings, *, jump_of=None, on_event=None, netns=None, env=None):
    """run_on_hosts over LocalConn 'hosts', all at once (as run_multinode asks: parallel = every host)."""
    assert settings.parallel >= len(hosts)
    outcomes = {}

    def one(h):
        try:
            outcomes[h.name] = Outcome(h, value=work(NetnsConn(h.name, netns, env)))
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


def netns_run(netns, command, check=True):
    return subprocess.run(["ip", "netns", "exec", netns, "sh", "-c", command], capture_output=True, text=True,
                          check=check, timeout=60)


@pytest.fixture
def netns():
    """Network namespaces of the test's own (only their loopback up), removed afterwards."""
    made = []

    def make():
        name = f"gpuprov-test-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        made.append(name)
        netns_run(name, "ip link set lo up")
        return name

    yield make
    for name in made:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def layout(tmp_path):
    layout = Layout(root=str(tmp_path / "opt"))
    Path(layout.venv, "bin").mkdir(parents=True)
    Path(layout.python).symlink_to(sys.executable)
    return layout


def in_netns(name):
    def run_on_hosts(hosts, work, settings, **kwargs):
        return local_run_on_hosts(hosts, work, settings, netns=name, **kwargs)

    return run_on_hosts


@pytest.mark.root
@pytest.mark.tool
def test_two_nodes_all_reduce(layout, netns):
    ns = netns()
    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "127.0.0.1", 1, "cpu", True)]
    outcome = run_multinode(nodes, hosts("lab01", "lab02"), SETTINGS, jump_of=lambda h: None, port=free_port(),
                            level="quick", layout=layout, run_on_hosts=in_netns(ns), join_seconds=20, user="root")
    summary = outcome["summary"]
    assert summary["status"] == "pass", summary
    assert summary["worker_uids"] == [0] and summary["firewall"]["allowed"] == ["127.0.0.1"]
    assert netns_run(ns, "nft list tables").stdout == ""    # the rendezvous table is gone after the run
    result = outcome["results"]["lab02"]
    assert result["check"] == "multinode.allreduce" and result["status"] == "pass"
    assert result["reason"].startswith("all-reduce over 2 nodes (2 processes, gloo) correct; bus bandwidth ")
    assert result["figures"]["wrong_elements"] == 0 and result["figures"]["world_size"] == 2
    assert result["figures"]["size_bytes"] == 16 * 1024 * 1024 and result["figures"]["busbw_gbs"] > 0


@pytest.mark.root
def test_a_host_that_cannot_join_is_named(layout):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: lab02 cannot take part; lab03's validation failed
    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "192.0.2.1", 1, "cpu", True),
             Node("lab03", "127.0.0.1", 1, "cpu", False, "cannot reach 127.0.0.1:42203 after 3 attempts")]
    outcome = run_multinode(nodes, hosts("lab01", "lab02", "lab03"), SETTINGS, jump_of=lambda h: None,
                            port=free_port(), level="quick", layout=layout, run_on_hosts=local_run_on_hosts,
                            join_seconds=2, user="root")
    summary = outcome["summary"]
    assert summary["status"] == "fail" and set(summary["not_joined"]) == {"lab02", "lab03"}
    assert summary["not_joined"]["lab02"].startswith("its cluster_address 192.0.2.1 is not an address of this host")
    assert summary["not_joined"]["lab03"] == "cannot reach 127.0.0.1:42203 after 3 attempts"
    assert all(r["status"] == "fail" for r in outcome["results"].values())
    assert "did not join the rendezvous at 127.0.0.1:" in outcome["results"]["lab01"]["reason"]
    assert "lab02 (its cluster_address 192.0.2.1" in outcome["results"]["lab01"]["reason"]


@pytest.mark.root
def test_a_host_whose_address_is_not_its_own_is_not_waited_for(layout):
    import time

    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "192.0.2.1", 1, "cpu", True)]
    started = time.monotonic()
    outcome = run_multinode(nodes, hosts("lab01", "lab02"), SETTINGS, jump_of=lambda h: None, port=free_port(),
                            level="quick", layout=layout, run_on_hosts=local_run_on_hosts, join_seconds=30,
                            user="root")
    assert time.monotonic() - started < 15    # named at once, not after the 30 s join timeout
    assert list(outcome["summary"]["not_joined"]) == ["lab02"]


@pytest.mark.root
def test_an_unreachable_rendezvous_is_named(layout):
    port = free_port()
    with socket.socket() as busy:        # the first host cannot listen: the port is taken
        busy.bind(("127.0.0.1", port))
        busy.listen(1)
        nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "127.0.0.1", 1, "cpu", True)]
        outcome = run_multinode(nodes, hosts("lab01", "lab02"), SETTINGS, jump_of=lambda h: None, port=port,
                                level="quick", layout=layout, run_on_hosts=local_run_on_hosts, join_seconds=2,
                                user="root")
    not_joined = outcome["summary"]["not_joined"]
    assert not_joined["lab01"].startswith(f"the rendezvous host cannot listen on 127.0.0.1:{port}")


def test_torchrun_command():
    nodes = [Node("gpu01", "10.1.0.11", 8, "cuda", True), Node("gpu02", "10.1.0.12", 8, "cuda", True)]
    command = torchrun_command(nodes[1], nodes, port=29400, rdzv_id="gpuprov-abc", level="quick")
    assert command.startswith("cd /opt/gpuprov/multinode || exit 1; IFACE=$(ip -o addr show")
    assert ("exec setpriv --reuid=gpuprov-validate --regid=gpuprov-validate --init-groups --no-new-privs env "
            "HOME=/nonexistent /opt/gpuprov/venv/bin/python -E -s -B -m torch.distributed.run --nnodes=2 "
            "--nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=10.1.0.11:29400 --rdzv_id=gpuprov-abc "
            "--rdzv_conf=join_timeout=60,read_timeout=60,is_host=0 --local_addr=10.1.0.12 --max_restarts=0 "
            "allreduce_worker.py --inventory-name gpu02 --size-mib 256 --iters 10 --expect-device cuda") in command
    assert "nft" not in command   # only the rendezvous host firewalls its port
    first = torchrun_command(nodes[0], nodes, port=29400, rdzv_id="x", level="quick",
                             firewall=firewall_rules(29400, ["10.1.0.12"]))
    assert "is_host=1" in first and "| nft -f - ||" in first and "exec " not in first.split("trap")[-1]
    image = torchrun_command(nodes[0], nodes, port=29400, rdzv_id="x", level="burn-in", image="nvcr.io/x:1")
    assert "docker run --rm --gpus all --ipc=host --network host --ulimit memlock=-1 --ulimit stack=67108864" in image
    assert ' --user "$U:$G" $GA $RDMA nvcr.io/x:1 python3 -B -m' in image and "U=$(id -u gpuprov-validate)" in image
    for command_ in (first, image):   # NCCL's network is in its INFO lines; each host says its RDMA devices
        assert "export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET; printf 'GPUPROV-RDMA " in command_
    assert "--iters 100" in image


def test_the_image_workers_run_as_the_worker_user(tmp_path):
    """The shell expands the user's ids into docker's --user and --group-add (docker here prints its arguments)."""
    (tmp_path / "docker").write_text('#!/bin/sh\nfor a in "$@"; do printf "<%s>" "$a"; done\n')
    (tmp_path / "docker").chmod(0o755)
    nodes = [Node("gpu01", "127.0.0.1", 1, "cpu", True), Node("gpu02", "127.0.0.1", 1, "cpu", True)]
    command = torchrun_command(nodes[1], nodes, port=29400, rdzv_id="x", level="quick", image="img:1", user="root")
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                          env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"})
    groups = "".join(f"<--group-add><{g}>" for g in subprocess.run(["id", "-G", "root"], capture_output=True,
                                                                  text=True, check=True).stdout.split())
    assert f"<-e><HOME=/tmp><--user><0:0>{groups}<img:1><python3><-B><-m><torch.distributed.run>" in done.stdout


@pytest.mark.root
@pytest.mark.tool
def test_the_rendezvous_port_is_open_to_the_joined_hosts_only(netns):
    """Two namespaces on a veth pair: the rendezvous host (10.250.0.1) and a peer with two addresses, one of a
    joined host (10.250.0.2) and one of a stranger (10.250.0.3). The kernel decides what connects."""
    host, peer = netns(), netns()
    veth = f"gv{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "link", "add", veth + "a", "netns", host, "type", "veth", "peer", "name", veth + "b",
                    "netns", peer], check=True)
    netns_run(host, f"ip addr add 10.250.0.1/24 dev {veth}a && ip link set {veth}a up")
    netns_run(peer, f"ip addr add 10.250.0.2/24 dev {veth}b && ip addr add 10.250.0.3/24 dev {veth}b && "
                    f"ip link set {veth}b up")
    port = 29411
    server = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, "-c",
                               f"import socket, time; s = socket.create_server(('0.0.0.0', {port})); "
                               "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"

        def connects(source: str) -> bool:
            code = ("import socket, sys\ns = socket.socket(); s.settimeout(2); s.bind((sys.argv[1], 0))\n"
                    f"try:\n    s.connect(('10.250.0.1', {port})); print('yes')\nexcept OSError:\n    print('no')")
            return netns_run(peer, f"{sys.executable} -c {shlex.quote(code)} {source}").stdout.strip() == "yes"

        assert connects("10.250.0.2") and connects("10.250.0.3")        # open to anyone without the table
        rules = firewall_rules(port, ["10.250.0.2"])
        subprocess.run(["ip", "netns", "exec", host, "nft", "-f", "-"], input=rules, text=True, check=True)
        assert connects("10.250.0.2") and not connects("10.250.0.3")
        subprocess.run(["ip", "netns", "exec", host, "nft", "-f", "-"], input=rules, text=True, check=True)
        assert netns_run(host, "nft list tables").stdout.count("gpuprov_rdzv") == 1   # reloads replace it
    finally:
        server.kill()
        server.wait()


@pytest.mark.root
@pytest.mark.tool
@pytest.mark.parametrize("exit_code", [0, 3])
def test_the_rendezvous_table_stands_while_torchrun_runs_and_goes_when_it_ends(tmp_path, netns, exit_code):
    ns = netns()
    layout = Layout(root=str(tmp_path / "opt"))
    Path(layout.venv, "bin").mkdir(parents=True)
    Path(layout.multinode).mkdir(parents=True)
    Path(layout.python).write_text(f"#!/bin/sh\nnft list table inet gpuprov_rdzv_29412\nexit {exit_code}\n")
    Path(layout.python).chmod(0o755)
    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "127.0.0.1", 1, "cpu", True)]
    command = torchrun_command(nodes[0], nodes, port=29412, rdzv_id="x", level="quick", layout=layout,
                               user="root", firewall=firewall_rules(29412, ["127.0.0.1"]))
    done = netns_run(ns, command, check=False)
    assert done.returncode == exit_code and "tcp dport 29412 drop" in done.stdout    # in place while it ran
    assert netns_run(ns, "nft list tables").stdout == ""


@pytest.mark.root
def test_a_rendezvous_host_without_nft_is_refused(layout):
    """Fail closed: without nft the rendezvous port cannot be firewalled, and torchrun starts nowhere."""
    def no_nft(hosts_, work, settings, **kwargs):
        return local_run_on_hosts(hosts_, work, settings, env={**os.environ, "PATH": "/usr/bin:/bin"}, **kwargs)

    assert subprocess.run(["sh", "-c", "command -v nft"], env={"PATH": "/usr/bin:/bin"}).returncode != 0
    nodes = [Node("lab01", "127.0.0.1", 1, "cpu", True), Node("lab02", "127.0.0.1", 1, "cpu", True)]
    outcome = run_multinode(nodes, hosts("lab01", "lab02"), SETTINGS, jump_of=lambda h: None, port=free_port(),
                            level="quick", layout=layout, run_on_hosts=no_nft, join_seconds=5, user="root")
    assert outcome["summary"]["not_joined"] == {
        "lab01": f"cannot firewall the rendezvous port {outcome['summary']['rendezvous'].rsplit(':', 1)[1]}: nft is "
                 "missing or does not work (install nftables; the rendezvous does not start unfirewalled)"}
    assert "firewall" not in outcome["summary"]


def test_nodes_from_validation_runs():
    gpu = ValidationRecord("gpu01", results=[{"check": "host.gpus", "status": "pass"}], versions={"cuda": "12.8"},
                         config={"gpus_visible": True, "expect": {"count": 8}})
    lab = ValidationRecord("lab01", results=[{"check": "host.gpus", "status": "pass"}], versions={"cuda": None},
                         config={"gpus_visible": True, "expect": {"count": 8}})
    down = ValidationRecord("gpu02", error={"error": "cannot reach 10.1.0.12:22"})
    settings = {"gpu01": "10.1.0.11", "lab01": "172.20.0.2", "gpu02": "10.1.0.12"}
    found = nodes_for([gpu, lab, down], hosts("gpu01", "lab01", "gpu02"),
                      lambda h: SimpleNamespace(cluster_address=settings[h.name]))
    assert found == [Node("gpu01", "10.1.0.11", 8, "cuda", True), Node("lab01", "172.20.0.2", 1, "cpu", True),
                     Node("gpu02", "10.1.0.12", 1, "cpu", False, "cannot reach 10.1.0.12:22")]


def test_parse_output():
    import json

    line = {"world_size": 16, "backend": "nccl", "nodes": ["gpu01", "gpu02"], "size_bytes": 1 << 28,
            "expected_sum": 136.0, "wrong_elements": 0, "algbw_gbs": 40.0, "busbw_gbs": 75.0}
    text = f"W0101 warning\nGPUPROV-MULTINODE {json.dumps(line)}\n[rank0]: done"
    assert parse_output(text) == line
    assert parse_output("RendezvousTimeoutError") is None
    # a line that is not what the worker prints is no result (gpuprov.validation.document.ALLREDUCE)
    assert parse_output(text.replace("75.0", "1e300")) is None
    assert parse_output(text.replace("16", "[1, 2]", 1)) is None
    assert parse_output("GPUPROV-MULTINODE " + "[" * 100000) is None


# NCCL's lines as NCCL prints them: NVIDIA/nccl-tests#185 (IB over RoCE ports), NVIDIA/nccl#226 (an older NCCL
# without an IB device: sockets)
NCCL_IB = ("dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB "
           "enp220s0np0:11.1.128.136<0>\ndgxh100-4:460770:460842 [0] NCCL INFO Using network IB\n")
NCCL_SOCKET = ("ip-172-31-12-21:45361:45361 [0] NCCL INFO NET/IB : No device found.\n"
               "ip-172-31-12-210:45305:45305 [0] NCCL INFO NET/Socket : Using [0]ens3:172.31.12.210<0>\n")


def stub(folder: Path, name: str, script: str) -> None:
    (folder / name).write_text("#!/bin/sh\n" + script)
    (folder / name).chmod(0o755)


@pytest.mark.parametrize(("listing", "flags"), [
    ("rdma_cm\nuverbs0\numad0", "<--device=/dev/infiniband><--cap-add=IPC_LOCK>"),   # a ConnectX port
    ("", ""),                                                                      # no RDMA device
])
def test_an_image_run_gives_the_rdma_devices_and_ipc_lock_where_the_host_has_them(tmp_path, listing, flags):
    """The shell decides from what `ls` lists under /dev/infiniband (ls here prints a host's listing; docker prints
    its arguments); each host's probe line says its RDMA devices (/sys/class/infiniband)."""
    stub(tmp_path, "docker", 'for a in "$@"; do printf "<%s>" "$a"; done\n')
    stub(tmp_path, "ls", f'case "$1" in /dev/infiniband) printf "{listing}\\n";; '
                         f'/sys/class/infiniband) [ -n "{listing}" ] && printf "mlx5_0\\nmlx5_1\\n";; esac\n')
    nodes = [Node("gpu01", "127.0.0.1", 1, "cpu", True), Node("gpu02", "127.0.0.1", 1, "cpu", True)]
    command = torchrun_command(nodes[1], nodes, port=29400, rdzv_id="x", level="quick", image="img:1", user="root")
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                          env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "NCCL_IB_DISABLE": ""})
    assert "<-e><NCCL_DEBUG><-e><NCCL_DEBUG_SUBSYS><-e><HOME=/tmp><--user><0:0>" in done.stdout
    assert f"{flags}<img:1><python3>" in done.stdout
    assert host_transport(done.stdout) == {"nccl_network": None, "ib_disabled": False, "rdma_reachable": bool(listing),
                                           "rdma_devices": ["mlx5_0", "mlx5_1"] if listing else []}


def scripted(outputs: dict):
    """run_on_hosts for a run that reaches torchrun: every host joins, each torchrun prints `outputs[host]`."""
    worker = {"world_size": 16, "backend": "nccl", "nodes": ["gpu01", "gpu02"], "size_bytes": 1 << 28,
              "expected_sum": 136.0, "wrong_elements": 0, "algbw_gbs": 40.0, "busbw_gbs": 75.0, "uids": [999]}

    def run_on_hosts(hosts_, work, settings, **kwargs):
        import json

        values = {"own": lambda h: {"own": True},
                  "join": lambda h: {"joined": {"gpu02": "10.1.0.12"}} if h.name == "gpu01" else {"joined": True},
                  "torchrun": lambda h: {"rc": 0, "output": outputs[h.name] + (
                      f"GPUPROV-MULTINODE {json.dumps(worker)}\n" if h.name == "gpu01" else "")}}
        return [Outcome(h, value=values[work.__name__](h)) for h in hosts_]

    return run_on_hosts


def two_gpu_nodes(outputs):
    nodes = [Node("gpu01", "10.1.0.11", 8, "cuda", True), Node("gpu02", "10.1.0.12", 8, "cuda", True)]
    return run_multinode(nodes, hosts("gpu01", "gpu02"), SETTINGS, jump_of=lambda h: None, port=29400,
                         level="quick", run_on_hosts=scripted(outputs), user="gpuprov-validate")


def test_a_host_with_rdma_devices_whose_nccl_fell_back_to_sockets_fails_the_run():
    outcome = two_gpu_nodes({"gpu01": "GPUPROV-RDMA mlx5_10 mlx5_11 |2|\n" + NCCL_IB,
                             "gpu02": "GPUPROV-RDMA mlx5_0 mlx5_1 |2|\n" + NCCL_SOCKET})
    result = outcome["results"]["gpu02"]
    assert result["status"] == "fail"
    assert result["reason"].startswith("NCCL fell back to sockets (NET/Socket) on hosts with RDMA devices: gpu02 "
                                       "(RDMA devices mlx5_0, mlx5_1, NCCL network Socket)")
    assert (result["figures"]["nccl_network"], result["figures"]["rdma_devices"]) == ("Socket", ["mlx5_0", "mlx5_1"])
    assert outcome["results"]["gpu01"]["figures"]["nccl_network"] == "IB"
    assert outcome["summary"]["transport"]["gpu01"] == {"nccl_network": "IB", "rdma_devices": ["mlx5_10", "mlx5_11"],
                                                        "rdma_reachable": True, "ib_disabled": False}


def test_sockets_pass_where_no_host_has_rdma_devices_it_can_open_or_ib_was_turned_off():
    outcome = two_gpu_nodes({"gpu01": "GPUPROV-RDMA mlx5_0 |0|\n" + NCCL_SOCKET,
                             "gpu02": "GPUPROV-RDMA mlx5_0 |1|1\n" + NCCL_SOCKET})
    result = outcome["results"]["gpu01"]
    assert result["status"] == "pass", result["reason"]
    assert result["reason"] == ("all-reduce over 2 nodes (16 processes, nccl, NCCL network Socket) correct; bus "
                                "bandwidth 75.00 GB/s")


def test_the_verdict_fails_root_workers_missing_processes_and_wrong_elements():
    from gpuprov.validation.multinode import run_verdict

    nodes = [Node("a", "10.0.0.1", 1, "cpu", True), Node("b", "10.0.0.2", 1, "cpu", True)]
    found = {"nodes": ["a", "b"], "world_size": 2, "backend": "gloo", "busbw_gbs": 1.5, "algbw_gbs": 1.5,
             "size_bytes": 1024, "wrong_elements": 0, "expected_sum": 3.0, "uids": [999, 999]}
    status, reason, figures = run_verdict(found, nodes, {}, "gpuprov-worker")
    assert (status, reason) == ("pass", "all-reduce over 2 nodes (2 processes, gloo) correct; bus bandwidth 1.50 GB/s")
    assert figures == {"nodes": 2, "world_size": 2, "backend": "gloo", "busbw_gbs": 1.5, "algbw_gbs": 1.5,
                       "size_bytes": 1024, "wrong_elements": 0}
    assert run_verdict({**found, "uids": [0, 999]}, nodes, {}, "gpuprov-worker")[:2] == (
        "fail", "the workers ran as root, not as gpuprov-worker")
    assert run_verdict({**found, "nodes": ["a"], "world_size": 1}, nodes, {}, "gpuprov-worker")[:2] == (
        "fail", "1 of 2 processes took part; missing: b")
    assert run_verdict({**found, "wrong_elements": 7}, nodes, {}, "gpuprov-worker")[:2] == (
        "fail", "all-reduce over 2 nodes gave 7 wrong elements (expected every element 3)")
