"""Each host's suite config: what the suite on the host expects, built from the inventory, the host's lock or
resolved stack, its facts and the GPU catalog.

Inventory variables read here (free-form variables: the inventory keeps them as they are, and they are
checked here, naming the host and where the value came from):

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
from typing import Any

from gpuprov.errors import InputError
from gpuprov.inventory.checks import MAX_SECONDS, number_problem, shared_folder_problem, url_problem
from gpuprov.secrets import register_url

WORKLOADS = ("llm-finetune", "cv", "recsys", "inference")
LEVELS = ("quick", "burn-in")
DEFAULT_THRESHOLD_PCT = 80.0
DEFAULT_OUTLIER_PCT = 10.0
DEFAULT_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
DEFAULT_SHM_MIN_GIB = 8.0
DEFAULT_RDZV_PORT = 29400
TORCH_INDEX = "https://download.pytorch.org/whl/{wheel}"
VALIDATE_KEYS = ("threshold_pct", "outlier_pct", "textfile_dir", "image", "image_ulimits", "shm_min_gib",
                 "torch_wheel", "torch_version", "torch_index", "rdzv_port", "sizing", "min_batching_gain",
                 "dcgm_level", "burn_in_seconds", "nccl_tests")
SIZING_KEYS = ("cpu_cores_per_gpu", "memory_gib_per_gpu", "gpu_memory_gib")
_PATH = re.compile(r"/[A-Za-z0-9_.+@/-]*")
IMAGE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
_WHEEL = re.compile(r"cpu|cu\d{3}|rocm\d+(\.\d+)*")
_RELEASE = re.compile(r"\d+\.\d+(\.\d+)?")


@dataclass(frozen=True)
class ValidateVars:
    """A host's validation settings from its inventory variables, checked."""

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


def _bad(host, key: str, message: str) -> InputError:
    source = host.sources.get(key.split(".")[0], "inventory")
    return InputError(f"variable {key} ({source}): {message}", host=host.name, step="validate config",
                      hint="fix the variable in the inventory (invoke inventory.show --host "
                           f"{host.name} shows where it comes from)")


def _number(host, key: str, value: Any, low: float, high: float | None = None) -> float:
    problem = number_problem(value, low, high)
    if problem:
        raise _bad(host, key, problem)
    return float(value)


def _path(host, key: str, value: Any) -> str:
    if not isinstance(value, str) or not _PATH.fullmatch(value) or "/../" in f"{value}/":
        raise _bad(host, key, f"must be an absolute path (letters, digits, _ . + @ / -), not {value!r}")
    return value.rstrip("/") or "/"


def _textfile_dir(host, value: Any) -> str:
    """node_exporter's textfile folder: root writes into it and node_exporter publishes what it holds, so a
    folder anyone may write into (/tmp, /var/tmp, /dev/shm) is refused: another user could plant metrics for
    this host or swap the file for a link."""
    folder = _path(host, "validate.textfile_dir", value)
    problem = shared_folder_problem(folder)
    if problem:
        raise _bad(host, "validate.textfile_dir", f"{problem}; give a folder only root writes, like "
                                                  f"{DEFAULT_TEXTFILE_DIR}")
    return folder


def validate_vars(host) -> ValidateVars:
    """The host's `validate`, `workload`, `data_dir` and `cluster_address` variables, checked (InputError)."""
    from gpuprov.catalog import lookup
    from gpuprov.inventory import is_valid_address

    raw = host.vars.get("validate") or {}
    if not isinstance(raw, dict):
        raise _bad(host, "validate", f"must be a mapping with keys {', '.join(VALIDATE_KEYS)}")
    unknown = sorted(set(raw) - set(VALIDATE_KEYS))
    if unknown:
        raise _bad(host, "validate", f"unknown key(s) {', '.join(map(str, unknown))}; known: "
                                     f"{', '.join(VALIDATE_KEYS)}")
    out: dict[str, Any] = {}
    if "threshold_pct" in raw:
        value = raw["threshold_pct"]
        if isinstance(value, dict):
            for name, pct in value.items():
                if name != "default":
                    try:
                        lookup(name)
                    except InputError as exc:
                        raise _bad(host, f"validate.threshold_pct.{name}", exc.message) from None
                _number(host, f"validate.threshold_pct.{name}", pct, 0, 100)
            out["threshold_pct"] = dict(value)
        else:
            out["threshold_pct"] = _number(host, "validate.threshold_pct", value, 0, 100)
    if "outlier_pct" in raw:
        out["outlier_pct"] = _number(host, "validate.outlier_pct", raw["outlier_pct"], 0, 100)
    if "textfile_dir" in raw:
        out["textfile_dir"] = _textfile_dir(host, raw["textfile_dir"])
    if raw.get("image") is not None:
        if not isinstance(raw["image"], str) or not IMAGE_PATTERN.fullmatch(raw["image"]):
            raise _bad(host, "validate.image", f"must be an image reference like repo/name:tag, not "
                                               f"{raw['image']!r}")
        out["image"] = raw["image"]
    if raw.get("image_ulimits") is not None:
        limits = raw["image_ulimits"]
        if not isinstance(limits, dict) or not all(isinstance(k, str) and re.fullmatch(r"[a-z]+", k)
                                                   for k in limits):
            raise _bad(host, "validate.image_ulimits", "must be a mapping of ulimit names (memlock, stack, nofile) "
                                                       "to numbers")
        for name, value in limits.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not
                                      -1 <= value < 2**63):
                raise _bad(host, f"validate.image_ulimits.{name}", f"must be a whole number (-1: unlimited) or "
                                                                    f"null (the engine's default), not {value!r}")
        out["image_ulimits"] = dict(limits)
    if "shm_min_gib" in raw:
        out["shm_min_gib"] = _number(host, "validate.shm_min_gib", raw["shm_min_gib"], 0)
    if raw.get("torch_wheel") is not None:
        if not isinstance(raw["torch_wheel"], str) or not _WHEEL.fullmatch(raw["torch_wheel"]):
            raise _bad(host, "validate.torch_wheel", f"must be cpu or a CUDA variant like cu128, not "
                                                     f"{raw['torch_wheel']!r}")
        out["torch_wheel"] = raw["torch_wheel"]
    if raw.get("torch_version") is not None:
        text = str(raw["torch_version"])
        if text != "latest" and not _RELEASE.fullmatch(text):
            raise _bad(host, "validate.torch_version", f"must be a release like \"2.7\" or latest, not {text!r}")
        out["torch_version"] = text
    if "torch_index" in raw:
        index = raw["torch_index"]
        if index is not None and not (isinstance(index, str) and (index == "" or url_problem(index) is None)):
            raise _bad(host, "validate.torch_index", f"must be an http:// or https:// URL, or \"\", not {index!r}")
        register_url(index)   # its credentials are masked in every output from now on
        out["torch_index"] = index
    if "rdzv_port" in raw:
        port = raw["rdzv_port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
            raise _bad(host, "validate.rdzv_port", f"must be a port from 1024 to 65535, not {port!r}")
        out["rdzv_port"] = port
    if raw.get("sizing") is not None:
        sizing = raw["sizing"]
        if not isinstance(sizing, dict) or set(sizing) - set(SIZING_KEYS):
            raise _bad(host, "validate.sizing", f"must be a mapping with keys among {', '.join(SIZING_KEYS)}")
        out["sizing"] = {key: _number(host, f"validate.sizing.{key}", value, 0) for key, value in sizing.items()}
    if raw.get("min_batching_gain") is not None:
        out["min_batching_gain"] = _number(host, "validate.min_batching_gain", raw["min_batching_gain"], 0)
    if raw.get("burn_in_seconds") is not None:
        out["burn_in_seconds"] = _number(host, "validate.burn_in_seconds", raw["burn_in_seconds"], 0, MAX_SECONDS)
    if raw.get("dcgm_level") is not None:
        level = raw["dcgm_level"]
        if isinstance(level, bool) or level not in (1, 2, 3, 4):
            raise _bad(host, "validate.dcgm_level", f"must be 1, 2, 3 or 4 (dcgmi diag -r), not {level!r}")
        out["dcgm_level"] = level
    if raw.get("nccl_tests") is not None:
        out["nccl_tests"] = _path(host, "validate.nccl_tests", raw["nccl_tests"])
    workload = host.vars.get("workload")
    if workload is not None and workload not in WORKLOADS:
        raise _bad(host, "workload", f"must be one of {', '.join(WORKLOADS)}, not {workload!r}")
    data_dir = host.vars.get("data_dir")
    if data_dir is not None:
        data_dir = _path(host, "data_dir", data_dir)
    cluster = host.vars.get("cluster_address", host.address)
    # the SSH address may carry its interface (fe80::1%eth0, checked by the inventory); one given for the
    # cluster is dialled by the other hosts, where this host's interface name means nothing
    if not is_valid_address(cluster, zone="cluster_address" not in host.vars):
        raise _bad(host, "cluster_address", f"must be an IP address or host name (with no IPv6 zone: other "
                                              f"hosts reach it), not {cluster!r}")
    return ValidateVars(**out, workload=workload, data_dir=data_dir, cluster_address=cluster,
                        sources=dict(host.sources))


# -------------------------------------------------------------------------------------------- expectations

def gpu_model(host, stack: dict | None):
    """The catalog model the inventory's hardware.gpu names, else the stack's; None when neither does."""
    from gpuprov.catalog import lookup

    name = (host.vars.get("hardware") or {}).get("gpu") or ((stack or {}).get("gpu") or {}).get("model")
    if not name:
        return None
    try:
        return lookup(name)
    except InputError as exc:
        raise _bad(host, "hardware.gpu", exc.message) from None


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
