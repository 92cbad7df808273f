"""The validation variables `invoke validate` reads, declared once (gpuprov.inventory.variables) and checked at
load; gpuprov.validation.suite_config.validate_vars reads them with their defaults.

    workload: llm-finetune | cv | recsys | inference     the sizing rules the suite applies
    data_dir: /data                                      the data folder that should sit on local NVMe
    cluster_address: 10.1.0.11                           address for multi-node rendezvous (default: address)
    validate: {threshold_pct, outlier_pct, textfile_dir, image, image_ulimits, shm_min_gib, torch_wheel,
               torch_version, torch_index, rdzv_port, sizing, min_batching_gain, dcgm_level, burn_in_seconds,
               nccl_tests}                          (gpuprov.validation.suite_config says what each one does)
"""

from __future__ import annotations

import re

from gpuprov.inventory.variables import Spec, declare

WORKLOADS = ("llm-finetune", "cv", "recsys", "inference")
DEFAULT_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
IMAGE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
WHEEL = re.compile(r"cpu|cu\d{3}|rocm\d+(\.\d+)*")
RELEASE = re.compile(r"\d+\.\d+(\.\d+)?")
SIZING_KEYS = ("cpu_cores_per_gpu", "memory_gib_per_gpu", "gpu_memory_gib")

VARIABLES = declare(
    "validation",
    Spec("workload", "choice", "the sizing rules the suite applies", choices=WORKLOADS, null=True),
    Spec("data_dir", "folder", "the training data folder (should sit on local NVMe); images.run mounts it",
         null=True),
    Spec("cluster_address", "address", "the host's address on the training network (default: its address)",
         message="must be an IP address or host name (with no IPv6 zone: other hosts reach it), not {value}"),
    Spec("validate", "mapping", "how the suite judges the host", null=True),
    Spec("validate.threshold_pct", "percent_by_gpu", "percent of the expected figure a figure must reach "
         "(default 80), or per GPU model: {H100-SXM: 85, default: 80}"),
    Spec("validate.outlier_pct", "percent", "a figure this far below the fleet median fails (default 10)"),
    Spec("validate.textfile_dir", "root_folder", f"node_exporter's textfile folder (default {DEFAULT_TEXTFILE_DIR})",
         message="{problem}; give a folder only root writes, like " + DEFAULT_TEXTFILE_DIR),
    Spec("validate.image", "pattern", "image for the container check (host.container)", pattern=IMAGE_PATTERN,
         null=True, message="must be an image reference like repo/name:tag, not {value}"),
    Spec("validate.image_ulimits", "ulimits", "--ulimit flags of --image runs (NVIDIA's by default): a number, -1 "
         "for unlimited, or null for the engine's default", null=True),
    Spec("validate.shm_min_gib", "number", "/dev/shm size DataLoader workers need (default 8)", low=0, above=True),
    Spec("validate.torch_wheel", "pattern", "PyTorch wheel variant (default: the stack's)", pattern=WHEEL,
         null=True, message="must be cpu or a CUDA variant like cu128, not {value}"),
    Spec("validate.torch_version", "release", "PyTorch release (default: the stack's, else latest)",
         pattern=RELEASE, choices=("latest",), null=True,
         message="must be a release like \"2.7\" or latest, not {value}"),
    Spec("validate.torch_index", "url", "index for the torch wheel (\"\": only the controller's pip configuration)",
         choices=("",), null=True, message="must be an http:// or https:// URL, or \"\", not {value}"),
    Spec("validate.rdzv_port", "port", "TCP port of the multi-node rendezvous (default 29400)", low=1024),
    Spec("validate.sizing", "mapping", "the suite's sizing rules", null=True),
    *(Spec(f"validate.sizing.{key}", "number", key.replace("_", " "), low=0, above=True) for key in SIZING_KEYS),
    Spec("validate.min_batching_gain", "number", "batch-32 over batch-1 throughput infer.latency expects",
         low=0, above=True, null=True),
    Spec("validate.dcgm_level", "choice", "dcgmi diag -r level (default: 1 quick, 3 burn-in)", choices=(1, 2, 3, 4),
         null=True, message="must be 1, 2, 3 or 4 (dcgmi diag -r), not {value}"),
    Spec("validate.burn_in_seconds", "duration", "load time of each burn-in check", null=True),
    Spec("validate.nccl_tests", "path", "where nccl-tests' all_reduce_perf is, when not on PATH", null=True),
)
