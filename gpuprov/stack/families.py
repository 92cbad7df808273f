"""The NVIDIA stack's package families: which installed packages belong to its driver and to a CUDA toolkit
release (a metapackage pulls in parts known only on the host, so they are selected by name), and what unattended
upgrades must never move. Provisioning holds them; the stack check and harden's unattended upgrades read them."""

from __future__ import annotations

import re

_TOOLKIT = re.compile(r"cuda-toolkit-(\d+)-(\d+)")
UNATTENDED = "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"


# Name prefixes of the NVIDIA driver's packages (deb and rpm): what a driver metapackage pulls in, whatever it is
# (libnvidia-compute-570, nvidia-firmware-570-570.148.08, xserver-xorg-video-nvidia-570, libnvidia-egl-wayland1,
# kmod-nvidia-open-dkms, xorg-x11-nvidia...). The unattended-upgrades blacklist keeps away the same names.
DRIVER_FAMILIES = ("nvidia-", "libnvidia-", "cuda-drivers", "libcuda", "libxnvctrl", "xserver-xorg-video-nvidia",
                   "kmod-nvidia", "xorg-x11-nvidia")


def driver_packages(packages: dict[str, str]) -> list[str]:
    """The installed packages of the driver families (`packages`: name -> version, as facts list them)."""
    return sorted(name for name in packages if name.startswith(DRIVER_FAMILIES))


def family_pattern(stack: dict) -> str | None:
    """The names of the stack's CUDA toolkit release as an extended regular expression: every package named for
    its major-minor (`cuda-compiler-13-2`, `libcublas-dev-13-2`, `gds-tools-13-2`,
    `cuda-toolkit-13-2-config-common`), the major's and the shared config packages and the versioned Nsight
    tools NVIDIA's toolkit pulls (`nsight-compute-2025.1.0`). None when the stack has no toolkit."""
    suffixes = sorted({match.groups() for p in (stack.get("cuda") or {}).get("packages") or []
                       if (match := _TOOLKIT.fullmatch(str(p.get("name"))))})
    if not suffixes:
        return None
    dashes = "|".join(f"{major}-{minor}" for major, minor in suffixes)
    majors = "|".join(sorted({f"{major}-" for major, _ in suffixes}))
    return (f"-({dashes})(-|$)|^cuda-toolkit-({majors})?config-common$|^nsight-(compute|systems)-[0-9]")


def in_family(name: str, pattern: str | None) -> bool:
    """Whether `name` is a package of the toolkit family `pattern` (see family_pattern)."""
    return pattern is not None and re.search(pattern, name) is not None


def family_packages(packages: dict[str, str], stack: dict) -> list[str]:
    """The installed packages (`packages`: name -> version, as facts list them) of the stack's toolkit family."""
    pattern = family_pattern(stack)
    return sorted(name for name in packages if in_family(name, pattern))


# Unattended-Upgrade::Package-Blacklist entries are regular expressions matched at the start of names.
BLACKLIST = ("nvidia-", "libnvidia-", "cuda-", "libcuda", "libnccl", "datacenter-gpu-manager",
             "xserver-xorg-video-nvidia", "libxnvctrl", "nvlsm", "linux-modules-nvidia-", "linux-objects-nvidia-",
             "linux-signatures-nvidia-")


def unattended() -> str:
    """The unattended-upgrades blacklist file: the NVIDIA stack is moved by gpuprov only."""
    entries = "".join(f'    "{entry}";\n' for entry in BLACKLIST)
    return ("// Managed by gpuprov: unattended-upgrades must never move the NVIDIA stack (a driver/library\n"
            "// mismatch breaks NVML until a reboot); gpuprov upgrades it deliberately.\n"
            f"Unattended-Upgrade::Package-Blacklist {{\n{entries}}};\n")
