"""Hardware profiles of lab hosts (data in profiles.yaml): simulated PCI devices and inventory vars; a host's
profile may name the Debian release it runs (`NAME@RELEASE`, gpuprov.lab.debian.RELEASES)."""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuprov.core.errors import InputError
from gpuprov.lab.debian import DEFAULT_RELEASE, check_release

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")
SMI_FILE = Path(__file__).with_name("files") / "standins" / "smi.yaml"   # the MIG profiles of each GPU model
NVIDIA = "10de"
_SLOT = re.compile(r"^(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
_HEX4 = re.compile(r"^[0-9a-f]{4}$")


@dataclass(frozen=True)
class Profile:
    """One hardware profile: the inventory `hardware:` vars and the PCI devices lspci shows."""

    name: str
    description: str
    hardware: dict
    devices: list[dict] = field(repr=False)
    vars: dict = field(default_factory=dict)
    mig: tuple[str, ...] = ()       # MIG devices of every GPU (MIG mode enabled), e.g. ("3g.40gb", "1g.10gb")
    release: str = DEFAULT_RELEASE  # the Debian release the host runs

    def gpu_devices(self) -> list[dict]:
        """The NVIDIA GPUs (display class 03xx) among the devices."""
        return [d for d in self.devices if d["vendor"] == NVIDIA and d["class"].startswith("03")]


def _device(data: dict, vendors: dict, classes: dict, where: str) -> dict:
    slot = str(data.get("slot", "")).lower()
    if not _SLOT.match(slot):
        raise InputError(f"{where}: bad PCI slot {slot!r} (want BB:DD.F or DDDD:BB:DD.F)", step="lab profiles")
    if slot.count(":") == 1:
        slot = "0000:" + slot
    vendor, device, cls = (str(data.get(k, "")).lower() for k in ("vendor", "device", "class"))
    for key, value in (("vendor", vendor), ("device", device), ("class", cls)):
        if not _HEX4.match(value):
            raise InputError(f"{where}: {key} must be 4 hex digits, got {value!r}", step="lab profiles")
    if vendor not in vendors or cls not in classes:
        raise InputError(f"{where}: vendor {vendor} or class {cls} has no name in profiles.yaml",
                         step="lab profiles")
    if not data.get("name"):
        raise InputError(f"{where}: device name missing", step="lab profiles")
    rev = data.get("rev")
    return {"slot": slot, "class": cls, "class_name": classes[cls], "vendor": vendor,
            "vendor_name": vendors[vendor], "device": device, "name": str(data["name"]),
            "rev": str(rev) if rev is not None else None}


def _device_group(block: dict, vendors: dict, classes: dict, where: str) -> list[dict]:
    """A block's devices: one per slot (vendor NVIDIA unless the block names another), plus its functions."""
    vendor = str(block.get("vendor", NVIDIA))
    devices = []
    for slot in block.get("slots") or []:
        devices.append(_device({**block, "slot": slot, "vendor": vendor}, vendors, classes, where))
        for extra in block.get("functions") or []:
            func_slot = f"{str(slot).rsplit('.', 1)[0]}.{extra['function']}"
            devices.append(_device({**extra, "slot": func_slot, "vendor": vendor}, vendors, classes, where))
    return devices


# Inventory variables a profile may give its group.
PROFILE_VARS = {"container_engine": ("docker",)}


def _profile_vars(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where}: vars must be a mapping", step="lab profiles")
    for key, item in value.items():
        if key not in PROFILE_VARS or item not in PROFILE_VARS[key]:
            raise InputError(f"{where}: vars.{key}: {item!r} is not allowed (allowed: "
                             f"{', '.join(f'{k}: {v}' for k, v in PROFILE_VARS.items())})", step="lab profiles")
    return dict(value)


def _mig(value, gpu: str, where: str) -> tuple[str, ...]:
    """A profile's MIG devices: profile names of its GPU model's MIG table (smi.yaml `mig`) that fit the GPU's
    compute and memory slices together."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise InputError(f"{where}: mig must be a non-empty list of MIG profile names", step="lab profiles")
    table = (yaml.safe_load(SMI_FILE.read_text(encoding="utf-8")).get("mig") or {}).get(gpu)
    if not table:
        raise InputError(f"{where}: mig: the simulated {gpu} has no MIG profiles (smi.yaml mig)", step="lab profiles")
    unknown = [name for name in value if name not in table["profiles"]]
    if unknown:
        raise InputError(f"{where}: mig: unknown {gpu} MIG profile(s) {', '.join(unknown)} (known: "
                         f"{', '.join(table['profiles'])})", step="lab profiles")
    for kind in ("compute", "memory"):
        used = sum(table["profiles"][name][kind] for name in value)
        if used > table[f"{kind}_slices"]:
            raise InputError(f"{where}: mig: {', '.join(value)} take {used} {kind} slices, the GPU has "
                             f"{table[f'{kind}_slices']}", step="lab profiles")
    return tuple(value)


def parse_profiles(data: dict) -> dict[str, Profile]:
    """Validate the profiles document and build every profile's device list."""
    vendors = {str(k).lower(): v for k, v in (data.get("vendors") or {}).items()}
    classes = {str(k).lower(): v for k, v in (data.get("classes") or {}).items()}
    common = [_device(d, vendors, classes, "common_devices") for d in data.get("common_devices") or []]
    profiles = {}
    for name, spec in (data.get("profiles") or {}).items():
        where = f"profile {name}"
        hardware = spec.get("hardware") or {}
        if set(hardware) != {"gpu", "count", "nvswitch"}:
            raise InputError(f"{where}: hardware must have exactly gpu, count, nvswitch", step="lab profiles")
        gpus = _device_group({**(spec.get("gpu") or {}), "vendor": NVIDIA}, vendors, classes, where)
        switches = _device_group(spec.get("nvswitch") or {}, vendors, classes, where)
        devices = common + gpus + switches
        profile = Profile(name, spec.get("description", ""), dict(hardware), devices,
                          _profile_vars(spec.get("vars"), where), _mig(spec.get("mig"), hardware["gpu"], where))
        if len(profile.gpu_devices()) != hardware["count"]:
            raise InputError(f"{where}: hardware.count is {hardware['count']} but {len(profile.gpu_devices())} "
                             "GPU slots are listed", step="lab profiles")
        if bool(switches) != bool(hardware["nvswitch"]):
            raise InputError(f"{where}: hardware.nvswitch disagrees with the NVSwitch devices",
                             step="lab profiles")
        slots = [d["slot"] for d in devices]
        if len(set(slots)) != len(slots):
            raise InputError(f"{where}: a PCI slot is used twice", step="lab profiles")
        profiles[name] = profile
    for name in data.get("default_mix") or []:
        if name not in profiles:
            raise InputError(f"default_mix names unknown profile {name!r}", step="lab profiles")
    return profiles


def load_document(path: Path = PROFILES_FILE) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def load_profiles(path: Path = PROFILES_FILE) -> dict[str, Profile]:
    """All profiles from profiles.yaml."""
    return parse_profiles(load_document(path))


def split_spec(spec: str) -> tuple[str, str]:
    """(profile, Debian release) of a `--profile` item: `NAME` (the default release) or `NAME@RELEASE`."""
    name, at, release = spec.partition("@")
    if at and not release:
        raise InputError(f"--profile {spec}: no Debian release after '@'", step="lab.up",
                         hint=f"give NAME or NAME@RELEASE, e.g. {name}@bullseye")
    return name, check_release(release, f"--profile {spec}") if at else DEFAULT_RELEASE


def assign_profiles(count: int, names: list[str] | None, path: Path = PROFILES_FILE) -> list[Profile]:
    """The profile of each of `count` hosts: `names` (or the default mix) cycled over the hosts. A name may carry
    the host's Debian release, `NAME@RELEASE` (default: DEFAULT_RELEASE)."""
    if count < 1:
        raise InputError(f"--hosts must be at least 1, got {count}", step="lab.up")
    document = load_document(path)
    profiles = parse_profiles(document)
    chosen = [split_spec(spec) for spec in names or list(document.get("default_mix") or sorted(profiles))]
    unknown = [name for name, _ in chosen if name not in profiles]
    if unknown:
        raise InputError(f"unknown lab profile(s): {', '.join(unknown)}", step="lab.up",
                         hint=f"choose from: {', '.join(sorted(profiles))} (each may end in @RELEASE)")
    return [dataclasses.replace(profiles[name], release=release)
            for name, release in itertools.islice(itertools.cycle(chosen), count)]
