"""Compare a host's facts (docs/design.md schema) with its stack: what differs and how to fix it."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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


def check_host(facts: dict, stack) -> list[Mismatch]:
    """Every mismatch between host facts and the stack (a Stack or its dict), each with a remedy."""
    stack = _dict(stack)
    out: list[Mismatch] = []
    want = stack["driver"]["version"]
    loaded = facts.get("loaded_driver_version")
    smi = (facts.get("nvidia_smi") or {}).get("driver_version")
    packages = facts.get("packages") or {}
    held = set(facts.get("held") or [])

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

    for part in ("driver", "fabricmanager", "cuda", "nccl", "container_toolkit", "dcgm"):
        for pkg in (stack.get(part) or {}).get("packages", []):
            found = packages.get(pkg["name"])
            if found is None:
                out.append(Mismatch(f"package {pkg['name']}", pkg["version"], "not installed",
                                    "run invoke provision for this host"))
            elif found != pkg["version"]:
                out.append(Mismatch(f"package {pkg['name']}", pkg["version"], found,
                                    "run invoke provision (with --update-lock if the lock should change)"))
            elif pkg["name"] not in held:
                out.append(Mismatch(f"package {pkg['name']} hold", "held", "not held",
                                    f"hold it (apt-mark hold {pkg['name']} / dnf versionlock) or run "
                                    "invoke provision"))

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
                out.append(Mismatch("fabric manager service", "active", "inactive",
                                    "systemctl enable --now nvidia-fabricmanager; on NVSwitch systems CUDA "
                                    "fails without it (journalctl -u nvidia-fabricmanager shows why)"))
    if not facts.get("kernel_headers", True):
        out.append(Mismatch("kernel headers", f"headers for {facts.get('kernel')}", "missing",
                            f"install the headers for the running kernel {facts.get('kernel')} so DKMS can build "
                            "the module (linux-headers-$(uname -r) / kernel-devel-$(uname -r))"))
    if facts.get("nouveau_loaded"):
        out.append(Mismatch("nouveau module", "not loaded", "loaded",
                            "blacklist nouveau (modprobe.d + update-initramfs/dracut) and reboot"))
    return out
