"""The DDP worker torchrun starts on every rank: train.ddp and perf.allreduce on one host, and the multi-node run
of `invoke validate --multi-node` (torchrun on every host with one c10d rendezvous).

Every rank joins the process group (NCCL on GPUs, gloo on the CPU) and checks an all-reduce exactly: rank r
contributes r + 1 in every element, so every element of the sum is n(n+1)/2. Then, when asked, it trains a small
model under DistributedDataParallel (each rank on its own data) and checks that every rank ends with the same
parameters, and measures all-reduce bandwidth the NCCL-tests way: algbw = bytes / time, busbw = algbw * 2(n-1)/n.

Rank 0 prints one JSON line on stdout, marked `"ddp_worker": 1`, with the hosts that took part. Exit status: 0
when every check held, 1 when one did not, 2 when the worker could not start (not under torchrun, an unknown
--bind-addr), 3 when --deadline passed.

Standalone on purpose: torchrun runs it as a script, so it imports only the standard library and torch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time

MARK = "ddp_worker"
PARAM_TOLERANCE = 1e-6   # largest parameter difference between ranks after DDP steps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="auto: NCCL when torch sees a GPU, else gloo")
    parser.add_argument("--elements", type=int, default=1 << 16, help="elements of the exactly checked all-reduce")
    parser.add_argument("--train-steps", type=int, default=0, help="DDP training steps (0: none)")
    parser.add_argument("--bench-mb", type=float, default=0.0, help="all-reduce bandwidth message size in MiB")
    parser.add_argument("--bench-iters", type=int, default=20)
    parser.add_argument("--bench-warmup", type=int, default=5)
    parser.add_argument("--expect-world-size", type=int, default=0, help="fail unless this many ranks joined")
    parser.add_argument("--bind-addr", default="", help="use the network interface that has this address "
                        "(sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME where they are unset)")
    parser.add_argument("--timeout", type=float, default=120.0, help="process group timeout, seconds")
    parser.add_argument("--deadline", type=float, default=0.0, help="exit 3 after this many seconds (0: never)")
    return parser.parse_args(argv)


def interface_of(address: str) -> str | None:
    """The network interface whose (primary) IPv4 address is `address` (a name is resolved first)."""
    import fcntl

    wanted = socket.gethostbyname(address)
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == wanted:
            return name
    return None


def watchdog(seconds: float) -> None:
    def expire() -> None:
        time.sleep(seconds)
        print(f"ddp_worker rank {os.environ.get('RANK')}: deadline of {seconds:g} s passed", file=sys.stderr,
              flush=True)
        os._exit(3)

    threading.Thread(target=expire, daemon=True).start()


def check_allreduce(torch, dist, device, rank: int, world: int, elements: int) -> dict:
    tensor = torch.full((elements,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    wrong = int((tensor != expected).sum().item())
    return {"expected": expected, "wrong": wrong, "min": tensor.min().item(), "max": tensor.max().item()}


def train(torch, dist, device, rank: int, world: int, steps: int, local_rank: int) -> dict:
    """DDP steps on a fixed learnable regression (each rank its own inputs, one teacher): the losses of this
    rank and the largest difference of the final parameters from rank 0's."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    teacher = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    inputs = torch.randn(256, 32, generator=torch.Generator().manual_seed(1000 + rank))
    inputs, labels = inputs.to(device), (inputs @ teacher).to(device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    flat = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    difference = max((other - gathered[0]).abs().max().item() for other in gathered)
    return {"losses": losses, "max_param_diff": difference}


def bench(torch, dist, device, world: int, megabytes: float, iters: int, warmup: int) -> dict:
    """Median seconds of one all-reduce of a float32 message on this rank (CUDA events on a GPU)."""
    elements = max(1, int(megabytes * (1 << 20)) // 4)
    message = torch.randn(elements, device=device, generator=torch.Generator(device=device).manual_seed(11))
    for _ in range(warmup):
        dist.all_reduce(message)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(message)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            dist.barrier()
            began = time.perf_counter()
            dist.all_reduce(message)
            times.append(time.perf_counter() - began)
    return {"bytes": elements * 4, "iters": iters, "median_s": statistics.median(times)}


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """NCCL-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n, comparable across rank counts with the
    hardware's link bandwidth (nccl-tests doc/PERFORMANCE.md)."""
    return algbw * 2 * (ranks - 1) / ranks


def problems_of(report: dict, expect_world: int) -> list[str]:
    """What rank 0 found wrong in the gathered results."""
    problems = []
    world = report["world_size"]
    if expect_world and world != expect_world:
        problems.append(f"{world} ranks joined, {expect_world} expected")
    wrong = {rank: item for rank, item in enumerate(report["allreduce"]["per_rank"]) if item["wrong"]}
    if wrong:
        expected = report["allreduce"]["expected"]
        problems.append("all-reduce result wrong on rank(s) " + ", ".join(
            f"{rank} ({item['wrong']} elements, values {item['min']:g}..{item['max']:g}, {expected:g} expected)"
            for rank, item in wrong.items()))
    training = report.get("train")
    if training:
        bad = [rank for rank, losses in enumerate(training["losses_per_rank"])
               if not all(loss == loss and abs(loss) != float("inf") for loss in losses)]
        if bad:
            problems.append(f"DDP loss not finite on rank(s) {bad}")
        if not training["max_param_diff"] <= PARAM_TOLERANCE:
            problems.append(f"parameters differ between ranks after {training['steps']} DDP steps (largest "
                            f"difference {training['max_param_diff']:.3g}, at most {PARAM_TOLERANCE:g} allowed)")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("ddp_worker: run me under torchrun (RANK and WORLD_SIZE are not set)", file=sys.stderr)
        return 2
    began = time.monotonic()
    if args.deadline > 0:
        watchdog(args.deadline)
    if args.bind_addr:
        interface = interface_of(args.bind_addr)
        if interface is None:
            print(f"ddp_worker: no network interface has the address {args.bind_addr}", file=sys.stderr)
            return 2
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        me = {"rank": rank, "host": socket.gethostname(), "node_rank": int(os.environ.get("GROUP_RANK", "0")),
              "local_rank": local_rank,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
        ranks: list = [None] * world
        dist.all_gather_object(ranks, me)
        mine = {"allreduce": check_allreduce(torch, dist, device, rank, world, args.elements)}
        if args.train_steps:
            mine["train"] = train(torch, dist, device, rank, world, args.train_steps, local_rank)
        if args.bench_mb > 0:
            mine["bench"] = bench(torch, dist, device, world, args.bench_mb, args.bench_iters, args.bench_warmup)
        everyone: list = [None] * world
        dist.all_gather_object(everyone, mine)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    hosts: dict[str, int] = {}
    for item in ranks:
        hosts[item["host"]] = hosts.get(item["host"], 0) + 1
    report = {MARK: 1, "backend": backend, "world_size": world, "nodes": len({item["node_rank"] for item in ranks}),
              "hosts": hosts, "ranks": ranks,
              "allreduce": {"elements": args.elements, "expected": mine["allreduce"]["expected"],
                            "per_rank": [item["allreduce"] for item in everyone]}}
    if args.train_steps:
        report["train"] = {"steps": args.train_steps, "losses": mine["train"]["losses"],
                           "losses_per_rank": [item["train"]["losses"] for item in everyone],
                           "max_param_diff": mine["train"]["max_param_diff"]}
    if args.bench_mb > 0:
        slowest = max(item["bench"]["median_s"] for item in everyone)
        algbw = mine["bench"]["bytes"] / slowest / 1e9
        report["bench"] = {"bytes": mine["bench"]["bytes"], "iters": args.bench_iters, "dtype": "float32",
                           "time_ms": round(slowest * 1e3, 4), "algbw_gbs": round(algbw, 3),
                           "busbw_gbs": round(bus_bandwidth(algbw, world), 3)}
    report["problems"] = problems_of(report, args.expect_world_size)
    report["ok"] = not report["problems"]
    report["seconds"] = round(time.monotonic() - began, 3)
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
