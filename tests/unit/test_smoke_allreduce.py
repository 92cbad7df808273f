"""perf.allreduce records the network NCCL uses (from NCCL's own NCCL_DEBUG=INFO lines, as NCCL prints them in the
public logs cited below) with the host's RDMA devices, and fails a host with InfiniBand or RoCE devices whose NCCL
fell back to sockets. The torchrun of the check is replaced by one that writes what NCCL writes to the files
NCCL_DEBUG_FILE names; this machine has no NCCL and no RDMA device."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from gpuprov.smoke import perf_allreduce, torchutil  # noqa: E402
from gpuprov.smoke.core import Context  # noqa: E402
from gpuprov.smoke.torchutil import Target  # noqa: E402

# NVIDIA/nccl-tests#185 (NCCL 2.19.3, RoCE ports of a DGX H100)
IB_LINES = (
    "dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB "
    "enp220s0np0:11.1.128.136<0>\n"
    "dgxh100-4:460770:460842 [0] NCCL INFO Using non-device net plugin version 0\n"
    "dgxh100-4:460770:460842 [0] NCCL INFO Using network IB\n")
# NVIDIA/nccl#1357 (HPC-X's IB plugin)
IBEXT_LINES = "qh100-gpu19:49355:49414 [1] NCCL INFO Using network IBext\n"
# NVIDIA/nccl#1053 (IB turned off: sockets)
SOCKET_LINES = ("axa:3048391:3048566 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>\n"
                "axa:3048391:3048566 [0] NCCL INFO Using network Socket\n")
# NVIDIA/nccl#226 (an older NCCL: no "Using network" line; no IB device, sockets)
OLD_SOCKET_LINES = ("ip-172-31-12-21:45361:45361 [0] NCCL INFO NET/IB : No device found.\n"
                    "ip-172-31-12-210:45305:45305 [0] NCCL INFO NET/Socket : Using [0]ens3:172.31.12.210<0>\n")
# Mellanox/nv_peer_memory#56 (NCCL 2.4.7 prints NET/Socket's line, then uses IB)
OLD_IB_LINES = ("master_node:20:289 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>\n"
                "master_node:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>\n")


@pytest.mark.parametrize(("text", "network"), [
    (IB_LINES, "IB"), (IBEXT_LINES, "IB"), (SOCKET_LINES, "Socket"), (OLD_SOCKET_LINES, "Socket"),
    (OLD_IB_LINES, "IB"), (IB_LINES + SOCKET_LINES, "IB,Socket"), ("NCCL version 2.27.3+cuda12.9\n", None),
])
def test_the_network_nccl_says_it_uses(text, network):
    assert perf_allreduce.nccl_network(text) == network


def test_rdma_devices_are_the_hosts_infiniband_class_reachable_through_a_verbs_device_file(tmp_path):
    sysfs, dev = tmp_path / "class", tmp_path / "dev"
    for name in ("mlx5_1", "mlx5_0"):
        (sysfs / name).mkdir(parents=True)
    dev.mkdir()
    (dev / "rdma_cm").touch()
    assert perf_allreduce.rdma_devices(str(sysfs), str(dev)) == (["mlx5_0", "mlx5_1"], False)   # a container
    (dev / "uverbs0").touch()                                                                   # given the devices
    assert perf_allreduce.rdma_devices(str(sysfs), str(dev)) == (["mlx5_0", "mlx5_1"], True)
    assert perf_allreduce.rdma_devices(str(tmp_path / "none"), str(tmp_path / "none")) == ([], False)


def test_sockets_fail_only_where_the_host_has_rdma_devices_and_ib_is_not_turned_off():
    problem = perf_allreduce.transport_problem("Socket", ["mlx5_0"], False)
    assert problem.startswith("NCCL uses sockets (NET/Socket) on a host with RDMA devices (mlx5_0): it fell back")
    assert perf_allreduce.transport_problem("IB,Socket", ["mlx5_0"], False) == problem
    assert perf_allreduce.transport_problem("IB", ["mlx5_0"], False) is None
    assert perf_allreduce.transport_problem("Socket", [], False) is None          # Ethernet only: sockets it is
    assert perf_allreduce.transport_problem("Socket", ["mlx5_0"], True) is None   # NCCL_IB_DISABLE=1
    assert perf_allreduce.transport_problem(None, ["mlx5_0"], False) is None


@pytest.fixture
def eight_gpus(monkeypatch):
    """An 8-GPU host whose torchrun writes `lines` where NCCL_DEBUG_FILE says (per process: %h host, %p pid)."""
    seen = {}

    def setup(lines, devices, reachable=True):
        def local_run(target, args, timeout):
            seen["env"] = {key: os.environ.get(key) for key in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")}
            for pid in (101, 102):
                path = os.environ["NCCL_DEBUG_FILE"].replace("%h", "gpu01").replace("%p", str(pid))
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(lines)
            return {"bench": {"busbw_gbs": 470.0, "algbw_gbs": 268.6, "bytes": 1 << 30, "time_ms": 4.0, "iters": 20},
                    "problems": [], "backend": "nccl", "world_size": 8}, ""

        monkeypatch.setattr(torchutil, "setup_target",
                            lambda torch, config: Target("cuda", 8, ("NVIDIA H100 80GB HBM3",) * 8))
        monkeypatch.setattr(perf_allreduce, "local_run", local_run)
        monkeypatch.setattr(perf_allreduce, "rdma_devices", lambda: (devices, reachable))
        return perf_allreduce.run(Context({"level": "quick", "expected": {"allreduce_busbw_gbs": 480.0}}))

    return setup, seen


def test_a_host_with_infiniband_whose_nccl_fell_back_to_sockets_fails(eight_gpus, monkeypatch):
    monkeypatch.delenv("NCCL_IB_DISABLE", raising=False)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    setup, seen = eight_gpus
    result = setup(OLD_SOCKET_LINES, ["mlx5_0", "mlx5_1"])
    assert result.status == "fail"
    assert result.reason.startswith("NCCL uses sockets (NET/Socket) on a host with RDMA devices (mlx5_0, mlx5_1)")
    assert (result.figures["nccl_network"], result.figures["rdma_devices"]) == ("Socket", ["mlx5_0", "mlx5_1"])
    assert seen["env"]["NCCL_DEBUG"] == "INFO" and seen["env"]["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert seen["env"]["NCCL_DEBUG_FILE"].endswith("/nccl.%h.%p")
    assert os.environ["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" not in os.environ    # given back
    assert not os.path.exists(os.path.dirname(seen["env"]["NCCL_DEBUG_FILE"]))          # and removed


def test_infiniband_in_use_passes_and_is_recorded(eight_gpus):
    setup, _ = eight_gpus
    result = setup(IB_LINES, ["mlx5_10", "mlx5_11"])
    assert result.status == "pass", result.reason
    assert result.figures["nccl_network"] == "IB"
    assert "(nccl, NCCL network IB): bus bandwidth 470 GB/s" in result.reason


def test_sockets_on_a_host_without_rdma_devices_are_recorded_not_failed(eight_gpus):
    setup, _ = eight_gpus
    result = setup(SOCKET_LINES, [], reachable=False)
    assert result.status == "pass", result.reason
    assert (result.figures["nccl_network"], result.figures["rdma_devices"]) == ("Socket", [])


def test_a_container_not_given_the_rdma_devices_records_them_unreachable(eight_gpus):
    # sysfs shows the host's ports in a container that has no /dev/infiniband: NCCL cannot open them there
    setup, _ = eight_gpus
    result = setup(OLD_SOCKET_LINES, ["mlx5_0"], reachable=False)
    assert result.status == "pass", result.reason
    assert (result.figures["rdma_devices"], result.figures["rdma_reachable"]) == (["mlx5_0"], False)
