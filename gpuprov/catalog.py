"""GPU catalog (data in `gpuprov/data/gpus.yaml`): PCI device id, nvidia-smi name or alias -> GpuModel."""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

from gpuprov.errors import InputError
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
            fp16_tflops=row["fp16_tflops"], mem_bw_gbs=row["mem_bw_gbs"], min_driver=row.get("min_driver"))
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
