"""Each host's suite config: what the suite on the host expects, built from the inventory, the host's lock or
resolved stack, its facts and the GPU catalog.

Inventory variables read here (declared by gpuprov.validation.variables and checked when the inventory is
loaded, so `validate_vars` only reads them):

    workload: llm-finetune | cv | recsys | inference     the sizing rules the suite applies
    data_dir: /data                                      the data folder that should sit on local NVMe
    cluster_address: 10.1.0.11                           address for multi-node rendezvous (default: address)
    validate:
      threshold_pct: 80              percent of the expected figure (gpus.yaml: published measurements of the
                                     model, not its datasheet) a figure must reach; or per GPU model:
                                     {H100-SXM: 85, default: 80}
      outlier_pct: 10                a figure more than this far below the fleet median fails
      textfile_dir: /var/lib/prometheus/node-exporter    node_exporter's textfile collector folder
      image: nvcr.io/nvidia/pytorch:25.04-py3            image for the container check (host.container)
      image_ulimits: {memlock: -1, stack: 67108864}      --ulimit flags of --image runs (NVIDIA's by default;
                                     a number, -1 for unlimited, or null to leave the engine's default)
      shm_min_gib: 8                 /dev/shm size DataLoader workers need
      torch_wheel: cu128 | cpu       PyTorch wheel variant (default: the stack's); cpu on hosts without CUDA
      torch_version: "2.7" | latest  PyTorch release (default: the stack's, else latest)
      torch_index: URL               index for the torch wheel (default https://download.pytorch.org/whl/<wheel>;
                                     "" uses only the controller's pip configuration)
      rdzv_port: 29400               TCP port of the multi-node rendezvous on the first host
      sizing: {cpu_cores_per_gpu: 8, memory_gib_per_gpu: 128, gpu_memory_gib: 40}   the suite's sizing rules
      min_batching_gain: 4           batch-32 over batch-1 throughput infer.latency expects
      dcgm_level: 2                  dcgmi diag -r level (default: 1 quick, 3 burn-in)
      burn_in_seconds: 300           load time of each burn-in check
      nccl_tests: /opt/nccl-tests/build/all_reduce_perf                   where nccl-tests is, when not on PATH
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuprov.core.errors import InputError
from gpuprov.validation.variables import DEFAULT_TEXTFILE_DIR
from gpuprov.validation.variables import IMAGE_PATTERN as IMAGE_PATTERN  # tasks/validate.py checks --image with it

LEVELS = ("quick", "burn-in")
DEFAULT_THRESHOLD_PCT = 80.0
DEFAULT_OUTLIER_PCT = 10.0
DEFAULT_SHM_MIN_GIB = 8.0
DEFAULT_RDZV_PORT = 29400
TORCH_INDEX = "https://download.pytorch.org/whl/{wheel}"
_NUMBERS = ("outlier_pct", "shm_min_gib", "min_batching_gain", "burn_in_seconds")


@dataclass(frozen=True)
class ValidateVars:
    """A host's validation settings: its inventory variables (checked at load) with their defaults."""

    threshold_pct: float | dict = DEFAULT_THRESHOLD_PCT
    outlier_pct: float = DEFAULT_OUTLIER_PCT
    textfile_dir: str = DEFAULT_TEXTFILE_DIR
    image: str | None = None
    image_ulimits: dict | None = None
    shm_min_gib: float = DEFAULT_SHM_MIN_GIB
    torch_wheel: str | None = None
    torch_version: str | None = None
    torch_index: str | None = None
    rdzv_port: int = DEFAULT_RDZV_PORT
    sizing: dict | None = None
    min_batching_gain: float | None = None
    dcgm_level: int | None = None
    burn_in_seconds: float | None = None
    nccl_tests: str | None = None
    workload: str | None = None
    data_dir: str | None = None
    cluster_address: str = ""
    sources: dict = field(default_factory=dict, compare=False)

    def threshold_for(self, gpu_key: str | None) -> float:
        """The threshold (percent of the expected figures) for a GPU model: a number, or the model's entry of a
        mapping."""
        if not isinstance(self.threshold_pct, dict):
            return float(self.threshold_pct)
        from gpuprov.catalog import lookup

        for name, pct in self.threshold_pct.items():
            if name != "default" and gpu_key and lookup(name).key == gpu_key:
                return float(pct)
        return float(self.threshold_pct.get("default", DEFAULT_THRESHOLD_PCT))


def validate_vars(host) -> ValidateVars:
    """The host's `validate`, `workload`, `data_dir` and `cluster_address` variables (checked when the inventory was
    loaded: gpuprov.validation.variables) with their defaults; numbers as floats."""
    values = {key: value for key, value in (host.vars.get("validate") or {}).items() if value is not None}
    values.update({key: float(values[key]) for key in _NUMBERS if key in values})
    threshold = values.get("threshold_pct")
    if isinstance(threshold, dict):
        values["threshold_pct"] = {name: float(pct) for name, pct in threshold.items()}
    elif threshold is not None:
        values["threshold_pct"] = float(threshold)
    if "sizing" in values:
        values["sizing"] = {key: float(value) for key, value in values["sizing"].items()}
    return ValidateVars(**values, workload=host.vars.get("workload"), data_dir=host.vars.get("data_dir"),
                        cluster_address=host.vars.get("cluster_address") or host.address, sources=dict(host.sources))


# -------------------------------------------------------------------------------------------- expectations

def gpu_model(host, stack: dict | None):
    """The catalog model the inventory's hardware.gpu names (a catalog name: checked at load), else the stack's;
    None when neither does. InputError when a lock names a model the catalog does not know."""
    from gpuprov.catalog import lookup

    name = (host.vars.get("hardware") or {}).get("gpu") or ((stack or {}).get("gpu") or {}).get("model")
    if not name:
        return None
    try:
        return lookup(name)
    except InputError as exc:
        raise InputError(f"GPU model {name!r}: {exc.message}", host=host.name, step="validate config",
                         hint="name a catalog model in the host's hardware.gpu, or lock its stack again") from None


def datasheet(model) -> dict:
    """The datasheet figures the perf checks are judged against (None where the catalog has none)."""
    from gpuprov.stack.data import table

    if model is None:
        return {"bf16_tflops": None, "fp16_tflops": None, "tf32_tflops": None, "mem_bw_gbs": None,
                "pcie_gbs": None}
    row = table("gpus")["models"][model.key]
    return {"bf16_tflops": model.bf16_tflops, "fp16_tflops": model.fp16_tflops,
            "tf32_tflops": row.get("tf32_tflops"), "mem_bw_gbs": model.mem_bw_gbs, "pcie_gbs": row.get("pcie_gbs")}


def expected(model, gpus: int | None, nvswitch: bool) -> tuple[dict, dict]:
    """The figures the perf checks are judged against (gpuprov.catalog.expected_figures: published measurements of
    the model, or a marked fallback; None where nothing is expected), and what each one rests on."""
    from gpuprov.catalog import EXPECTED_KEYS, expected_figures

    if model is None:
        return dict.fromkeys(EXPECTED_KEYS), dict.fromkeys(EXPECTED_KEYS, "no GPU model known for this host")
    figures = expected_figures(model, gpus, nvswitch)
    values = {key: figure.value if figure else None for key, figure in figures.items()}
    basis = {key: figure.basis if figure else f"nothing published for {model.key} here" for key, figure in
             figures.items()}
    return values, basis


def load_seconds(config: dict) -> float:
    """Seconds of load a suite config asks of the checks at its level on top of their own timeouts (the burn-in
    time perf.matmul's sustained load runs), which the controller also waits for the whole suite."""
    from gpuprov.smoke.core import REGISTRY
    from gpuprov.smoke.runner import discover

    discover()
    level = config.get("level") or "quick"
    return sum(check.load(config) for check in REGISTRY.values() if check.load and level in check.levels)


def torch_wheel(stack: dict | None, settings: ValidateVars) -> str | None:
    """The PyTorch wheel variant of the host's venv: the inventory's override, else the stack's."""
    return settings.torch_wheel or ((stack or {}).get("pytorch") or {}).get("wheel")


def software_expectations(stack: dict | None, settings: ValidateVars, image: str | None) -> dict:
    """The CUDA, NCCL and cuDNN versions torch should report where they are known.

    In the host's venv torch brings its own CUDA runtime (the wheel variant's), NCCL and cuDNN (pip packages
    whose versions the resolver does not pin), so only CUDA is expected there. In NVIDIA's NGC PyTorch image
    of a known tag, the image's table row gives them. For any other image nothing is expected: the versions
    are recorded, not judged."""
    from gpuprov.stack.data import cuda_of_wheel, minor_of, table

    if image is None:
        wheel = torch_wheel(stack, settings)
        cuda = cuda_of_wheel(wheel) if wheel and wheel.startswith("cu") else None
        return {"cuda": cuda, "nccl": None, "cudnn": None}
    match = re.fullmatch(r"(?:nvcr\.io/)?nvidia/pytorch:(\d{2}\.\d{2})-py3", image)
    row = table("ngc_pytorch")["tags"].get(match.group(1)) if match else None
    if row is None:
        return {"cuda": None, "nccl": None, "cudnn": None}
    return {"cuda": minor_of(row["cuda"]) if row.get("cuda") else None, "nccl": row.get("nccl"),
            "cudnn": row.get("cudnn")}


def _container(image: str | None, settings: ValidateVars, smi: dict) -> dict | None:
    """What host.container checks: with --image the suite runs in that container (`inside`), and the host's GPU
    UUIDs (its facts) are what the container must list; else the inventory's validate.image is started by the
    check itself."""
    if image:
        return {"runtime": "docker", "image": image, "inside": True,
                "host_uuids": [g["uuid"] for g in smi.get("gpus") or [] if g.get("uuid")]}
    if settings.image:
        return {"runtime": "docker", "image": settings.image}
    return None


def build_config(host, facts: dict, stack: dict | None, settings: ValidateVars, *, level: str = "quick",
                 strict: bool = False, image: str | None = None) -> dict:
    """The suite config for one host (the JSON document `python -m smoke --config` reads)."""
    from gpuprov.stack.data import vkey

    if level not in LEVELS:
        raise InputError(f"--level must be one of {', '.join(LEVELS)}, not {level!r}", step="validate config")
    hardware = host.vars.get("hardware") or {}
    model = gpu_model(host, stack)
    stack = stack or {}
    smi = facts.get("nvidia_smi") or {}
    count = hardware.get("count") or len(facts.get("pci_gpus") or []) or None
    nvswitch = hardware["nvswitch"] if "nvswitch" in hardware else stack.get("fabricmanager") is not None
    figures, basis = expected(model, count, bool(nvswitch))
    return {
        "host": host.name,
        "level": level,
        "strict": bool(strict),
        "expect": {
            "gpu": model.key if model else None,
            "gpu_names": list(model.names) if model else [],
            "count": count,
            "driver": (stack.get("driver") or {}).get("version"),
            **software_expectations(stack, settings, image),
            "nvswitch": bool(nvswitch),
            "form_factor": model.form_factor if model else None,
            "bf16": bool(model and vkey(model.compute_capability) >= (8, 0)),
        },
        "datasheet": datasheet(model),
        "expected": figures,
        "expected_basis": basis,
        "threshold_pct": settings.threshold_for(model.key if model else None),
        "workload": settings.workload,
        "data_dir": settings.data_dir,
        "shm_min_gib": settings.shm_min_gib,
        "container": _container(image, settings, smi),
        "gpus_visible": bool(smi.get("gpus")) and not smi.get("error"),
        "sizing": settings.sizing,
        "min_batching_gain": settings.min_batching_gain,
        "dcgm_level": settings.dcgm_level,
        "burn_in_seconds": settings.burn_in_seconds,
        "nccl_tests": settings.nccl_tests,
    }
