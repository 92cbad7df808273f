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
    bad: list[str] = []
    key, g = _gpu_row(gpu)
    arch = g["arch"]
    drv = _data("drivers")
    cu = _data("cuda")
    if gpus < 1:
        bad.append("gpu count below 1")
    if stack["os"] != os:
        bad.append(f"stack is for {stack['os']}, not {os}")
    if stack["gpu"]["model"] != key or stack["gpu"]["arch"] != arch:
        bad.append(f"stack GPU {stack['gpu']} is not {key}/{arch}")

    branch = stack["driver"]["branch"]
    version = stack["driver"]["version"]
    if version.split(".")[0] != branch:
        bad.append(f"driver {version} is not on branch {branch}")
    row = drv["branches"].get(branch)
    if row is None:
        bad.append(f"unknown driver branch {branch}")
        return bad
    last = drv["architecture_last_branch"].get(arch)
    first = drv["architecture_first_branch"].get(arch)
    if last and int(branch) > int(last):
        bad.append(f"branch {branch} no longer supports {arch}")
    if first and int(branch) < int(first):
        bad.append(f"branch {branch} predates {arch}")
    if g.get("min_driver") and _v(version) < _v(g["min_driver"]):
        bad.append(f"{key} needs driver >= {g['min_driver']}")

    modules = stack["driver"]["kernel_modules"]
    if arch in drv["open_only_architectures"] and modules != "open":
        bad.append(f"{arch} needs the open kernel modules")
    if arch in drv["proprietary_only_architectures"] and modules != "proprietary":
        bad.append(f"{arch} has no GSP: open kernel modules impossible")
    if arch not in drv["open_only_architectures"] + drv["proprietary_only_architectures"]:
        want = "open" if int(branch) >= int(drv["open_modules_default_from"]) else "proprietary"
        if modules != want:
            bad.append(f"branch {branch} default flavor on {arch} is {want}, stack has {modules}")

    cuda = stack["cuda"]["version"]
    minor = ".".join(cuda.split(".")[:2])
    if not _arch_ok(arch, cuda):
        bad.append(f"CUDA {cuda} does not support {arch}")
    native = _v(version) >= _v(_toolkit_driver(cuda))
    if stack["forward_compat"]:
        if native:
            bad.append("forward compatibility set although the driver runs the toolkit natively")
        if not g["datacenter"]:
            bad.append("forward compatibility on a non data center GPU")
        if branch not in cu["forward_compat"].get(minor, []) or row["kind"] not in ("production", "long_term"):
            bad.append(f"cuda-compat-{minor} does not support branch {branch}")
    elif not native:
        bad.append(f"CUDA {cuda} needs driver >= {_toolkit_driver(cuda)}, stack has {version}")

    nccl = stack["nccl"]
    builds = _data("nccl")["releases"].get(nccl["version"], [])
    nccl_cuda = nccl["packages"][0]["version"].split("+cuda")[-1]
    if nccl_cuda not in builds:
        bad.append(f"NCCL {nccl['version']} has no build for CUDA {nccl_cuda}")
    if nccl_cuda.split(".")[0] != minor.split(".")[0] or _v(nccl_cuda) > _v(minor):
        bad.append(f"NCCL build for CUDA {nccl_cuda} does not fit CUDA {cuda}")

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
    fourth = nvswitch and _data("gpus")["nvswitch_generations"].get(arch, 0) >= 4
    if fourth and (nvlsm is None or nvlsm["version"] != str(_data("packages")["nvlsm_version"])):
        bad.append(f"fourth-generation NVSwitch system ({arch}) needs the NVLink Subnet Manager (nvlsm)")
    if not fourth and nvlsm is not None:
        bad.append("nvlsm on a system without fourth-generation NVSwitches")

    tag = stack["ngc_pytorch"]
    if tag:
        t = _data("ngc_pytorch")["tags"][tag.removesuffix("-py3")]
        if not _arch_ok(arch, t["cuda"]):
            bad.append(f"NGC {tag} (CUDA {t['cuda']}) does not support {arch}")
        floor = t["dc_branches"].get(branch)
        if _v(version) < _v(t["min_driver"]) and not (g["datacenter"] and floor and _v(version) >= _v(floor)):
            bad.append(f"NGC {tag} needs driver >= {t['min_driver']}")

    torch = stack["pytorch"]
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
        floor = cu["minor_compat"][wcuda.split(".")[0]]
        if _v(version) < _v(_toolkit_driver(wcuda)) and _v(version) < _v(floor):
            bad.append(f"wheel {wheel} needs driver >= {floor}")

    values = {"branch": branch, "version": version, "modules": modules}
    if stack["driver"]["packages"] != _expected_packages(os, "driver", values):
        bad.append("driver packages do not match the OS's package names/versions")
    if fm and fm["packages"] != _expected_packages(os, "fabricmanager", values):
        bad.append("fabric manager packages do not match the driver version")
    if nscq and nscq["packages"] != _expected_packages(os, "nscq", values):
        bad.append("libnvidia-nscq packages do not match the driver version")
    if nvlsm and nvlsm["packages"] != _expected_packages(os, "nvlsm", {"nvlsm": nvlsm["version"]}):
        bad.append("nvlsm packages do not match the nvlsm release")
    for pkg in stack["nccl"]["packages"]:
        if pkg["version"] != f"{nccl['version']}-1+cuda{nccl_cuda}":
            bad.append(f"NCCL package {pkg} is not at {nccl['version']}")
    return bad
