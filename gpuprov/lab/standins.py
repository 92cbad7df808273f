"""Stand-in packages for the lab mirror: NVIDIA's real package names and versions (from the resolver), built
with `dpkg-deb`, installing simulated tools (nvidia-smi, nvidia-ctk, ...) and marker files.

Everything simulated lives here, in `smi_answers` (what the simulated nvidia-smi reports) and in
`files/standins/`; the provisioning path never sees it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.errors import GpuprovError

FILES = Path(__file__).with_name("files") / "standins"
CAPTURES = Path(__file__).with_name("files") / "captures"
OS_KEY = "debian-12"
MAINTAINER = "gpuprov lab <lab@gpuprov.invalid>"
NOT_NVIDIA = "gpuprov lab stand-in, not NVIDIA software"
LIB = "usr/lib/gpuprov-lab"
UNITS = "lib/systemd/system"
MODULE_UNIT = "gpuprov-lab-nvidia-module.service"
# The dcgm-exporter stand-in (files/standins/dcgm-exporter-standin), its unit (NVIDIA's name and settings) and the
# default counters file it ships (NVIDIA's default fields that it simulates).
EXPORTER_STANDIN = "dcgm-exporter-standin"
EXPORTER_DEFAULT_COUNTERS = "dcgm-exporter-default-counters.csv"
TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
# Mutually exclusive stand-ins (another branch replaces the installed one, as NVIDIA's packages do).
EXCLUSIVE = {"driver": "gpuprov-lab-nvidia-driver", "driver_pinning": "gpuprov-lab-nvidia-driver-pinning",
             "fabricmanager": "gpuprov-lab-nvidia-fabricmanager", "nscq": "gpuprov-lab-nvidia-nscq"}

# The packages a driver metapackage pulls, as NVIDIA packages them for Debian/Ubuntu (CUDA repository, and
# nvidia-graphics-drivers-<br> on Ubuntu): metapackage -> nvidia-driver + nvidia-dkms of its branch and flavor,
# which pull the libraries, tools and kernel-module packages, every one at exactly the metapackage's version.
# Branch-suffixed names (< 590) are those a real `apt-get install cuda-runtime-12-9` removed from a host with
# nvidia-open-570 570.133.20 (libnvidia-compute-570, nvidia-utils-570, nvidia-compute-utils-570,
# nvidia-dkms-570-open, nvidia-driver-570-open, nvidia-kernel-common-570, nvidia-kernel-source-570-open,
# nvidia-firmware-570-570.133.20, libnvidia-gl-570, ...). From 590 on NVIDIA drops the branch from the names
# (Driver Installation Guide, "Ubuntu 590 and later packages": libnvidia-compute-580 -> libnvidia-compute,
# nvidia-dkms-580-open -> nvidia-dkms-open); the names of that table's rows not captured in
# shared/reference follow the same rule (unconfirmed). The branch is then held by nvidia-driver-pinning-<br>.
# part -> (name with the branch, name without it, flavored, [parts it depends on])
DRIVER_PARTS: dict[str, tuple[str, str, bool, tuple[str, ...]]] = {
    "core": ("nvidia-driver-{br}", "nvidia-driver", True,
             ("compute", "utils", "compute_utils", "gl", "xserver")),
    "dkms": ("nvidia-dkms-{br}", "nvidia-dkms", True, ("kernel_source", "kernel_common")),
    "kernel_source": ("nvidia-kernel-source-{br}", "nvidia-kernel-source", True, ()),
    "kernel_common": ("nvidia-kernel-common-{br}", "nvidia-kernel-common", False, ("firmware",)),
    "firmware": ("nvidia-firmware-{br}-{v}", "nvidia-firmware-{v}", False, ()),
    "compute": ("libnvidia-compute-{br}", "libnvidia-compute", False, ("kernel_common",)),
    "utils": ("nvidia-utils-{br}", "nvidia-utils", False, ("compute",)),
    "compute_utils": ("nvidia-compute-utils-{br}", "nvidia-compute-utils", False, ("compute",)),
    "gl": ("libnvidia-gl-{br}", "libnvidia-gl", False, ()),
    "xserver": ("xserver-xorg-video-nvidia-{br}", "xserver-xorg-video-nvidia", False, ()),
}
META_PARTS = ("core", "dkms")
# A CUDA toolkit release as NVIDIA's repository builds it: cuda-toolkit-X-Y at the release's version (X.Y.Z-1)
# depends on its parts by a minimum version, `cuda-compiler-X-Y (>= X.Y.Z)`; the metapackages among them (at the
# release's version too) on the components by theirs, each component versioned on its own (cuda-cudart-12-8
# 12.8.90-1, cuda-nvcc-12-8 12.8.93-1 and libcublas-12-8 12.8.4.1-1 in 12.8.1, as NVIDIA's cuda images install
# them). A minimum admits a later release's part, so apt alone installs the newest parts the repository has.
# part -> (version: the release's, a component's or a library's, [parts it depends on]); the names of
# NVIDIA/nvidia-container-toolkit#883 (`apt-get install cuda-toolkit-12-8`), a subset.
CUDA_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cuda-compiler": ("release", ("cuda-nvcc",)),
    "cuda-libraries": ("release", ("cuda-cudart", "libcublas")),
    "cuda-libraries-dev": ("release", ("cuda-cudart-dev", "libcublas-dev")),
    "cuda-tools": ("release", ("cuda-command-line-tools",)),
    "cuda-command-line-tools": ("release", ("cuda-gdb",)),
    "cuda-nvml-dev": ("component", ()),
    "cuda-nvcc": ("component", ()),
    "cuda-cudart": ("component", ()),
    "cuda-cudart-dev": ("component", ("cuda-cudart",)),
    "cuda-gdb": ("component", ()),
    "libcublas": ("library", ()),
    "libcublas-dev": ("library", ("libcublas",)),
}
CUDA_TOOLKIT_PARTS = ("cuda-compiler", "cuda-libraries", "cuda-libraries-dev", "cuda-tools", "cuda-nvml-dev")
# The newer point release the mirror also publishes (see newer_point_release): same branch, this minor.
NEWER_POINT_MINOR = "999"
# The newer patch release of a stack's CUDA toolkit the mirror also publishes (see newer_cuda_release).
NEWER_CUDA_PATCH = "99"
_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_VERSION = re.compile(r"(\d+:)?[0-9][A-Za-z0-9.+~-]*")


@dataclass(frozen=True)
class PackageSpec:
    """One stand-in package: NVIDIA's name and exact version, its role, and the component's own version
    (driver 570.148.08, toolkit 1.17.8, CUDA 12.8.1, ...)."""

    name: str
    version: str
    role: str
    upstream: str
    depends: tuple[str, ...] = ()

    @property
    def filename_version(self) -> str:
        return self.version.split(":", 1)[-1]

    def exact(self) -> str:
        """This package as a dependency on exactly its version: `name (= version)`."""
        return f"{self.name} (= {self.version})"


@dataclass
class Contents:
    """A package's payload: files (path -> (bytes, mode)), symlinks (path -> target), maintainer scripts."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)

    def add(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        self.files[path.lstrip("/")] = (data.encode() if isinstance(data, str) else data, mode)


# ------------------------------------------------------------------------------------------- which packages

def lab_stacks(profiles=None, previous: int = 2) -> list[dict]:
    """Resolved stacks the mirror carries: for each lab profile's hardware on debian-12, the default
    (newest) stack plus one pinned to each of the `previous` stable driver branches below it."""
    from gpuprov.lab.profiles import load_profiles
    from gpuprov.stack.data import table
    from gpuprov.stack.resolve import STABLE_KINDS, StackConflict, resolve

    if profiles is None:
        profiles = load_profiles()
    profiles = list(profiles.values()) if isinstance(profiles, dict) else list(profiles)
    branches = table("drivers")["branches"]
    stacks: list[dict] = []
    for profile in profiles:
        hw = profile.hardware
        args = {"gpus": int(hw["count"]), "nvswitch": bool(hw["nvswitch"])}
        newest = resolve(hw["gpu"], OS_KEY, **args)
        stacks.append(newest.to_dict())
        older = sorted((b for b, row in branches.items()
                        if row.get("latest") and row.get("kind") in STABLE_KINDS
                        and int(b) < int(newest.driver["branch"])), key=int, reverse=True)
        taken = 0
        for branch in older:
            if taken == previous:
                break
            try:
                stacks.append(resolve(hw["gpu"], OS_KEY, driver=branch, **args).to_dict())
                taken += 1
            except StackConflict:
                continue
    return stacks


def _driver_meta_flavor(name: str) -> str | None:
    """"open" / "proprietary" for a driver metapackage name (nvidia-open[-<br>], cuda-drivers[-<br>])."""
    if re.fullmatch(r"nvidia-open(-\d{3})?", name):
        return "open"
    if re.fullmatch(r"cuda-drivers(-\d{3})?", name):
        return "proprietary"
    return None


def driver_parts(meta: PackageSpec) -> list[PackageSpec]:
    """The packages a driver metapackage depends on (recursively), each at the metapackage's version, with
    their own Depends; `meta` itself is not in the list (see `with_driver_depends`)."""
    flavor = _driver_meta_flavor(meta.name)
    if flavor is None:
        return []
    branch = meta.upstream.split(".")[0]
    versioned = meta.name.endswith(f"-{branch}")
    names = {}
    for part, (with_branch, without, flavored, _) in DRIVER_PARTS.items():
        name = (with_branch if versioned else without).format(br=branch, v=meta.upstream)
        names[part] = name + ("-open" if flavored and flavor == "open" else "")
    out = []
    for part, (_, _, _, needs) in DRIVER_PARTS.items():
        depends = tuple(f"{names[n]} (= {meta.version})" for n in needs)
        if part == "dkms":
            depends += (DKMS.name,)
        out.append(PackageSpec(names[part], meta.version, f"driver_{part}", meta.upstream, depends))
    return out


def with_driver_depends(meta: PackageSpec) -> PackageSpec:
    """The metapackage with its Depends on the core driver and kernel-module packages at its version."""
    parts = {p.role: p for p in driver_parts(meta)}
    if not parts:
        return meta
    return PackageSpec(meta.name, meta.version, meta.role, meta.upstream,
                       tuple(parts[f"driver_{part}"].exact() for part in META_PARTS))


def cuda_part_version(part: str, release: str) -> str:
    """The upstream version of a toolkit part in release X.Y.Z: the release's own for metapackages, X.Y.B for a
    component (B = 30 (Z + 2): 12.8.90 in 12.8.1, NVIDIA's cuda-cudart there) and X.Y.(Z + 3).1 for a library
    (12.8.4.1 in 12.8.1, NVIDIA's libcublas there); a later release's parts are newer for apt."""
    major, minor, patch = (release.split(".") + ["0"])[:3]
    kind = CUDA_PARTS[part][0]
    if kind == "component":
        return f"{major}.{minor}.{30 * (int(patch) + 2)}"
    if kind == "library":
        return f"{major}.{minor}.{int(patch) + 3}.1"
    return release


def cuda_parts(toolkit: PackageSpec) -> list[PackageSpec]:
    """cuda-toolkit-X-Y's parts in its release, each at its own version, depending on its parts by a minimum
    version as NVIDIA's do (see CUDA_PARTS)."""
    suffix = toolkit.name.removeprefix("cuda-toolkit-")
    if suffix == toolkit.name or not re.fullmatch(r"\d+-\d+", suffix):
        return []
    out = []
    for part, (_, needs) in CUDA_PARTS.items():
        upstream = cuda_part_version(part, toolkit.upstream)
        depends = tuple(f"{need}-{suffix} (>= {cuda_part_version(need, toolkit.upstream)})" for need in needs)
        out.append(PackageSpec(f"{part}-{suffix}", f"{upstream}-1", "cuda_part", upstream, depends))
    return out


def with_cuda_depends(toolkit: PackageSpec) -> PackageSpec:
    """The toolkit metapackage with its Depends on its parts, each by the minimum version of its release."""
    suffix = toolkit.name.removeprefix("cuda-toolkit-")
    if not cuda_parts(toolkit):
        return toolkit
    depends = tuple(f"{part}-{suffix} (>= {cuda_part_version(part, toolkit.upstream)})" for part in CUDA_TOOLKIT_PARTS)
    return PackageSpec(toolkit.name, toolkit.version, toolkit.role, toolkit.upstream, depends)


def expand(specs: list[PackageSpec]) -> list[PackageSpec]:
    """`specs` with the metapackages' Depends filled in and every part they pull added (deduplicated, sorted)."""
    seen: dict[tuple[str, str], PackageSpec] = {}
    for spec in specs:
        if spec.role == "driver":
            extra = driver_parts(spec)
            spec = with_driver_depends(spec)
        elif spec.role == "cuda":
            extra = cuda_parts(spec)
            spec = with_cuda_depends(spec)
        else:
            extra = []
        for item in (spec, *extra):
            seen.setdefault((item.name, item.version), item)
    return sorted(seen.values(), key=lambda s: (s.name, s.version))


def newer_upstream(upstream: str) -> str:
    """The newer point release of a driver version: same branch, minor NEWER_POINT_MINOR
    ("570.148.08" -> "570.999.01", "595.80" -> "595.999")."""
    fields = upstream.split(".")
    return ".".join([fields[0], NEWER_POINT_MINOR] + ["01"] * (len(fields) > 2))


def newer_point_release(stack: dict) -> list[PackageSpec]:
    """What the lab mirror publishes as a newer point release of `stack`'s driver branch, beside the stack's
    own versions (see gpuprov.lab.mirror): every package of the stack versioned like the driver
    (the metapackage and pinning package, the fabric manager, NSCQ), and every package the metapackage pulls, all
    at `newer_upstream()` of the driver version (`570.211.01-1` -> `570.999.01-1`). Packages with versions of
    their own (CUDA, NCCL, toolkit, DCGM, cuda-compat) are not re-released."""
    driver = stack["driver"]
    old, new = str(driver["version"]), newer_upstream(str(driver["version"]))
    specs = []
    for component, part in stack.items():
        if not isinstance(part, dict) or not isinstance(part.get("packages"), list):
            continue
        for pkg in part["packages"]:
            name, version = str(pkg["name"]), str(pkg["version"])
            if _upstream(version) != old:
                continue
            bumped = version.replace(old, new, 1)
            specs.append(PackageSpec(name, bumped, _role(component, name), new))
    return expand(specs)


def newer_cuda_release(stack: dict) -> list[PackageSpec]:
    """What the lab mirror publishes as a newer patch release of `stack`'s CUDA toolkit, beside the stack's own
    (as NVIDIA's repository keeps every release of a toolkit): cuda-toolkit-X-Y at X.Y.NEWER_CUDA_PATCH with
    every part of that release (`expand`)."""
    specs = []
    for pkg in (stack.get("cuda") or {}).get("packages") or []:
        name = str(pkg["name"])
        if re.fullmatch(r"cuda-toolkit-\d+-\d+", name):
            major, minor = str(stack["cuda"]["version"]).split(".")[:2]
            upstream = f"{major}.{minor}.{NEWER_CUDA_PATCH}"
            specs.append(PackageSpec(name, f"{upstream}-1", "cuda", upstream))
    return expand(specs)


def newest_stacks(stacks: list[dict]) -> list[dict]:
    """Per GPU model, the stack with the newest driver branch (what each lab profile resolves by default)."""
    best: dict[str, dict] = {}
    for stack in stacks:
        model = stack["gpu"]["model"]
        if model not in best or int(stack["driver"]["branch"]) > int(best[model]["driver"]["branch"]):
            best[model] = stack
    return list(best.values())


def point_release_packages(stacks: list[dict]) -> list[PackageSpec]:
    """The newer point release of every lab profile's newest driver branch and the newer patch release of its
    CUDA toolkit (deduplicated, sorted)."""
    seen: dict[tuple[str, str], PackageSpec] = {}
    for stack in newest_stacks(stacks):
        for spec in [*newer_point_release(stack), *newer_cuda_release(stack)]:
            seen.setdefault((spec.name, spec.version), spec)
    return sorted(seen.values(), key=lambda s: (s.name, s.version))


def _role(component: str, name: str) -> str:
    if component == "driver" and name.startswith("nvidia-driver-pinning-"):
        return "driver_pinning"
    if component == "cuda" and name.startswith("cuda-compat-"):
        return "cuda_compat"
    return component


def _upstream(version: str) -> str:
    """"1:4.4.1-1" -> "4.4.1"; "575.57.08-1" -> "575.57.08"."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def standin_packages(stacks: list[dict], kernel: str) -> list[PackageSpec]:
    """Every package of `stacks` (Stack.to_dict() documents) with every package their driver and CUDA
    metapackages pull (`expand`), deduplicated by (name, version), plus the `linux-headers-<kernel>` and
    `dkms` stand-ins; in a stable order."""
    seen: dict[tuple[str, str], PackageSpec] = {}
    for stack in stacks:
        for component, part in stack.items():
            if not isinstance(part, dict) or not isinstance(part.get("packages"), list):
                continue  # null sections, and sections without packages (gpu, pytorch)
            for pkg in part["packages"]:
                name, version = str(pkg["name"]), str(pkg["version"])
                if not _PACKAGE_NAME.fullmatch(name) or not _VERSION.fullmatch(version):
                    raise GpuprovError(f"stack package {name!r} {version!r} is not a valid Debian name/version",
                                       step="lab mirror", hint="check gpuprov/data/packages.yaml")
                role = _role(component, name)
                upstream = _upstream(version) if role == "cuda_compat" else str(part["version"])
                seen.setdefault((name, version), PackageSpec(name, version, role, upstream))
    for spec in (kernel_headers_spec(kernel), DKMS):
        seen.setdefault((spec.name, spec.version), spec)
    for stack in stacks:
        exporter = dcgm_exporter_spec(str((stack.get("dcgm") or {}).get("version") or ""))
        if exporter is not None:
            seen.setdefault((exporter.name, exporter.version), exporter)
    return expand(list(seen.values()))


def dcgm_exporter_spec(dcgm_version: str) -> PackageSpec | None:
    """The dcgm-exporter package paired with a DCGM release (gpuprov/data/dcgm_exporter.yaml: NVIDIA's name,
    `<exporter>-<release>`), as a stand-in; None for a DCGM release without a pairing there."""
    from gpuprov.stack.data import table

    data = table("dcgm_exporter")
    row = data["releases"].get(dcgm_version)
    if not row:
        return None
    exporter = str(row["exporter"])
    epoch = f"{data['apt_epoch']}:" if data.get("apt_epoch") else ""
    return PackageSpec(str(data["package"]), f"{epoch}{exporter}-{data['package_release']}", "dcgm_exporter",
                       exporter)


def dcgm_exporter_tag(exporter_version: str) -> str:
    """"<dcgm>-<exporter>" (what `dcgm-exporter --version` prints) of an exporter release of the data."""
    from gpuprov.stack.data import table

    for dcgm, row in table("dcgm_exporter")["releases"].items():
        if str(row["exporter"]) == exporter_version:
            return f"{dcgm}-{exporter_version}"
    return exporter_version


# The lab hosts see no Debian mirror (an air-gapped site), so what the driver pulls from Debian is here too.
DKMS = PackageSpec("dkms", "3.0.10-8+deb12u1", "dkms", "3.0.10")


def kernel_headers_spec(kernel: str) -> PackageSpec:
    """A stand-in `linux-headers-<kernel>` for the running kernel (the lab containers share it)."""
    name = f"linux-headers-{kernel}"
    base = re.match(r"\d+(?:\.\d+)*", kernel)
    if not _PACKAGE_NAME.fullmatch(name) or not base:
        raise GpuprovError(f"kernel release {kernel!r} gives no valid Debian package name", step="lab mirror",
                           hint="the lab needs a kernel release like 6.1.0-18-amd64 (uname -r)")
    return PackageSpec(name, f"{base.group(0)}-0gpuprovlab1", "kernel_headers", kernel)


# ------------------------------------------------------------------------------------------ simulated data

def driver_cuda_version(driver_version: str) -> str:
    """The highest CUDA release a driver runs natively (nvidia-smi's `CUDA Version`), from cuda.yaml."""
    from gpuprov.stack.data import at_least, table, vkey

    fits = [minor for minor, row in table("cuda")["releases"].items()
            if at_least(driver_version, min(row["updates"].values(), key=vkey))]
    return max(fits, key=vkey) if fits else "N/A"


# --------------------------------------------------------------------------------------------- contents

def _template(name: str, version: str = "") -> str:
    return (FILES / name).read_text(encoding="utf-8").replace("@VERSION@", version)


def _marker(spec: PackageSpec) -> str:
    return f"{spec.name} {spec.version}: {NOT_NVIDIA}\n"


def _enable_script(unit: str, first_load: bool) -> str:
    load = ("  mkdir -p /run/gpuprov-lab\n"
            "  [ -e /run/gpuprov-lab/loaded-driver ] || cp /usr/lib/gpuprov-lab/module-version "
            "/run/gpuprov-lab/loaded-driver\n") if first_load else ""
    return ("#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n"
            "  mkdir -p /etc/systemd/system/multi-user.target.wants\n"
            f"  ln -sf /{UNITS}/{unit} /etc/systemd/system/multi-user.target.wants/{unit}\n{load}"
            "  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\nfi\n")


def _disable_script(unit: str) -> str:
    return ("#!/bin/sh\nset -e\nif [ \"$1\" = remove ] || [ \"$1\" = purge ]; then\n"
            f"  [ -e /{UNITS}/{unit} ] || rm -f /etc/systemd/system/multi-user.target.wants/{unit}\n"
            "  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\nfi\n")


def _reload_script() -> str:
    return "#!/bin/sh\nset -e\nif [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\n"


def package_contents(spec: PackageSpec, gpu_table: dict, arch: str = "amd64") -> Contents:
    """What a stand-in installs, by role."""
    out = Contents()
    out.add(f"usr/share/doc/{spec.name}/gpuprov-lab-standin", _marker(spec))
    triplet = TRIPLETS.get(arch, f"{arch}-linux-gnu")
    if spec.role.startswith("driver"):
        _driver_contents(out, spec, triplet, gpu_table)
    elif spec.role in _CONTENTS:
        _CONTENTS[spec.role](out, spec, triplet)
    # any other component of a stack: the marker only (its packages still install at their exact versions)
    return out


def _driver_contents(out: Contents, spec: PackageSpec, triplet: str, gpu_table: dict) -> None:
    """The driver's parts: the libraries, nvidia-smi with `gpu_table`, the kernel module and its unit."""
    role, v = spec.role, spec.upstream
    if role in ("driver", "driver_core", "driver_kernel_common", "driver_gl", "driver_xserver"):
        pass  # metapackages and parts the simulation needs nothing from: the marker only
    elif role == "driver_compute":
        # the NVML and CUDA driver libraries: their version is what nvidia-smi calls the installed driver
        out.add(f"{LIB}/driver-version", v + "\n")
        out.add(f"{LIB}/driver-cuda-version", driver_cuda_version(v) + "\n")
        for lib in ("libnvidia-ml", "libcuda"):
            out.add(f"usr/lib/{triplet}/{lib}.so.{v}", _marker(spec))
            out.links[f"usr/lib/{triplet}/{lib}.so.1"] = f"{lib}.so.{v}"
    elif role == "driver_utils":
        out.add("usr/bin/nvidia-smi", _template("nvidia-smi"), 0o755)
        out.add(f"{LIB}/gpu-profiles.json", json.dumps(gpu_table, indent=1, sort_keys=True) + "\n")
    elif role == "driver_compute_utils":
        out.add(f"{UNITS}/nvidia-persistenced.service", _template("nvidia-persistenced.service"))
        out.scripts["postinst"] = out.scripts["postrm"] = _reload_script()
    elif role == "driver_dkms":
        # the kernel module: its version is what loads at boot (and on a host that had no driver, at once)
        out.add(f"{LIB}/module-version", v + "\n")
        out.add(f"{UNITS}/{MODULE_UNIT}", _template(MODULE_UNIT))
        out.scripts["postinst"] = _enable_script(MODULE_UNIT, first_load=True)
        out.scripts["postrm"] = _disable_script(MODULE_UNIT)
    elif role == "driver_kernel_source":
        out.add(f"usr/src/nvidia-{v}/gpuprov-lab-standin", _marker(spec))
    elif role == "driver_firmware":
        out.add(f"lib/firmware/nvidia/{v}/gsp_ga10x.bin", _marker(spec))
    elif role == "driver_pinning":
        out.add(f"usr/share/gpuprov-lab/driver-pinning-{v.split('.')[0]}", _marker(spec))


def _cuda_contents(out: Contents, spec: PackageSpec, triplet: str) -> None:
    """The CUDA toolkit: its parts (nvcc answers --version), its version.json and alternative, cuda-compat."""
    v = spec.upstream
    if spec.role == "cuda_part":
        minor = ".".join(v.split(".")[:2])
        home = f"usr/local/cuda-{minor}"
        if spec.name.startswith("cuda-nvcc-"):
            out.add(f"{home}/bin/nvcc", "#!/bin/sh\n# " + _marker(spec) +
                    "printf '%s\\n' 'nvcc: NVIDIA (R) Cuda compiler driver' "
                    f"'Cuda compilation tools, release {minor}, V{v}'\n", 0o755)
        else:
            out.add(f"{home}/gpuprov-lab/{spec.name}", _marker(spec))
    elif spec.role == "cuda":
        minor = ".".join(v.split(".")[:2])
        home = f"usr/local/cuda-{minor}"
        out.add(f"{home}/version.json", json.dumps({"cuda": {"name": "CUDA SDK", "version": v}}, indent=3) + "\n")
        priority = int(minor.replace(".", ""))
        out.scripts["postinst"] = ("#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n"
                                   f"  update-alternatives --install /usr/local/cuda cuda /{home} {priority}\nfi\n")
        out.scripts["prerm"] = ("#!/bin/sh\nset -e\nif [ \"$1\" = remove ]; then\n"
                                f"  update-alternatives --remove cuda /{home} || true\nfi\n")
    else:   # cuda_compat
        minor = spec.name.removeprefix("cuda-compat-").replace("-", ".")
        compat = f"usr/local/cuda-{minor}/compat"
        out.add(f"{compat}/libcuda.so.{v}", _marker(spec))
        out.links[f"{compat}/libcuda.so.1"] = f"libcuda.so.{v}"


def _nccl_contents(out: Contents, spec: PackageSpec, triplet: str) -> None:
    """NCCL: the library, or for the -dev/-devel package nccl.h with the version macros."""
    v = spec.upstream
    major, minor, patch = (v.split(".") + ["0", "0"])[:3]
    if spec.name.endswith("-dev") or spec.name.endswith("-devel"):
        out.add("usr/include/nccl.h", f"/* {_marker(spec).strip()} */\n#define NCCL_MAJOR {major}\n"
                f"#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
                f"#define NCCL_VERSION_CODE {int(major) * 10000 + int(minor) * 100 + int(patch)}\n")
        out.links[f"usr/lib/{triplet}/libnccl.so"] = "libnccl.so.2"
    else:
        out.add(f"usr/lib/{triplet}/libnccl.so.{v}", _marker(spec))
        out.links[f"usr/lib/{triplet}/libnccl.so.2"] = f"libnccl.so.{v}"


def _dcgm_contents(out: Contents, spec: PackageSpec, triplet: str) -> None:
    """DCGM (dcgmi, nv-hostengine and their unit in the -core package) and dcgm-exporter."""
    v = spec.upstream
    if spec.role == "dcgm_exporter":
        # NVIDIA's layout (dcgm-exporter package-build): /usr/bin/dcgm-exporter, /etc/dcgm-exporter/, the unit
        out.add(f"{LIB}/{EXPORTER_STANDIN}", _template(EXPORTER_STANDIN, dcgm_exporter_tag(v)), 0o755)
        out.links["usr/bin/dcgm-exporter"] = f"/{LIB}/{EXPORTER_STANDIN}"
        out.add("etc/dcgm-exporter/default-counters.csv", _template(EXPORTER_DEFAULT_COUNTERS))
        out.add(f"{UNITS}/nvidia-dcgm-exporter.service", _template("nvidia-dcgm-exporter.service"))
        out.scripts["postinst"] = out.scripts["postrm"] = _reload_script()
    elif spec.name.endswith("-core"):
        out.add("usr/bin/dcgmi", _template("dcgmi", v), 0o755)
        out.add("usr/bin/nv-hostengine", _template("nv-hostengine", v), 0o755)
        out.add(f"{UNITS}/nvidia-dcgm.service", _template("nvidia-dcgm.service"))
        out.scripts["postinst"] = out.scripts["postrm"] = _reload_script()
    else:
        out.add(f"usr/lib/{triplet}/datacenter-gpu-manager-4/{spec.name}", _marker(spec))


def _fabric_contents(out: Contents, spec: PackageSpec, triplet: str) -> None:
    """The NVSwitch fabric: fabric manager, libnvidia-nscq and the NVLink Subnet Manager."""
    v = spec.upstream
    if spec.role == "fabricmanager":
        out.add("usr/bin/nv-fabricmanager", _template("nv-fabricmanager", v), 0o755)
        out.add("usr/share/nvidia/nvswitch/fabricmanager.cfg", "# " + _marker(spec))
        out.add(f"{UNITS}/nvidia-fabricmanager.service", _template("nvidia-fabricmanager.service"))
        out.scripts["postinst"] = out.scripts["postrm"] = _reload_script()
    elif spec.role == "nscq":
        out.add(f"usr/lib/{triplet}/libnvidia-nscq.so.{v}", _marker(spec))
        out.links[f"usr/lib/{triplet}/libnvidia-nscq.so.2"] = f"libnvidia-nscq.so.{v}"
    else:   # nvlsm
        out.add("usr/bin/nvlsm", "#!/bin/sh\n# " + _marker(spec) +
                f"[ \"$1\" = --version ] && {{ echo 'nvlsm {v}'; exit 0; }}\nexec sleep infinity\n", 0o755)
        out.add(f"{UNITS}/nvlsm.service", "# gpuprov lab stand-in (not NVIDIA software)\n[Unit]\n"
                "Description=NVLink Subnet Manager (gpuprov lab stand-in)\n\n[Service]\nExecStart=/usr/bin/nvlsm\n\n"
                "[Install]\nWantedBy=multi-user.target\n")
        out.scripts["postinst"] = out.scripts["postrm"] = _reload_script()


def _kernel_contents(out: Contents, spec: PackageSpec, triplet: str) -> None:
    """Debian's kernel headers (the module build directory) and dkms."""
    v = spec.upstream
    if spec.role == "kernel_headers":
        out.add(f"usr/src/linux-headers-{v}/Makefile", "# " + _marker(spec).replace(NOT_NVIDIA, "gpuprov lab "
                "stand-in, not Debian's kernel headers"))
        out.links[f"lib/modules/{v}/build"] = f"/usr/src/linux-headers-{v}"
    else:   # dkms
        out.add("usr/share/doc/dkms/gpuprov-lab", "# gpuprov lab stand-in, not Debian's dkms\n")


def _toolkit_contents(out: Contents, spec: PackageSpec, triplet: str) -> None:
    """The NVIDIA Container Toolkit: nvidia-ctk, the runtime and its hook, the CLI, libnvidia-container."""
    v = spec.upstream
    if spec.name == "nvidia-container-toolkit-base":
        out.add("usr/bin/nvidia-ctk", _template("nvidia-ctk", v), 0o755)
        out.add("usr/bin/nvidia-container-runtime", _template("nvidia-container-runtime", v), 0o755)
    elif spec.name == "nvidia-container-toolkit":
        # the prestart hook `docker run --gpus` runs (dockerd registers its GPU driver when this is on its PATH)
        out.add("usr/bin/nvidia-container-runtime-hook", _template("nvidia-container-runtime-hook", v), 0o755)
    elif spec.name == "libnvidia-container-tools":
        out.add("usr/bin/nvidia-container-cli", "#!/bin/sh\n# " + _marker(spec) +
                f"[ \"$1\" = --version ] && {{ echo 'cli-version: {v}'; exit 0; }}\n"
                "echo 'gpuprov lab stand-in: not simulated' >&2\nexit 1\n", 0o755)
    else:
        out.add(f"usr/lib/{triplet}/libnvidia-container.so.{v}", _marker(spec))
        out.links[f"usr/lib/{triplet}/libnvidia-container.so.1"] = f"libnvidia-container.so.{v}"


# every role but the driver's whose stand-in installs more than its marker, and what fills it
_CONTENTS = {"cuda_part": _cuda_contents, "cuda": _cuda_contents, "cuda_compat": _cuda_contents, "nccl": _nccl_contents,
             "container_toolkit": _toolkit_contents, "dcgm": _dcgm_contents, "dcgm_exporter": _dcgm_contents,
             "fabricmanager": _fabric_contents, "nscq": _fabric_contents, "nvlsm": _fabric_contents,
             "kernel_headers": _kernel_contents, "dkms": _kernel_contents}


def control_text(spec: PackageSpec, arch: str, installed_kib: int) -> str:
    """The DEBIAN/control file of a stand-in: its Depends (metapackages on their parts, at exact versions) and,
    for packages of which one version of one branch may be installed, Provides/Conflicts/Replaces of a
    virtual package, so another branch replaces the installed one."""
    what = {"kernel_headers": "gpuprov lab stand-in, not Debian's kernel headers",
            "dkms": "gpuprov lab stand-in, not Debian's dkms"}.get(spec.role, NOT_NVIDIA)
    lines = [f"Package: {spec.name}", f"Version: {spec.version}", f"Architecture: {arch}",
             f"Maintainer: {MAINTAINER}", f"Installed-Size: {installed_kib}", "Section: misc",
             "Priority: optional"]
    if spec.depends:
        lines.append(f"Depends: {', '.join(spec.depends)}")
    virtual = EXCLUSIVE.get(spec.role) or (f"gpuprov-lab-nvidia-{spec.role.removeprefix('driver_')}"
                                           .replace("_", "-") if spec.role.startswith("driver_") else None)
    if virtual:
        lines += [f"Provides: {virtual}", f"Conflicts: {virtual}", f"Replaces: {virtual}"]
    lines += [f"Description: {what}",
              f" Simulates {spec.name} {spec.version} ({spec.role.replace('_', ' ')}) for gpuprov's lab",
              " tests; it installs simulated tools and marker files only."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ build

def deb_filename(spec: PackageSpec, arch: str) -> str:
    return f"{spec.name}_{spec.filename_version}_{arch}.deb"


def inputs_digest(specs: list[PackageSpec], gpu_table: dict, arch: str) -> str:
    """Hash of everything a build depends on: the package set, the templates, the GPU table, this module."""
    digest = hashlib.sha256()
    for spec in specs:
        digest.update(f"{spec.name}\0{spec.version}\0{spec.role}\0{spec.upstream}\0{spec.depends}\n".encode())
    for path in sorted(FILES.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    digest.update(json.dumps(gpu_table, sort_keys=True).encode() + arch.encode())
    return digest.hexdigest()[:16]


def _stage(spec: PackageSpec, contents: Contents, arch: str, root: Path) -> None:
    for rel, (data, mode) in contents.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    for rel, target in contents.links.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    size = sum(len(data) for data, _ in contents.files.values())
    debian = root / "DEBIAN"
    debian.mkdir(parents=True)
    (debian / "control").write_text(control_text(spec, arch, max(1, math.ceil(size / 1024))), encoding="utf-8")
    for name, text in contents.scripts.items():
        (debian / name).write_text(text, encoding="utf-8")
        (debian / name).chmod(0o755)
    for directory in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
        directory.chmod(0o755)


def build_debs(specs: list[PackageSpec], out_dir: Path, gpu_table: dict, arch: str = "amd64") -> list[Path]:
    """Build every stand-in with `dpkg-deb --build --root-owner-group` into `out_dir`. Returns the .deb paths."""
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        raise GpuprovError("dpkg-deb is not installed", step="lab mirror", hint="run: apt-get install -y dpkg")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpuprov-lab-standins-"))

    def build(item: tuple[int, PackageSpec]) -> Path:
        index, spec = item
        root = work / str(index)
        _stage(spec, package_contents(spec, gpu_table, arch), arch, root)
        target = out_dir / deb_filename(spec, arch)
        cmd = [dpkg_deb, "--build", "--root-owner-group", "-Zgzip", "-z1", str(root), str(target)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise GpuprovError(f"dpkg-deb failed for {spec.name} {spec.version}", step="lab mirror",
                               command=" ".join(cmd), output=proc.stdout + proc.stderr,
                               hint="fix the stand-in in gpuprov/lab/standins.py")
        return target

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(build, enumerate(specs)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
