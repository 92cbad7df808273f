"""The simulated nvidia-smi's answers: what each lab profile's GPUs report (`gpu_profiles_table`, installed by
the stand-in driver utilities as gpu-profiles.json), built from the real `--query-gpu` captures in
`files/captures/` and the per-model settings in `files/standins/smi.yaml`.
"""

from __future__ import annotations

import functools

import yaml

from gpuprov.core.errors import GpuprovError
from gpuprov.lab.standins import CAPTURES, FILES


@functools.cache
def _smi_data() -> dict:
    return yaml.safe_load((FILES / "smi.yaml").read_text(encoding="utf-8"))


def read_capture(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """An allfields `--query-gpu` capture (files/captures/NAME: header row and one data row, as nvidia-smi printed
    them): (value by field name, unit by field name for the fields whose header shows one, "memory.total [MiB]")."""
    header, row = (CAPTURES / name).read_text(encoding="utf-8").splitlines()[:2]
    names, values = header.split(", "), row.split(", ")
    if len(names) != len(values):
        raise GpuprovError(f"capture {name}: {len(names)} fields but {len(values)} values", step="lab mirror",
                           hint="the capture must be one header row and one data row")
    fields, units = {}, {}
    for title, value in zip(names, values, strict=True):
        field, _, unit = title.partition(" [")
        fields[field] = value
        if unit:
            units[field] = unit.rstrip("]")
    return fields, units


def capture_names() -> list[str]:
    return sorted(p.name for p in CAPTURES.glob("*.csv"))


def model_fields(model) -> tuple[dict[str, str], dict[str, str]]:
    """What a GPU of catalog `model` answers to --query-gpu before the per-GPU values are filled in: its capture
    (smi.yaml `models`, else the capture of its form factor), every field another capture has as that capture
    prints it, then the model's `set` values; the catalog's name, compute capability and memory for a model without
    a capture of its own. Returns (fields, units)."""
    smi = _smi_data()
    spec = smi["models"].get(model.key) or {}
    own = spec.get("capture")
    fields, units = read_capture(own or smi["by_form_factor"][model.form_factor])
    for other in capture_names():
        more, more_units = read_capture(other)
        for key, value in more.items():
            fields.setdefault(key, value)
        for key, unit in more_units.items():
            units.setdefault(key, unit)
    sets = {str(k): str(v) for k, v in (spec.get("set") or {}).items()}
    if not own:
        fields.update({"name": model.names[0], "compute_cap": model.compute_capability,
                       "memory.total": f"{model.memory_gib * 1024} MiB"})
    fields.update(sets)
    if not own and "memory.free" not in sets:
        fields["memory.free"] = f"{_mib(fields['memory.total']) - _mib(fields['memory.reserved'])} MiB"
    unknown = set(sets) - set(units) - set(fields)
    if unknown:
        raise GpuprovError(f"smi.yaml sets unknown fields for {model.key}: {sorted(unknown)}", step="lab mirror")
    return fields, units


def _mib(value: str) -> int:
    return int(value.split()[0])


def gpu_profiles_table(profiles=None) -> dict[str, list[dict]]:
    """What the simulated nvidia-smi reports per lab profile: one row per GPU (catalog names and sizes, and every
    --query-gpu field's value from the real captures, see `model_fields`)."""
    from gpuprov import catalog
    from gpuprov.lab.profiles import load_profiles

    smi = _smi_data()
    out = {}
    for name, profile in sorted((profiles if profiles is not None else load_profiles()).items()):
        rows = []
        for index, device in enumerate(profile.gpu_devices()):
            model = catalog.by_pci_id(device["device"]) or catalog.lookup(profile.hardware["gpu"])
            mig = model.compute_capability in smi["mig_compute_capabilities"]
            ecc = True if model.datacenter else None
            base, units = model_fields(model)
            fields = dict(base)
            domain, bus, rest = device["slot"].split(":")
            fields.update({"pci.bus_id": "0000" + device["slot"].upper(), "pci.domain": f"0x{domain.upper()}",
                           "pci.bus": f"0x{bus.upper()}", "pci.device": f"0x{rest.split('.')[0].upper()}",
                           "pci.device_id": f"0x{device['device'].upper()}10DE",
                           "mig.mode.current": ("Enabled" if profile.mig else "Disabled") if mig else "[N/A]",
                           "mig.mode.pending": ("Enabled" if profile.mig else "Disabled") if mig else "[N/A]"})
            if ecc is None:  # no ECC reporting: every ECC field is [N/A], as nvidia-smi prints unsupported ones
                fields.update({k: "[N/A]" for k in fields if k.startswith("ecc.")})
            if model.form_factor == "sxm":
                fields["platform.module_id"] = str(index + 1)
            rows.append({
                "bus_id": fields["pci.bus_id"], "device_id": device["device"], "model": model.key,
                "name": fields["name"], "brand": "NVIDIA" if model.datacenter else "GeForce",
                "architecture": smi["architectures"].get(model.arch, model.arch.title()),
                "compute_capability": model.compute_capability, "memory_mib": _mib(fields["memory.total"]),
                "ecc": ecc, "nvswitch": bool(profile.hardware["nvswitch"]),
                "nvlink": (smi["models"].get(model.key) or {}).get("nvlink"), "fields": fields, "units": units,
                "mig_devices": [dict(smi["mig"][model.key]["profiles"][p], profile=p) for p in profile.mig]})
        out[name] = rows
    return out
