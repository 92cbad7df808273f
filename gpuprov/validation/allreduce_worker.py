"""Multi-node all-reduce worker: torchrun starts it on every host of the group (`invoke validate --multi-node`
copies it to /opt/gpuprov/multinode). It runs ON the hosts and imports only the standard library and torch.

Every process all-reduces a tensor filled with its rank + 1 and checks the sum (an exact float32 value), then
times all-reduces of random data after a warm-up and reports the bus bandwidth as nccl-tests defines it
(algorithm bandwidth x 2(n-1)/n). Rank 0 prints one line: GPUPROV-MULTINODE {json}, with the user ids the
workers ran as. A node expected to run on its GPUs that cannot open them (their device files' permissions for the
workers' user) exits 1 and says so, rather than falling back to the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from datetime import timedelta

MARK = "GPUPROV-MULTINODE "


def main() -> None:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--inventory-name", required=True, help="this host's inventory name")
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=120)
    parser.add_argument("--expect-device", choices=("cuda", "cpu"), default="cpu")
    args = parser.parse_args()

    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if args.expect_device == "cuda" and not cuda:
        raise SystemExit(f"{args.inventory_name}: torch sees no GPU as uid {os.getuid()}: the workers' user cannot "
                         "open the GPUs (check the permissions of /dev/nvidia*)")
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    who = [None] * world
    dist.all_gather_object(who, {"rank": rank, "node": args.inventory_name, "hostname": socket.gethostname(),
                                 "uid": os.getuid()})

    elements = args.size_mib * (1 << 20) // 4
    check = torch.full((elements,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(check)
    expected = world * (world + 1) / 2
    wrong = int((check != expected).sum().item())
    del check

    data = torch.rand(elements, dtype=torch.float32, device=device)
    for _ in range(args.warmup):
        dist.all_reduce(data)
    sync()
    dist.barrier()
    times = []
    for _ in range(args.iters):
        sync()
        started = time.perf_counter()
        dist.all_reduce(data)
        sync()
        times.append(time.perf_counter() - started)
    times.sort()
    median = times[len(times) // 2]
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"median_s": median, "wrong": wrong})
    if rank == 0:
        slowest = max(item["median_s"] for item in per_rank)
        size = elements * 4
        algbw = size / slowest / 1e9
        print(MARK + json.dumps({
            "world_size": world, "backend": backend, "device": "cuda" if cuda else "cpu",
            "nodes": sorted({item["node"] for item in who}),
            "ranks": who, "uids": sorted({item["uid"] for item in who}), "size_bytes": size, "iters": args.iters,
            "expected_sum": expected,
            "wrong_elements": sum(item["wrong"] for item in per_rank), "time_s": slowest,
            "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (world - 1) / world,
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
