"""sizing: the host against the workload's rules of thumb; a shortfall is a `warn` with the figures.

Rules, per the inventory's `workload` (issue 9):

- CPU cores per GPU: 8 to 16 for training (`llm-finetune`, `cv`, `recsys`): fewer than 8 starves the DataLoader
  workers and the input pipeline; more than 16 is not a shortfall. Counted as the CPUs this process may run on
  (`sched_getaffinity`, which honours cpusets and container limits). No rule for `inference`.
- Memory per GPU: 128 GiB for LLM fine-tuning, 256 GiB for recommendation models (embedding tables live in host
  memory). `MemTotal` is the installed memory less what firmware and the kernel reserve, so a host meets the rule
  when MemTotal reaches 95 % of it (1 TiB for 8 GPUs shows as about 1007 GiB).
- GPU memory against the workload's need, this suite's defaults (override with the config's
  `sizing.gpu_memory_gib`): `llm-finetune` 40 GiB (a 7B-parameter model's bf16 weights alone are 14 GB, before
  activations, gradients and optimizer state), `recsys` 32 GiB, `cv` 16 GiB, `inference` 16 GiB. Judged on the
  smallest GPU (`memory.total`).
- The data directory (`data_dir`) on a local NVMe device rather than a network filesystem or a rotating disk:
  its filesystem from `findmnt -J -o SOURCE,FSTYPE,TARGET --target DIR`, then its block devices through
  /sys/class/block (partitions to their disk, device-mapper and md devices to their members): every member
  disk must be `nvme*`, not rotational, and not a network volume presented as NVMe (Amazon EBS).

The config's `sizing` mapping overrides any figure: `cpu_cores_per_gpu`, `memory_gib_per_gpu`, `gpu_memory_gib`.
"""

from __future__ import annotations

import json
import os
import re
import time

from . import nvsmi
from .core import PASS, SKIP, WARN, Result, check

NAME = "sizing"
TRAINING = ("llm-finetune", "cv", "recsys")
WORKLOADS = (*TRAINING, "inference")
CPU_CORES_PER_GPU = {"llm-finetune": 8, "cv": 8, "recsys": 8}
CPU_CORES_PER_GPU_MAX = 16
MEMORY_GIB_PER_GPU = {"llm-finetune": 128, "recsys": 256}
MEMORY_ALLOWANCE = 0.95
GPU_MEMORY_GIB = {"llm-finetune": 40, "recsys": 32, "cv": 16, "inference": 16}
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "beegfs", "gpfs", "wekafs",
              "9p", "virtiofs", "afs", "ocfs2", "gfs2")
MEMORY_FS = ("tmpfs", "ramfs")
NETWORK_NVME_MODELS = ("Elastic Block Store",)
SYS_CLASS_BLOCK = "/sys/class/block"
MEMINFO = "/proc/meminfo"
GIB = 1024**3


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def memory_bytes(path: str | None = None) -> int | None:
    """MemTotal from /proc/meminfo, in bytes."""
    try:
        with open(path or MEMINFO, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def member_disks(kname: str, depth: int = 0) -> list[str]:
    """The whole disks under a block device: a partition's disk, a dm/md device's members, recursively."""
    base = os.path.join(SYS_CLASS_BLOCK, kname)
    if depth > 8 or not os.path.exists(base):
        return []
    if os.path.exists(os.path.join(base, "partition")):
        return member_disks(os.path.basename(os.path.dirname(os.path.realpath(base))), depth + 1)
    slaves = os.path.join(base, "slaves")
    members = sorted(os.listdir(slaves)) if os.path.isdir(slaves) else []
    if members:
        return [disk for member in members for disk in member_disks(member, depth + 1)]
    return [kname]


def disk_kind(disk: str) -> str:
    """nvme | network-nvme | rotational | ssd (a non-NVMe solid-state or virtual disk)."""
    base = os.path.join(SYS_CLASS_BLOCK, disk)
    if _read(os.path.join(base, "queue", "rotational")) == "1":
        return "rotational"
    if disk.startswith("nvme"):
        model = _read(os.path.join(base, "device", "model")) or ""
        return "network-nvme" if any(m in model for m in NETWORK_NVME_MODELS) else "nvme"
    return "ssd"


def data_dir_verdict(ctx, path: str) -> tuple[str | None, dict]:
    """(shortfall text or None, figures) for the data directory."""
    figures: dict = {"data_dir": path}
    if not os.path.exists(path):
        return f"data_dir {path} does not exist", figures
    rc, out, err = ctx.run(["findmnt", "-J", "-o", "SOURCE,FSTYPE,TARGET", "--target", path], timeout=30)
    try:
        mount = json.loads(out)["filesystems"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return f"cannot tell which filesystem holds {path} (findmnt exit {rc}: {(err or out).strip()[:200]})", figures
    source, fstype = str(mount.get("source") or ""), str(mount.get("fstype") or "")
    figures.update({"mount": mount.get("target"), "source": source, "fstype": fstype})
    if fstype in NETWORK_FS or fstype.startswith("fuse") or (":" in source and not source.startswith("/")):
        return f"data_dir {path} is on a network filesystem ({fstype} {source})", figures
    if fstype in MEMORY_FS:
        return f"data_dir {path} is on {fstype} (memory, lost at reboot)", figures
    device = re.sub(r"\[.*\]$", "", source)
    if not device.startswith("/dev/"):
        return f"data_dir {path} is on {fstype} {source}: no block device to judge", figures
    disks = member_disks(os.path.basename(os.path.realpath(device)))
    if not disks:
        return f"data_dir {path} is on {device}, which /sys/class/block does not show", figures
    kinds = {disk: disk_kind(disk) for disk in disks}
    figures["disks"] = kinds
    bad = {disk: kind for disk, kind in kinds.items() if kind != "nvme"}
    if bad:
        words = {"rotational": "a rotating disk", "ssd": "not NVMe", "network-nvme": "a network volume"}
        return (f"data_dir {path} is on {device}: " + ", ".join(f"{d} is {words[k]}" for d, k in bad.items()),
                figures)
    return None, figures


@check(NAME, timeout=60)
def run(ctx) -> Result:
    start = time.monotonic()
    workload = ctx.config.get("workload")
    data_dir = ctx.config.get("data_dir")
    overrides = ctx.config.get("sizing") or {}
    if not workload and not data_dir:
        return Result(NAME, SKIP, "the inventory names no workload and no data_dir for this host", {},
                      seconds=time.monotonic() - start)
    if workload and workload not in WORKLOADS:
        return Result(NAME, SKIP, f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})", {},
                      seconds=time.monotonic() - start)
    figures: dict = {"workload": workload}
    thresholds: dict = {}
    shortfalls = []
    gpu_memory_mib = None
    try:
        rows = nvsmi.query(ctx)
        gpus = len(rows)
        sizes = [nvsmi.number(row["memory.total"]) for row in rows]
        gpu_memory_mib = min((s for s in sizes if s), default=None)
    except nvsmi.SmiError as error:
        gpus = int(ctx.expect("count") or 0)
        figures["nvidia_smi"] = error.message
    figures["gpus"] = gpus
    if workload and gpus:
        cpus = cpu_count()
        figures["cpus"] = cpus
        figures["cpus_per_gpu"] = round(cpus / gpus, 1)
        need = overrides.get("cpu_cores_per_gpu", CPU_CORES_PER_GPU.get(workload))
        if need:
            thresholds["cpu_cores_per_gpu"] = f"{need}-{CPU_CORES_PER_GPU_MAX}"
            if cpus / gpus < need:
                shortfalls.append(f"{cpus} CPUs for {gpus} GPUs is {cpus / gpus:.1f} per GPU, below {need} for "
                                  f"{workload}")
        memory = memory_bytes()
        if memory:
            per_gpu = memory / GIB / gpus
            figures["memory_gib"] = round(memory / GIB, 1)
            figures["memory_gib_per_gpu"] = round(per_gpu, 1)
            need = overrides.get("memory_gib_per_gpu", MEMORY_GIB_PER_GPU.get(workload))
            if need:
                thresholds["memory_gib_per_gpu"] = need
                if per_gpu < need * MEMORY_ALLOWANCE:
                    shortfalls.append(f"{memory / GIB:.0f} GiB of memory for {gpus} GPUs is {per_gpu:.0f} GiB per "
                                      f"GPU, below {need} GiB for {workload}")
        need = overrides.get("gpu_memory_gib", GPU_MEMORY_GIB.get(workload))
        if gpu_memory_mib:
            figures["gpu_memory_gib"] = round(gpu_memory_mib / 1024, 1)
            if need:
                thresholds["gpu_memory_gib"] = need
                if gpu_memory_mib / 1024 < need:
                    shortfalls.append(f"{gpu_memory_mib / 1024:.0f} GiB per GPU, below the {need} GiB {workload} "
                                      "needs")
    elif workload:
        figures["note"] = "no GPU found or expected: per-GPU rules not judged"
    if data_dir:
        shortfall, more = data_dir_verdict(ctx, data_dir)
        figures.update(more)
        thresholds["data_dir"] = "local NVMe"
        if shortfall:
            shortfalls.append(shortfall)
    seconds = time.monotonic() - start
    if shortfalls:
        return Result(NAME, WARN, "; ".join(shortfalls), figures, thresholds, seconds)
    judged = [k for k in ("cpu_cores_per_gpu", "memory_gib_per_gpu", "gpu_memory_gib", "data_dir") if k in thresholds]
    if not judged:
        return Result(NAME, SKIP, "no sizing rule applies with the figures available", figures, thresholds, seconds)
    return Result(NAME, PASS, f"meets the {workload or 'data_dir'} rules of thumb ({', '.join(judged)})", figures,
                  thresholds, seconds)
