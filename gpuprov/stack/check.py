"""Compare a host's facts (docs/design.md schema) with its stack: what differs and how to fix it."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from gpuprov.core.operations import parse_versionlock
from gpuprov.core.packages import VERSIONLOCK_LIST, for_family
from gpuprov.stack.families import driver_packages, family_packages
from gpuprov.stack.resolve import PACKAGE_SECTIONS

# `dkms status` lines: "nvidia/570.148.08, 6.1.0-18-amd64, x86_64: installed" (dkms 3) or
# "nvidia, 570.148.08, 6.1.0-18-amd64, x86_64: installed" (dkms 2); RHEL's open modules register "nvidia-open".
_DKMS = re.compile(r"nvidia(?:-open)?\s*[/,]\s*(?P<version>[^,\s]+),\s*(?P<kernel>[^,\s]+),[^:]*:\s*(?P<status>[\w-]+)")


@dataclass(frozen=True)
class Mismatch:
    """One difference between the host and its stack."""

    what: str
    expected: str
    found: str
    remedy: str

    def to_dict(self) -> dict:
        return asdict(self)


def _dict(stack) -> dict:
    return stack.to_dict() if hasattr(stack, "to_dict") else stack


def held_packages(facts: dict) -> set[str]:
    """apt holds, or on the RHEL family the names in dnf's versionlock list."""
    if (facts.get("os") or {}).get("family") == "rhel":
        return set(parse_versionlock((facts.get("files") or {}).get(VERSIONLOCK_LIST) or ""))
    return set(facts.get("held") or [])


def dkms_mismatches(facts: dict, version: str) -> list[Mismatch]:
    """Installed kernels DKMS has not built driver `version`'s module for (they would boot without a GPU)."""
    if facts.get("dkms_status") is None:
        return []
    built: dict[str, str] = {}
    for line in facts["dkms_status"]:
        match = _DKMS.match(line.strip())
        if match and match["version"] == version:
            built[match["kernel"]] = match["status"]
    return [Mismatch(f"nvidia module for kernel {kernel}", f"nvidia {version} built and installed by DKMS",
                     built.get(kernel, "not built"),
                     f"install the headers for {kernel} (linux-headers-{kernel} / kernel-devel-{kernel}) and run "
                     f"`dkms autoinstall -k {kernel}` before booting it (invoke provision installs the headers "
                     "metapackage that keeps the next kernel's headers coming)")
            for kernel in facts.get("kernels_installed") or [] if built.get(kernel) != "installed"]


def host_driver(facts: dict) -> str | None:
    """The host's NVIDIA driver version: the loaded kernel module's, else what nvidia-smi reports."""
    return facts.get("loaded_driver_version") or (facts.get("nvidia_smi") or {}).get("driver_version")


def image_mismatches(facts: dict, images: list[dict], forward_compat: bool) -> list[Mismatch]:
    """The locked images (`{"name", "tag", "digest", "min_driver"}`) the host's driver no longer runs: older
    than the image's minimum, unless the stack uses CUDA forward compatibility."""
    from gpuprov.stack.data import at_least

    driver = host_driver(facts)
    out = []
    for image in images:
        minimum = image.get("min_driver")
        if not minimum or forward_compat or (driver is not None and at_least(driver, minimum)):
            continue
        out.append(Mismatch(f"locked image {image['name']}:{image['tag']} ({image['digest']})",
                            f"driver {minimum} or newer (io.gpuprov.min-driver)",
                            f"driver {driver}" if driver else "no NVIDIA driver loaded",
                            f"install a driver of at least {minimum} (invoke provision --update-lock after raising "
                            "stack.driver), or lock an image built for an older CUDA (invoke stack.lock --image)"))
    return out


def check_host(facts: dict, stack) -> list[Mismatch]:
    """Every mismatch between host facts and the stack (a Stack or its dict), each with a remedy."""
    stack = _dict(stack)
    out: list[Mismatch] = []
    want = stack["driver"]["version"]
    loaded = facts.get("loaded_driver_version")
    smi = (facts.get("nvidia_smi") or {}).get("driver_version")
    packages = facts.get("packages") or {}
    held = held_packages(facts)
    # rpm versions compare without the epoch (facts carry it, stacks may not)
    same = for_family("rhel" if (facts.get("os") or {}).get("family") == "rhel" else "debian").same_version

    if loaded and smi and loaded != smi:
        out.append(Mismatch("loaded kernel module vs driver libraries", smi, loaded,
                            "reboot the host: the running kernel module is older than the installed libraries "
                            "(nvidia-smi reports 'Failed to initialize NVML: Driver/library version mismatch')"))
    if loaded and loaded != want:
        remedy = ("reboot to load the installed driver" if any(v.startswith(want) for v in packages.values())
                  else f"install driver {want} (invoke provision), then reboot")
        out.append(Mismatch("loaded driver version", want, loaded, remedy))
    elif not loaded:
        out.append(Mismatch("loaded driver version", want, "no nvidia module loaded",
                            f"install driver {want} (invoke provision) and reboot; check dmesg for nvidia errors"))

    for part in PACKAGE_SECTIONS:
        for pkg in (stack.get(part) or {}).get("packages", []):
            found = packages.get(pkg["name"])
            if found is None:
                out.append(Mismatch(f"package {pkg['name']}", pkg["version"], "not installed",
                                    "run invoke provision for this host"))
            elif not same(found, pkg["version"]):
                out.append(Mismatch(f"package {pkg['name']}", pkg["version"], found,
                                    "run invoke provision (with --update-lock if the lock should change)"))
            elif pkg["name"] not in held:
                out.append(Mismatch(f"package {pkg['name']} hold", "held", "not held",
                                    f"hold it (apt-mark hold {pkg['name']} / dnf versionlock) or run "
                                    "invoke provision"))
    stack_names = {pkg["name"] for part in PACKAGE_SECTIONS for pkg in (stack.get(part) or {}).get("packages", [])}
    for name in driver_packages(packages):
        if name not in held and name not in stack_names:
            out.append(Mismatch(f"package {name} hold", "held (a package of the driver)", "not held",
                                f"hold it (apt-mark hold {name} / dnf versionlock) or run invoke provision: "
                                "an upgrade of one driver package breaks NVML until a reboot"))
    for name in family_packages(packages, stack):
        if name not in held and name not in stack_names:
            out.append(Mismatch(f"package {name} hold", "held (a package of the CUDA toolkit's release)",
                                "not held", f"hold it (apt-mark hold {name} / dnf versionlock) or run invoke "
                                "provision: an upgrade would move it to another release than the toolkit's"))
    driver_installed = all(same(packages.get(p["name"]), p["version"]) for p in stack["driver"]["packages"])
    if driver_installed:
        out.extend(dkms_mismatches(facts, want))

    fm_want = stack.get("fabricmanager")
    fm = facts.get("fabricmanager")
    if fm_want:
        if not fm:
            out.append(Mismatch("fabric manager", fm_want["version"], "not installed",
                                "install nvidia-fabricmanager at the driver version (invoke provision)"))
        else:
            if fm.get("version") != (loaded or want):
                out.append(Mismatch("fabric manager version", loaded or want, str(fm.get("version")),
                                    "install fabric manager at exactly the driver version, then restart "
                                    "nvidia-fabricmanager; it refuses to start on a mismatch"))
            if not fm.get("active"):
                nvlsm = ("; on fourth-generation NVSwitch systems (HGX B200/B300) it starts the NVLink Subnet "
                         "Manager and fails without the nvlsm package") if stack.get("nvlsm") else ""
                out.append(Mismatch("fabric manager service", "active", "inactive",
                                    "systemctl enable --now nvidia-fabricmanager; on NVSwitch systems CUDA "
                                    f"fails without it (journalctl -u nvidia-fabricmanager shows why){nvlsm}"))
    if not facts.get("kernel_headers", True):
        out.append(Mismatch("kernel headers", f"headers for {facts.get('kernel')}", "missing",
                            f"install the headers for the running kernel {facts.get('kernel')} so DKMS can build "
                            "the module (linux-headers-$(uname -r) / kernel-devel-$(uname -r))"))
    if facts.get("nouveau_loaded"):
        out.append(Mismatch("nouveau module", "not loaded", "loaded",
                            "blacklist nouveau (modprobe.d + update-initramfs/dracut) and reboot"))
    return out
