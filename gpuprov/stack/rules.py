"""An independent checker of a resolved stack: every rule re-derived from the data, no resolver code.

Used by the property tests (every stack the resolver returns must pass) and by `stack.check` on lock files.
"""

from __future__ import annotations

import yaml

from gpuprov.stack.data import DATA_DIR


def _load(name: str) -> dict:
    with open(DATA_DIR / f"{name}.yaml", encoding="utf-8") as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


_CACHE: dict[str, dict] = {}


def _data(name: str) -> dict:
    if name not in _CACHE:
        _CACHE[name] = _load(name)
    return _CACHE[name]


def _v(text) -> tuple[int, ...]:
    return tuple(int(x) for x in str(text).split("."))


def _gpu_row(gpu: str) -> tuple[str, dict]:
    for key, row in _data("gpus")["models"].items():
        names = [key, *row["names"], *row.get("aliases", [])]
        if gpu.casefold() in (n.casefold() for n in names):
            return key, row
    raise KeyError(gpu)


def _arch_ok(arch: str, cuda: str) -> bool:
    span = _data("cuda")["architectures"][arch]
    mm = _v(cuda)[:2]
    return _v(span["first"]) <= mm and ("last" not in span or mm <= _v(span["last"]))


def _toolkit_driver(cuda: str) -> str:
    """Table 3 driver for X.Y.Z, or for X.Y its GA (the most lenient reading, used for wheels)."""
    updates = _data("cuda")["releases"][".".join(cuda.split(".")[:2])]["updates"]
    return updates[cuda] if cuda in updates else min(updates.values(), key=_v)


def _expected_packages(os_key: str, component: str, values: dict) -> list[dict]:
    pk = _data("packages")
    osrow = pk["os"][os_key]
    fam = pk["families"][osrow["family"]]
    values = {"rev": osrow.get("rev", ""), "el": osrow.get("el", ""), **values}
    key = component
    if component == "driver" and osrow["family"] == "debian" \
            and int(values["branch"]) >= int(pk["unversioned_driver_from"]):
        key = "driver_unversioned"
    if component in ("fabricmanager", "nscq") and int(values["branch"]) >= int(pk["unversioned_fabric_from"]):
        key = component + "_unversioned"
    group = fam[key]
    if component == "driver":
        group = group[values["modules"]]
    return [{"name": t["name"].format(**values), "version": t["version"].format(**values)} for t in group]


def check_stack(stack: dict, gpu: str, os: str, nvswitch: bool, gpus: int = 1) -> list[str]:
    """Every rule the stack breaks (empty when it is valid for `gpus` x `gpu` on `os`)."""
    key, g = _gpu_row(gpu)
    bad = _target_rules(stack, key, g, os, gpus)
    branch = stack["driver"]["branch"]
    version = stack["driver"]["version"]
    if version.split(".")[0] != branch:
        bad.append(f"driver {version} is not on branch {branch}")
    row = _data("drivers")["branches"].get(branch)
    if row is None:
        bad.append(f"unknown driver branch {branch}")
        return bad
    bad += _driver_rules(key, g, branch, version)
    bad += _module_rules(g["arch"], branch, stack["driver"]["kernel_modules"])
    bad += _cuda_rules(stack, g, row, branch, version)
    bad += _nccl_rules(stack["nccl"], stack["cuda"]["version"])
    bad += _nvswitch_rules(stack, key, g, nvswitch, version)
    bad += _ngc_rules(stack["ngc_pytorch"], g, branch, version)
    bad += _pytorch_rules(stack["pytorch"], g["arch"], version, _minor(stack["cuda"]["version"]))
    bad += _package_rules(stack, os, branch, version)
    return bad


def _minor(cuda: str) -> str:
    """X.Y of a CUDA version."""
    return ".".join(cuda.split(".")[:2])


def _nccl_cuda(nccl: dict) -> str:
    """The CUDA version the stack's NCCL packages were built for."""
    return nccl["packages"][0]["version"].split("+cuda")[-1]


def _target_rules(stack: dict, key: str, g: dict, os: str, gpus: int) -> list[str]:
    """The stack is for this OS and GPU, and there is a GPU."""
    bad = []
    if gpus < 1:
        bad.append("gpu count below 1")
    if stack["os"] != os:
        bad.append(f"stack is for {stack['os']}, not {os}")
    if stack["gpu"]["model"] != key or stack["gpu"]["arch"] != g["arch"]:
        bad.append(f"stack GPU {stack['gpu']} is not {key}/{g['arch']}")
    return bad


def _driver_rules(key: str, g: dict, branch: str, version: str) -> list[str]:
    """The driver branch supports the GPU's architecture and the version is new enough for the GPU."""
    drv = _data("drivers")
    arch = g["arch"]
    bad = []
    last = drv["architecture_last_branch"].get(arch)
    first = drv["architecture_first_branch"].get(arch)
    if last and int(branch) > int(last):
        bad.append(f"branch {branch} no longer supports {arch}")
    if first and int(branch) < int(first):
        bad.append(f"branch {branch} predates {arch}")
    if g.get("min_driver") and _v(version) < _v(g["min_driver"]):
        bad.append(f"{key} needs driver >= {g['min_driver']}")
    return bad


def _module_rules(arch: str, branch: str, modules: str) -> list[str]:
    """The kernel module flavour is the one the architecture needs, or the branch's default for it."""
    drv = _data("drivers")
    bad = []
    if arch in drv["open_only_architectures"] and modules != "open":
        bad.append(f"{arch} needs the open kernel modules")
    if arch in drv["proprietary_only_architectures"] and modules != "proprietary":
        bad.append(f"{arch} has no GSP: open kernel modules impossible")
    if arch not in drv["open_only_architectures"] + drv["proprietary_only_architectures"]:
        want = "open" if int(branch) >= int(drv["open_modules_default_from"]) else "proprietary"
        if modules != want:
            bad.append(f"branch {branch} default flavor on {arch} is {want}, stack has {modules}")
    return bad


def _cuda_rules(stack: dict, g: dict, row: dict, branch: str, version: str) -> list[str]:
    """CUDA supports the architecture and runs on the driver, natively or (only then) by forward compatibility."""
    cuda = stack["cuda"]["version"]
    minor = _minor(cuda)
    bad = []
    if not _arch_ok(g["arch"], cuda):
        bad.append(f"CUDA {cuda} does not support {g['arch']}")
    native = _v(version) >= _v(_toolkit_driver(cuda))
    if stack["forward_compat"]:
        if native:
            bad.append("forward compatibility set although the driver runs the toolkit natively")
        if not g["datacenter"]:
            bad.append("forward compatibility on a non data center GPU")
        if branch not in _data("cuda")["forward_compat"].get(minor, []) \
                or row["kind"] not in ("production", "long_term"):
            bad.append(f"cuda-compat-{minor} does not support branch {branch}")
    elif not native:
        bad.append(f"CUDA {cuda} needs driver >= {_toolkit_driver(cuda)}, stack has {version}")
    return bad


def _nccl_rules(nccl: dict, cuda: str) -> list[str]:
    """NCCL has a build for the CUDA its packages name, and that CUDA fits the stack's."""
    minor = _minor(cuda)
    builds = _data("nccl")["releases"].get(nccl["version"], [])
    nccl_cuda = _nccl_cuda(nccl)
    bad = []
    if nccl_cuda not in builds:
        bad.append(f"NCCL {nccl['version']} has no build for CUDA {nccl_cuda}")
    if nccl_cuda.split(".")[0] != minor.split(".")[0] or _v(nccl_cuda) > _v(minor):
        bad.append(f"NCCL build for CUDA {nccl_cuda} does not fit CUDA {cuda}")
    return bad


def _nvswitch_rules(stack: dict, key: str, g: dict, nvswitch: bool, version: str) -> list[str]:
    """Fabric manager, NSCQ and nvlsm exactly where NVSwitches (of the fourth generation for nvlsm) are."""
    bad = []
    fm = stack["fabricmanager"]
    if nvswitch and (fm is None or fm["version"] != version):
        bad.append("NVSwitch system needs fabric manager at exactly the driver version")
    if not nvswitch and fm is not None:
        bad.append("fabric manager on a system without NVSwitch")
    if nvswitch and not g["nvswitch_capable"]:
        bad.append(f"{key} is never on an NVSwitch baseboard")
    nscq = stack.get("nscq")
    if nvswitch and (nscq is None or nscq["version"] != version):
        bad.append("NVSwitch system needs libnvidia-nscq at exactly the driver version (DCGM)")
    if not nvswitch and nscq is not None:
        bad.append("libnvidia-nscq on a system without NVSwitch")
    nvlsm = stack.get("nvlsm")
    fourth = nvswitch and _data("gpus")["nvswitch_generations"].get(g["arch"], 0) >= 4
    if fourth and (nvlsm is None or nvlsm["version"] != str(_data("packages")["nvlsm_version"])):
        bad.append(f"fourth-generation NVSwitch system ({g['arch']}) needs the NVLink Subnet Manager (nvlsm)")
    if not fourth and nvlsm is not None:
        bad.append("nvlsm on a system without fourth-generation NVSwitches")
    return bad


def _ngc_rules(tag: str | None, g: dict, branch: str, version: str) -> list[str]:
    """The NGC PyTorch container (if any) supports the architecture and runs on the driver."""
    bad = []
    if tag:
        t = _data("ngc_pytorch")["tags"][tag.removesuffix("-py3")]
        if not _arch_ok(g["arch"], t["cuda"]):
            bad.append(f"NGC {tag} (CUDA {t['cuda']}) does not support {g['arch']}")
        floor = t["dc_branches"].get(branch)
        if _v(version) < _v(t["min_driver"]) and not (g["datacenter"] and floor and _v(version) >= _v(floor)):
            bad.append(f"NGC {tag} needs driver >= {t['min_driver']}")
    return bad


def _pytorch_rules(torch: dict | None, arch: str, version: str, minor: str) -> list[str]:
    """The PyTorch wheel (if any) exists, supports the architecture, fits CUDA `minor` and runs on the driver."""
    bad = []
    if torch:
        variants = _data("pytorch_wheels")["releases"].get(torch["version"], [])
        wheel = torch["wheel"]
        wcuda = f"{wheel[2:-1]}.{wheel[-1]}"
        if wheel not in variants:
            bad.append(f"PyTorch {torch['version']} has no {wheel} wheel")
        if not _arch_ok(arch, wcuda):
            bad.append(f"wheel {wheel} does not support {arch}")
        if _v(wcuda) > _v(minor):
            bad.append(f"wheel {wheel} is newer than CUDA {minor}")
        floor = _data("cuda")["minor_compat"][wcuda.split(".")[0]]
        if _v(version) < _v(_toolkit_driver(wcuda)) and _v(version) < _v(floor):
            bad.append(f"wheel {wheel} needs driver >= {floor}")
    return bad


def _package_rules(stack: dict, os: str, branch: str, version: str) -> list[str]:
    """Every component's packages are the OS's names at the versions the stack names."""
    values = {"branch": branch, "version": version, "modules": stack["driver"]["kernel_modules"]}
    fm, nscq, nvlsm, nccl = stack["fabricmanager"], stack.get("nscq"), stack.get("nvlsm"), stack["nccl"]
    bad = []
    if stack["driver"]["packages"] != _expected_packages(os, "driver", values):
        bad.append("driver packages do not match the OS's package names/versions")
    if fm and fm["packages"] != _expected_packages(os, "fabricmanager", values):
        bad.append("fabric manager packages do not match the driver version")
    if nscq and nscq["packages"] != _expected_packages(os, "nscq", values):
        bad.append("libnvidia-nscq packages do not match the driver version")
    if nvlsm and nvlsm["packages"] != _expected_packages(os, "nvlsm", {"nvlsm": nvlsm["version"]}):
        bad.append("nvlsm packages do not match the nvlsm release")
    for pkg in nccl["packages"]:
        if pkg["version"] != f"{nccl['version']}-1+cuda{_nccl_cuda(nccl)}":
            bad.append(f"NCCL package {pkg} is not at {nccl['version']}")
    return bad
