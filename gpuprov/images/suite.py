"""`images.test`: the validation smoke suite (gpuprov/smoke) inside a built image, on this machine's engine,
through the image's own entry point (`gpuprov-smoke`, the smoke block) with a config put into the container.

The container gets every GPU (`--gpus all`) where this machine has GPUs and runs on the CPU otherwise; the
suite's config expects the versions the spec promises (CUDA, cuDNN, NCCL) and no particular GPU. The suite prints
one JSON document; any result with status fail fails the test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuprov.images.container import INPUTS, machine_has_gpus, run_in_image

TIMEOUT_S = 900


@dataclass
class SuiteRun:
    """The suite's document for one image, and its failed results."""

    image: str
    gpus: bool
    document: dict

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.document["results"] if r["status"] == "fail"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for result in self.document["results"]:
            out[result["status"]] = out.get(result["status"], 0) + 1
        return out


def suite_config(image: str, expected: dict[str, str | None], gpus: bool, level: str = "quick") -> dict:
    """The suite config for a run inside `image`: the spec's CUDA, cuDNN and NCCL expected, nothing about the
    machine's GPUs (the image runs anywhere its driver fits)."""
    return {
        "host": image, "level": level, "strict": False,
        "expect": {"gpu": None, "gpu_names": [], "count": None, "driver": None,
                   "cuda": expected.get("cuda"), "cudnn": expected.get("cudnn"), "nccl": expected.get("nccl"),
                   "nvswitch": False, "form_factor": None, "bf16": False},
        "datasheet": {"bf16_tflops": None, "fp16_tflops": None, "tf32_tflops": None, "mem_bw_gbs": None,
                      "pcie_gbs": None},
        "threshold_pct": 80.0, "workload": None, "data_dir": None, "shm_min_gib": 1.0, "container": None,
        "gpus_visible": gpus, "sizing": None, "min_batching_gain": None, "dcgm_level": None,
        "burn_in_seconds": None, "nccl_tests": None,
    }


def run_image_suite(client, image: str, expected: dict[str, str | None], *, gpus: bool | None = None) -> SuiteRun:
    """Run the suite in a container of `image` (with the GPUs when this machine has them) and return its
    document (GpuprovError when it prints none)."""
    from gpuprov.images.blocks import SMOKE_ENTRY
    from gpuprov.validation.suite import parse_document

    gpus = machine_has_gpus() if gpus is None else gpus
    config = suite_config(image, expected, gpus)
    argv = [SMOKE_ENTRY, "--config", f"{INPUTS}/config.json"]
    ran = run_in_image(client, image, argv, inputs={"config.json": json.dumps(config, indent=2).encode()}, gpus=gpus,
                       timeout=TIMEOUT_S, step="images.test")
    document = parse_document(image, ran.stdout, ran.stderr, ran.rc, " ".join(argv))
    return SuiteRun(image, gpus, document)
