"""GPU catalog (data in `gpuprov/data/gpus.yaml`): PCI device id, nvidia-smi name or alias -> GpuModel; and what a
healthy GPU of a model is expected to reach (expected_figures: published measurements with their sources, or a
marked fallback share of the datasheet)."""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

from gpuprov.core.errors import InputError
from gpuprov.stack.data import table


@dataclass(frozen=True)
class GpuModel:
    """One GPU model. TFLOP/s are dense datasheet peaks (None where the GPU lacks the type)."""

    key: str
    names: tuple[str, ...]
    aliases: tuple[str, ...]
    pci_ids: tuple[str, ...]
    arch: str
    compute_capability: str
    memory_gib: int
    datacenter: bool
    form_factor: str
    nvswitch_capable: bool
    bf16_tflops: float | None
    fp16_tflops: float | None
    mem_bw_gbs: int
    min_driver: str | None = None
    hgx_gpus: int | None = None      # GPUs of its HGX/DGX baseboard whose NVSwitches are no PCI devices (gpus.yaml)


@functools.cache
def models() -> dict[str, GpuModel]:
    """Every catalog model by key, in catalog order."""
    out = {}
    for key, row in table("gpus")["models"].items():
        out[key] = GpuModel(
            key=key, names=tuple(row["names"]), aliases=tuple(row.get("aliases", [])),
            pci_ids=tuple(str(i).lower() for i in row["pci_ids"]), arch=row["arch"],
            compute_capability=str(row["compute_capability"]), memory_gib=row["memory_gib"],
            datacenter=bool(row["datacenter"]), form_factor=row["form_factor"],
            nvswitch_capable=bool(row["nvswitch_capable"]), bf16_tflops=row["bf16_tflops"],
            fp16_tflops=row["fp16_tflops"], mem_bw_gbs=row["mem_bw_gbs"], min_driver=row.get("min_driver"),
            hgx_gpus=row.get("hgx_gpus"))
    return out


@functools.cache
def _index() -> dict[str, GpuModel]:
    index: dict[str, GpuModel] = {}
    for model in models().values():
        for name in (model.key, *model.names, *model.aliases):
            index.setdefault(name.casefold(), model)
    return index


def find(name: str) -> GpuModel | None:
    """A model by catalog key, alias or nvidia-smi name (case-insensitive, surrounding spaces ignored), or None."""
    return _index().get(name.strip().casefold())


def close_names(name: str, limit: int = 3) -> list[str]:
    """Catalog keys, aliases and nvidia-smi names spelled most like `name`, as the catalog spells them."""
    spellings: dict[str, str] = {}
    for model in models().values():
        for spelling in (model.key, *model.aliases, *model.names):
            spellings.setdefault(spelling.casefold(), spelling)
    close = difflib.get_close_matches(name.strip().casefold(), list(spellings), n=limit, cutoff=0.6)
    return [spellings[c] for c in close]


def lookup(name: str) -> GpuModel:
    """A model by catalog key, alias or nvidia-smi name; InputError (the rule and did-you-mean of
    gpuprov.stack.inputs.gpu_model) otherwise."""
    from gpuprov.stack.inputs import PinError, gpu_model

    try:
        return models()[gpu_model(name)]
    except PinError as exc:
        raise InputError(str(exc)) from None


@dataclass(frozen=True)
class Choice:
    """The model a name resolved to, and the other catalog models the same name could mean (a family name such as
    "A100" or "H100": every model with a spelling that continues it, "A100-PCIE-40GB", "H100-NVL")."""

    name: str
    model: GpuModel
    alternatives: tuple[GpuModel, ...]

    def warning(self) -> str | None:
        """What to tell the user when the name was ambiguous, else None."""
        if not self.alternatives:
            return None
        others = ", ".join(m.key for m in self.alternatives)
        return (f"GPU {self.name.strip()!r} could mean several catalog models; gpuprov took {self.model.key} "
                f"({_described(self.model)}). The others: {others}. Give the exact model to choose another "
                f"(invoke stack.matrix --component gpus lists them)")


def _described(model: GpuModel) -> str:
    return f"{model.form_factor.upper()}, {model.memory_gib} GB"


def _spelling(name: str) -> str:
    """A spelling compared for ambiguity: case-folded, spaces and underscores as '-', no leading NVIDIA/Tesla."""
    text = "-".join(name.strip().casefold().replace("_", " ").split())
    for prefix in ("nvidia-", "tesla-"):
        text = text.removeprefix(prefix)
    return text


def choose(name: str) -> Choice:
    """The model `name` names (as lookup), with the other models it could mean: those with a key, alias or
    nvidia-smi name that continues it after a '-' or a space ("A100" -> A100-PCIE-40GB, A100-SXM4-80GB, ...).
    InputError for a name the catalog does not know."""
    model = lookup(name)
    stem = _spelling(name) + "-"
    alternatives = tuple(other for other in models().values() if other.key != model.key and any(
        _spelling(spelling).startswith(stem) for spelling in (other.key, *other.aliases, *other.names)))
    return Choice(name=name, model=model, alternatives=alternatives)


def by_pci_id(device_id: str) -> GpuModel | None:
    """A model by PCI device id ("2330", "0x2330" or "10de:2330"); None when the catalog lacks it."""
    key = str(device_id).lower().removeprefix("0x").split(":")[-1]
    return next((m for m in models().values() if key in m.pci_ids), None)


def is_nvswitch(device_id: str) -> bool:
    """Whether a PCI device id is an NVSwitch bridge (e.g. "1af1", "22a3")."""
    key = str(device_id).lower().removeprefix("0x").split(":")[-1]
    return key in {str(k).lower() for k in table("gpus")["nvswitch_pci_ids"]}


# From the fourth NVSwitch generation (HGX/DGX B200) on, Fabric Manager needs the NVLink Subnet Manager and
# the NVSwitches are no PCI devices of the host (gpus.yaml, nvswitch_generations).
FOURTH_GENERATION = 4


def nvswitch_generation(arch: str) -> int | None:
    """The NVSwitch generation of an architecture's HGX/DGX baseboard (None: no NVSwitch baseboard)."""
    return table("gpus")["nvswitch_generations"].get(arch)


# ------------------------------------------------------------------------------------------- expected figures

MATMUL_FIGURES = ("bf16_tflops", "fp16_tflops", "tf32_tflops")
COPY_FIGURES = ("d2d_gbs", "h2d_gbs", "d2h_gbs")
EXPECTED_KEYS = (*MATMUL_FIGURES, *COPY_FIGURES, "allreduce_busbw_gbs")
PCIE_LANE_GBS = {3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}   # one direction, GB/s


@dataclass(frozen=True)
class Expected:
    """One expected figure and what it rests on ("measured: ..." from a published source, or "fallback: ...")."""

    value: float
    basis: str


def pcie_link_gbs(generation: int, width: int) -> float:
    """One direction of a PCIe link after 128b/130b encoding: 63.0 GB/s for Gen5 x16."""
    return round(PCIE_LANE_GBS[generation] * width, 2)


def _source(name: str) -> str:
    row = table("gpus")["expected_sources"][name]
    return f"{row['url']} ({row['date']})"


def _pcie_generation(link_gbs: float) -> int | None:
    return next((gen for gen in PCIE_LANE_GBS if abs(pcie_link_gbs(gen, 16) - link_gbs) < 0.1), None)


def _matmul(row: dict, measured: dict) -> dict[str, Expected | None]:
    """bf16 from the published sweep, fp16 and tf32 as the same share of their datasheet figures; the fallback
    share of the datasheet without a published sweep."""
    out: dict[str, Expected | None] = {}
    bf16 = measured.get("bf16_tflops")
    if bf16 and row.get("bf16_tflops"):
        share = bf16["value"] / row["bf16_tflops"]
        basis = (f"measured: {bf16['value']:g} TFLOP/s bf16 at {bf16['shape']} ({share:.1%} of the datasheet's "
                 f"{row['bf16_tflops']:g}), {_source(bf16['source'])}")
    else:
        fallback = table("gpus")["expected_fallback"]["matmul_share"]
        share, basis = fallback["value"], f"fallback: no published sweep for this model; {fallback['basis']}"
    for figure in MATMUL_FIGURES:
        sheet = row.get(figure)
        if not sheet:
            out[figure] = None
        elif figure == "bf16_tflops" and bf16:
            out[figure] = Expected(float(bf16["value"]), basis)
        else:
            how = basis if figure == "bf16_tflops" or basis.startswith("fallback") else \
                f"derived: the measured bf16 share {share:.1%} of the datasheet's {sheet:g} (no published sweep)"
            out[figure] = Expected(round(share * sheet, 1), how)
    return out


def _copies(row: dict, measured: dict) -> dict[str, Expected | None]:
    data = table("gpus")
    d2d = measured.get("d2d_gbs")
    if d2d:
        out: dict[str, Expected | None] = {"d2d_gbs": Expected(
            float(d2d["value"]), f"measured: {d2d['value']:g} GB/s ({d2d['value'] / row['mem_bw_gbs']:.1%} of "
                                 f"{row['mem_bw_gbs']:g}), {_source(d2d['source'])}")}
    else:
        fallback = data["expected_fallback"]["d2d_share"]
        out = {"d2d_gbs": Expected(round(fallback["value"] * row["mem_bw_gbs"], 1),
                                   f"fallback: no published measurement for this model; {fallback['basis']}")}
    link = row.get("pcie_gbs")
    generation = _pcie_generation(link) if link else None
    copy = data["pcie_copy"]
    for figure in ("h2d_gbs", "d2h_gbs"):
        if generation is None:
            out[figure] = None
            continue
        share = copy[figure] / pcie_link_gbs(copy["generation"], copy["width"])
        same = generation == copy["generation"]
        note = "" if same else f"; Gen{generation} is unpublished: that share of its own x16 rate"
        kind, rate = "measured" if same else "derived", pcie_link_gbs(copy["generation"], copy["width"])
        out[figure] = Expected(float(copy[figure]) if same else round(share * link, 2), (
            f"{kind}: {copy[figure]:g} GB/s on PCIe Gen{copy['generation']} x{copy['width']} ({share:.1%} of "
            f"{rate:g}), {_source(copy['source'])}{note}"))
    return out


def _allreduce(model: GpuModel, gpus: int | None, nvswitch: bool, h2d: Expected | None) -> Expected | None:
    for entry in table("gpus")["allreduce_busbw"]:
        if nvswitch and entry["topology"] == "nvswitch" and entry["arch"] == model.arch and entry["gpus"] == gpus:
            return Expected(float(entry["busbw_gbs"]), f"measured: {entry['busbw_gbs']:g} GB/s busbw, {gpus} x "
                                                       f"{model.arch} with NVSwitch, {_source(entry['source'])}")
    if not nvswitch and model.form_factor == "pcie" and h2d is not None:
        return Expected(h2d.value, "fallback: GPUs over PCIe, no published all-reduce figure: the PCIe copy "
                                   "figure (the link is the bottleneck)")
    return None


def expected_figures(model: GpuModel, gpus: int | None = None, nvswitch: bool = False) -> dict[str, Expected | None]:
    """What a healthy GPU of `model` reaches (None: nothing to expect), for `gpus` GPUs of a host with or without
    NVSwitch: the matmul, copy and all-reduce figures of EXPECTED_KEYS."""
    row = table("gpus")["models"][model.key]
    measured = row.get("expected") or {}
    out = {**_matmul(row, measured), **_copies(row, measured)}
    out["allreduce_busbw_gbs"] = _allreduce(model, gpus, nvswitch, out["h2d_gbs"]) if (gpus or 0) > 1 else None
    return out
