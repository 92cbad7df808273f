"""The resolver: NVIDIA's compatibility rules (data in `gpuprov/data/`) -> the newest stack that fits, or why not.

Preference: production and long-term driver branches before new-feature branches (NFBs only when pinned or
when nothing else fits), newer before older; then the newest CUDA release the driver runs natively (forward
compatibility only when a pinned CUDA release needs it); then the newest NCCL build for that CUDA, the newest
NGC PyTorch tag and PyTorch wheel the driver can run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date

from gpuprov.catalog import FOURTH_GENERATION, choose, lookup, nvswitch_generation
from gpuprov.core.errors import InputError
from gpuprov.stack.data import (
    OS_KEYS,
    arch_in_cuda,
    at_least,
    branch_of,
    cuda_min_driver,
    cuda_of_wheel,
    cuda_updates,
    minor_of,
    render,
    table,
    vkey,
)
from gpuprov.stack.inputs import PinError, stack_pin

STABLE_KINDS = ("production", "long_term")
KIND_NAMES = {"production": "production branch", "long_term": "long-term support branch",
              "new_feature": "new feature branch"}
_EOL = re.compile(r"(by )?([0-9]{4})-([0-9]{2})")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
# The stack's sections that list packages, in install order.
PACKAGE_SECTIONS = ("driver", "fabricmanager", "nscq", "nvlsm", "cuda", "nccl", "container_toolkit", "dcgm")


class StackConflict(InputError):
    """No stack satisfies every rule; `.conflicts` names each conflicting pair and what would resolve it."""

    def __init__(self, conflicts: list[str]):
        self.conflicts = list(conflicts)
        super().__init__("no stack satisfies every rule:\n  - " + "\n  - ".join(self.conflicts),
                         step="stack.resolve", hint="change one side of each conflict above")

    def to_dict(self) -> dict:
        return {"error": "no stack satisfies every rule", "conflicts": self.conflicts}


@dataclass
class Stack:
    """A resolved stack; `to_dict()` is the JSON contract of docs/design.md."""

    gpu: dict
    os: str
    driver: dict
    cuda: dict
    forward_compat: bool
    nccl: dict
    container_toolkit: dict
    fabricmanager: dict | None
    dcgm: dict
    ngc_pytorch: str | None
    pytorch: dict | None
    nscq: dict | None = None        # NVSwitch systems: libnvidia-nscq at the driver version (DCGM's NVSwitch API)
    nvlsm: dict | None = None       # fourth-generation NVSwitch systems: the NVLink Subnet Manager
    inputs: dict = field(default_factory=dict, compare=False)
    warnings: list[str] = field(default_factory=list, compare=False)   # for stderr; not in to_dict()

    REQUIRED = ("gpu", "os", "driver", "cuda", "forward_compat", "nccl", "container_toolkit", "fabricmanager",
                "dcgm", "ngc_pytorch", "pytorch")
    OPTIONAL = ("nscq", "nvlsm")    # absent from stacks locked before they existed

    def to_dict(self) -> dict:
        return {key: getattr(self, key) for key in (*self.REQUIRED, *self.OPTIONAL)}

    @classmethod
    def from_dict(cls, data: dict) -> Stack:
        missing = [k for k in cls.REQUIRED if k not in data]
        if missing:
            raise InputError(f"stack is missing {', '.join(missing)}", hint="re-create it with invoke stack.lock")
        return cls(**{k: data.get(k) for k in (*cls.REQUIRED, *cls.OPTIONAL)})

    def packages(self) -> list[dict]:
        """Every package of the stack, in install order."""
        parts = [getattr(self, section) for section in PACKAGE_SECTIONS]
        return [pkg for part in parts if part for pkg in part["packages"]]


# ----------------------------------------------------------------------------------------------- inputs

def check_os(os_key: str) -> str:
    if os_key not in OS_KEYS:
        raise InputError(f"unknown OS {os_key!r}. Accepted: {', '.join(OS_KEYS)}",
                         hint="give one of the accepted OS keys")
    return os_key


def _pins(**given) -> dict[str, str | None]:
    """Each stack pin normalized by gpuprov.stack.inputs (None or "" = not pinned); InputError (exit 2) for a
    value gpuprov's data does not have."""
    pins = {}
    for key, value in given.items():
        try:
            pins[key] = None if value in (None, "") else stack_pin(key, value)
        except PinError as exc:
            raise InputError(str(exc)) from None
    return pins


# ----------------------------------------------------------------------------------------------- rules

def kernel_modules(arch: str, branch: str) -> str:
    """NVIDIA's default flavor: open only on Blackwell, proprietary before Turing, open from R560."""
    drv = table("drivers")
    if arch in drv["open_only_architectures"]:
        return "open"
    if arch in drv["proprietary_only_architectures"]:
        return "proprietary"
    return "open" if int(branch) >= int(drv["open_modules_default_from"]) else "proprietary"


def driver_problem(model, branch: str, version: str | None) -> str | None:
    """Why a driver branch (or exact version) cannot drive this GPU, or None."""
    drv = table("drivers")
    row = drv["branches"][branch]
    last = drv["architecture_last_branch"].get(model.arch)
    if last and int(branch) > int(last):
        return (f"{model.key} ({model.arch}) is supported up to driver branch {last}; branch {branch} dropped it. "
                f"Use driver {last} or older.")
    first = drv["architecture_first_branch"].get(model.arch)
    if first and int(branch) < int(first):
        return (f"{model.key} ({model.arch}) needs driver branch {first} or newer; branch {branch} does not "
                f"support it. Use driver {first} or newer.")
    if model.arch in drv["open_only_architectures"] and int(branch) < int(drv["open_modules_first_branch"]):
        return f"{model.key} needs the open kernel modules, which branch {branch} lacks. Use a newer branch."
    effective = version or row["latest"]
    if model.min_driver and not at_least(effective, model.min_driver):
        return (f"{model.key} needs driver >= {model.min_driver}; driver {effective} is older. "
                f"Use {model.min_driver} or newer.")
    return None


def _eol_month(branch: str) -> tuple[date, bool] | None:
    """The first day of a branch's end-of-life month (drivers.yaml `eol`) and whether NVIDIA gave that month
    (False: only listed as end of life by then); None where no NVIDIA page gives one."""
    match = _EOL.fullmatch(str(table("drivers")["branches"][branch].get("eol") or ""))
    if match is None:
        return None
    return date(int(match.group(2)), int(match.group(3)), 1), not match.group(1)


def _month(day: date) -> str:
    return f"{_MONTHS[day.month - 1]} {day.year}"


def supported_branches(today: date, model=None) -> list[str]:
    """Production and long-term support branches not yet at their end of life on `today` that gpuprov can pin (a
    published version) and, given a model, that drive it; newest first."""
    rows = table("drivers")["branches"]
    out = []
    for branch, row in rows.items():
        eol = _eol_month(branch)
        if row["kind"] in STABLE_KINDS and row["versions"] and eol is not None and eol[0] > today and (
                model is None or driver_problem(model, branch, None) is None):
            out.append(branch)
    return sorted(out, key=int, reverse=True)


def driver_eol_warning(branch: str, today: date, model=None) -> str | None:
    """The warning for a pinned driver branch that is past its end of life on `today` (from the first day of its
    end-of-life month, drivers.yaml), naming the date, NVIDIA's page and the supported branches to move to (those
    that drive `model`, given one); None for a branch that is still supported or has no end-of-life date."""
    eol = _eol_month(branch)
    if eol is None or today < eol[0]:
        return None
    drv = table("drivers")
    row = drv["branches"][branch]
    kind = KIND_NAMES.get(row["kind"], "branch of unknown kind")
    when = (f"reached its end of life in {_month(eol[0])}" if eol[1]
            else f"is listed as end of life (by {_month(eol[0])}, no date given)")
    source = drv["eol_sources"][row["eol_source"]]
    moves = [f"R{b} ({KIND_NAMES[drv['branches'][b]['kind']]}, end of life {_month(_eol_month(b)[0])})"
             for b in supported_branches(today, model)]
    advice = (f"pin a supported branch instead: {', '.join(moves)}" if moves else
              "no supported branch in gpuprov's data drives this GPU")
    return (f"driver branch R{branch} ({kind}) {when} per NVIDIA's data center driver support page ({source}): it "
            f"gets no more bug or security fixes; {advice}")


def cuda_arch_problem(model, cuda: str) -> str | None:
    if arch_in_cuda(model.arch, cuda):
        return None
    span = table("cuda")["architectures"][model.arch]
    if vkey(minor_of(cuda)) < vkey(span["first"]):
        return f"CUDA {cuda} predates {model.key} ({model.arch}); it needs CUDA {span['first']} or newer."
    return f"CUDA {cuda} dropped {model.key} ({model.arch}); the last CUDA for it is {span['last']}."


def compat_problem(model, cuda: str, branch: str, version: str, forward_compat: bool) -> str | None:
    """Why CUDA `cuda` cannot run on driver `version` even with forward compatibility, or None if it can."""
    need = cuda_min_driver(cuda)
    head = f"CUDA {cuda} needs driver >= {need}; the driver is {version} (branch {branch})."
    if not model.datacenter:
        return (f"{head} Use driver {branch_of(need)} or newer; forward compatibility cannot work on "
                f"{model.key} (not a data center GPU).")
    listed = table("cuda")["forward_compat"].get(minor_of(cuda), [])
    kind = table("drivers")["branches"][branch]["kind"]
    if branch not in listed or kind not in STABLE_KINDS:
        where = ", ".join(listed) or "none"
        return (f"{head} Use driver {branch_of(need)} or newer; forward compatibility "
                f"(cuda-compat-{minor_of(cuda).replace('.', '-')}) supports only production/long-term branches "
                f"{where}.")
    if not forward_compat:
        return (f"{head} Use driver {branch_of(need)} or newer, or set forward_compat: true "
                f"(cuda-compat-{minor_of(cuda).replace('.', '-')}).")
    return None


def cuda_problem(model, cuda: str, branch: str, version: str, forward_compat: bool) -> tuple[str | None, bool]:
    """(why CUDA cannot run on this GPU+driver or None, whether forward compatibility is needed)."""
    arch = cuda_arch_problem(model, cuda)
    if arch:
        return arch, False
    if at_least(version, cuda_min_driver(cuda)):
        return None, False
    return compat_problem(model, cuda, branch, version, forward_compat), True


def nccl_builds(cuda: str, pin: str | None) -> Iterator[tuple[str, str]]:
    """(nccl version, build CUDA) pairs usable with toolkit `cuda`, best first: builds for exactly this
    CUDA release (newest NCCL first), then builds for an older release of the same major."""
    major, minor = minor_of(cuda).split(".")
    releases = [r for r in sorted(table("nccl")["releases"], key=vkey, reverse=True)
                if not pin or r == pin or r.startswith(pin + ".")]
    exact = [(r, f"{major}.{minor}") for r in releases if f"{major}.{minor}" in table("nccl")["releases"][r]]
    yield from exact
    for release in releases:
        builds = [b for b in table("nccl")["releases"][release]
                  if b.split(".")[0] == major and int(b.split(".")[1]) < int(minor)]
        if builds:
            yield release, max(builds, key=vkey)


def ngc_problem(model, tag: str, branch: str, version: str) -> tuple[str | None, bool]:
    """(why the NGC tag cannot run here or None, whether it runs natively)."""
    row = table("ngc_pytorch")["tags"][tag]
    arch = cuda_arch_problem(model, row["cuda"])
    if arch:
        return f"NGC PyTorch {tag}-py3 is built on CUDA {row['cuda']}: {arch}", False
    if at_least(version, row["min_driver"]):
        return None, True
    floor = row["dc_branches"].get(branch)
    if model.datacenter and floor and at_least(version, floor):
        return None, False
    return (f"NGC PyTorch {tag}-py3 needs driver >= {row['min_driver']}"
            + (f" (on data center GPUs also branches {', '.join(row['dc_branches'])})" if row["dc_branches"] else "")
            + f"; the driver is {version}. Use a newer driver or an older NGC tag."), False


def wheel_problem(model, variant: str, cuda: str, version: str) -> str | None:
    wheel_cuda = cuda_of_wheel(variant)
    if vkey(wheel_cuda) > vkey(minor_of(cuda)):
        return f"PyTorch wheel {variant} is newer than the stack's CUDA {cuda}."
    arch = cuda_arch_problem(model, wheel_cuda)
    if arch:
        return f"PyTorch wheel {variant}: {arch}"
    floor = table("cuda")["minor_compat"][wheel_cuda.split(".")[0]]
    if at_least(version, cuda_min_driver(wheel_cuda)) or at_least(version, floor):
        return None
    return f"PyTorch wheel {variant} needs driver >= {floor} (CUDA {wheel_cuda}); the driver is {version}."


def pytorch_choice(model, release: str, cuda: str, version: str) -> tuple[str | None, str | None]:
    """(best wheel variant or None, the reason of the last rejection)."""
    reason = None
    variants = table("pytorch_wheels")["releases"][release]
    for variant in sorted(variants, key=lambda v: vkey(cuda_of_wheel(v)), reverse=True):
        reason = wheel_problem(model, variant, cuda, version)
        if reason is None:
            return variant, None
    return None, f"PyTorch {release} ({', '.join(variants)}): {reason}"


# ----------------------------------------------------------------------------------------------- search

def _driver_candidates(model, pin: tuple[str, str | None] | None) -> list[tuple[str, str]]:
    branches = table("drivers")["branches"]
    if pin:
        branch, version = pin
        return [(branch, version or branches[branch]["latest"])]
    rows = [(b, r["latest"]) for b, r in branches.items() if r["latest"]]
    rows.sort(key=lambda br: (branches[br[0]]["kind"] in STABLE_KINDS, int(br[0])), reverse=True)
    return [(b, v) for b, v in rows if driver_problem(model, b, v) is None]


def _cuda_candidates(pin: str | None) -> list[str]:
    if pin:
        return [pin]
    releases = sorted(table("cuda")["releases"], key=vkey, reverse=True)
    return [max(cuda_updates(m), key=vkey) for m in releases]


def _packages(os_key: str, component: str, **values) -> list[dict]:
    data = table("packages")
    osrow = data["os"][os_key]
    fam = data["families"][osrow["family"]]
    values = {"rev": osrow.get("rev", ""), "el": osrow.get("el", ""), **values}
    if component == "driver":
        unversioned = osrow["family"] == "debian" and int(values["branch"]) >= int(data["unversioned_driver_from"])
        return render(fam["driver_unversioned" if unversioned else "driver"][values["modules"]], **values)
    if component in ("fabricmanager", "nscq"):
        unversioned = int(values["branch"]) >= int(data["unversioned_fabric_from"])
        return render(fam[f"{component}_unversioned" if unversioned else component], **values)
    return render(fam[component], **values)


def driver_module_stream(os_key: str, branch: str, modules: str) -> str | None:
    """The dnf module stream for a driver on RHEL-family OSes (e.g. "nvidia-driver:570-open"), else None."""
    fam = table("packages")["families"][table("packages")["os"][check_os(os_key)]["family"]]
    stream = fam.get("driver_module_stream")
    return stream[modules].format(branch=branch) if stream else None


def _build(model, os_key, branch, version, cuda, compat, nccl, ngc, wheel, nvswitch) -> Stack:
    modules = kernel_modules(model.arch, branch)
    cuda_dash = minor_of(cuda).replace(".", "-")
    cuda_pkgs = _packages(os_key, "cuda", cuda_dash=cuda_dash, cuda_full=cuda)
    if compat:
        cuda_pkgs += _packages(os_key, "cuda_compat", cuda_dash=cuda_dash, compat_driver=cuda_min_driver(cuda))
    major = cuda.split(".")[0]
    ctk = max(table("container_toolkit")["releases"], key=vkey)
    dcgm = max((v for v, r in table("dcgm")["releases"].items() if major in r["cuda_majors"]), key=vkey)
    fabric = nscq = nvlsm = None
    if nvswitch:
        fabric = {"version": version,
                  "packages": _packages(os_key, "fabricmanager", branch=branch, version=version)}
        nscq = {"version": version, "packages": _packages(os_key, "nscq", branch=branch, version=version)}
    if nvswitch and (nvswitch_generation(model.arch) or 0) >= FOURTH_GENERATION:
        release = str(table("packages")["nvlsm_version"])
        nvlsm = {"version": release, "packages": _packages(os_key, "nvlsm", nvlsm=release)}
    return Stack(
        gpu={"model": model.key, "arch": model.arch, "compute_capability": model.compute_capability,
             "datacenter": model.datacenter},
        os=os_key,
        driver={"branch": branch, "version": version, "kernel_modules": modules,
                "packages": _packages(os_key, "driver", branch=branch, version=version, modules=modules)},
        cuda={"version": cuda, "packages": cuda_pkgs},
        forward_compat=compat,
        nccl={"version": nccl[0], "packages": _packages(os_key, "nccl", nccl=nccl[0], nccl_cuda=nccl[1])},
        container_toolkit={"version": ctk, "packages": _packages(os_key, "container_toolkit", ctk=ctk)},
        fabricmanager=fabric,
        dcgm={"version": dcgm, "packages": _packages(os_key, "dcgm", dcgm=dcgm, major=major)},
        ngc_pytorch=f"{ngc}-py3" if ngc else None,
        pytorch={"version": wheel[0], "wheel": wheel[1]} if wheel else None,
        nscq=nscq,
        nvlsm=nvlsm,
    )


def _choose_ngc(model, pin, branch, version) -> tuple[str | None, str | None]:
    tags = sorted(table("ngc_pytorch")["tags"], key=vkey, reverse=True)
    if pin:
        problem, _ = ngc_problem(model, pin, branch, version)
        return (None, problem) if problem else (pin, None)
    fits = [(t, ngc_problem(model, t, branch, version)) for t in tags]
    native = [t for t, (p, nat) in fits if p is None and nat]
    compat = [t for t, (p, _) in fits if p is None]
    return (native or compat or [None])[0], None


def _choose_pytorch(model, pin, cuda, version) -> tuple[tuple[str, str] | None, str | None]:
    releases = [pin] if pin else sorted(table("pytorch_wheels")["releases"], key=vkey, reverse=True)
    reason = None
    for release in releases:
        variant, reason = pytorch_choice(model, release, cuda, version)
        if variant:
            return (release, variant), None
    return None, (reason if pin else None)


def _pin_conflicts(model, drv_pin, cuda_pin, nccl_pin, ngc_pin, torch_pin, nvswitch, forward_compat) -> list[str]:
    """Conflicts visible between pinned inputs alone, each naming both sides and a way out."""
    out = []
    if nvswitch and not model.nvswitch_capable:
        out.append(f"nvswitch is set but {model.key} ({model.form_factor}) is never on an NVSwitch baseboard. "
                   f"Drop nvswitch or fix the GPU model.")
    if drv_pin:
        problem = driver_problem(model, *drv_pin)
        if problem:
            out.append(problem + " (the inventory/argument pins driver " + (drv_pin[1] or drv_pin[0]) + ")")
    if cuda_pin:
        problem = cuda_arch_problem(model, cuda_pin)
        if problem:
            out.append(problem + f" (CUDA {cuda_pin} is pinned)")
        elif drv_pin and not out:
            version = drv_pin[1] or table("drivers")["branches"][drv_pin[0]]["latest"]
            problem, _ = cuda_problem(model, cuda_pin, drv_pin[0], version, forward_compat)
            if problem:
                out.append(problem.replace("the driver is", f"the driver pin {drv_pin[1] or drv_pin[0]} gives"))
        if nccl_pin and not list(nccl_builds(cuda_pin, nccl_pin)):
            builds = ", ".join(b for r, bs in table("nccl")["releases"].items()
                               if r.startswith(nccl_pin) for b in bs)
            out.append(f"NCCL {nccl_pin} has no build for CUDA {cuda_pin} (builds: {builds or 'none'}). "
                       f"Pin another NCCL or CUDA release.")
    if ngc_pin:
        arch = cuda_arch_problem(model, table("ngc_pytorch")["tags"][ngc_pin]["cuda"])
        if arch:
            out.append(f"NGC PyTorch {ngc_pin}-py3: {arch} Pick another NGC tag.")
        elif drv_pin and not any(drv_pin[0] in p for p in out):
            version = drv_pin[1] or table("drivers")["branches"][drv_pin[0]]["latest"]
            problem, _ = ngc_problem(model, ngc_pin, drv_pin[0], version)
            if problem:
                out.append(problem + f" (driver {drv_pin[1] or drv_pin[0]} is pinned)")
    if torch_pin:
        variants = table("pytorch_wheels")["releases"][torch_pin]
        if all(cuda_arch_problem(model, cuda_of_wheel(v)) for v in variants):
            out.append(f"PyTorch {torch_pin} wheels ({', '.join(variants)}) do not support {model.key} "
                       f"({model.arch}). Pick another PyTorch release.")
        elif cuda_pin and all(vkey(cuda_of_wheel(v)) > vkey(minor_of(cuda_pin)) for v in variants):
            out.append(f"PyTorch {torch_pin} wheels ({', '.join(variants)}) all need a CUDA newer than the pinned "
                       f"CUDA {cuda_pin}. Pin a newer CUDA or an older PyTorch.")
    return out


def resolve(gpu: str, os: str, gpus: int = 1, nvswitch: bool = False, cuda=None, driver=None, pytorch=None,
            ngc=None, nccl=None, forward_compat: bool = False, today: date | None = None) -> Stack:
    """The newest stack for `gpus` x `gpu` on `os` meeting every pin, or StackConflict naming what clashes. The
    stack's `warnings`: the model taken for an ambiguous GPU name, a pinned driver branch past its end of life on
    `today` (default: the current date)."""
    choice = choose(gpu)
    model = choice.model
    os_key = check_os(os)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise InputError(f"gpus must be a positive whole number, not {gpus!r}")
    pins = _pins(cuda=cuda, driver=driver, pytorch=pytorch, ngc=ngc, nccl=nccl)
    cuda_pin, torch_pin, ngc_pin, nccl_pin = pins["cuda"], pins["pytorch"], pins["ngc"], pins["nccl"]
    exact = pins["driver"] if pins["driver"] and "." in pins["driver"] else None
    drv_pin = (branch_of(pins["driver"]), exact) if pins["driver"] else None
    if cuda_pin and cuda_pin.count(".") == 1:
        cuda_pin = max(cuda_updates(cuda_pin), key=vkey)

    conflicts = _pin_conflicts(model, drv_pin, cuda_pin, nccl_pin, ngc_pin, torch_pin, bool(nvswitch),
                               bool(forward_compat))
    if conflicts:
        raise StackConflict(conflicts)

    reasons: list[str] = []
    for branch, version in _driver_candidates(model, drv_pin):
        for cuda_version in _cuda_candidates(cuda_pin):
            problem, compat = cuda_problem(model, cuda_version, branch, version, bool(forward_compat))
            if problem:
                reasons.append(problem)
                continue
            nccl_choice = next(nccl_builds(cuda_version, nccl_pin), None)
            if nccl_choice is None:
                reasons.append(f"NCCL {nccl_pin or ''} has no build for CUDA {cuda_version}.".replace("  ", " "))
                continue
            ngc_tag, ngc_reason = _choose_ngc(model, ngc_pin, branch, version)
            wheel, wheel_reason = _choose_pytorch(model, torch_pin, cuda_version, version)
            if ngc_reason or wheel_reason:
                reasons.append(ngc_reason or wheel_reason)
                continue
            stack = _build(model, os_key, branch, version, cuda_version, compat, nccl_choice, ngc_tag, wheel,
                           bool(nvswitch))
            stack.inputs = {"gpu": model.key, "os": os_key, "gpus": gpus, "nvswitch": bool(nvswitch),
                            "cuda": cuda, "driver": driver, "pytorch": pytorch, "ngc": ngc, "nccl": nccl,
                            "forward_compat": bool(forward_compat)}
            eol = driver_eol_warning(branch, today or date.today(), model) if drv_pin else None
            stack.warnings = [w for w in (choice.warning(), eol) if w]
            return stack
    unique = list(dict.fromkeys(reasons))[:6] or [f"no driver branch in gpuprov's data supports {model.key}."]
    raise StackConflict(unique)


def facts_nvswitch(facts: dict, gpu: str | None) -> bool | None:
    """Whether the facts show NVSwitches, or None when they cannot tell: no GPU in the PCI scan (lspci
    missing, a VM without passthrough), or fourth-generation NVSwitches, which are no PCI devices
    (gpus.yaml). Then the inventory's hardware.nvswitch decides."""
    if facts.get("nvswitch_count"):
        return True
    if facts.get("nvswitch_count") is None or not facts.get("pci_gpus") or not gpu:
        return None
    generation = nvswitch_generation(lookup(gpu).arch)
    return None if generation is not None and generation >= FOURTH_GENERATION else False


def resolve_for_host(host_vars: dict, os_key: str | None, facts: dict | None = None,
                     today: date | None = None) -> Stack:
    """Resolve from an inventory host's `hardware` and `stack` vars; gathered facts override the hardware. The
    stack's warnings as resolve's (`today` for the end-of-life check)."""
    from gpuprov.catalog import by_pci_id

    hardware = dict(host_vars.get("hardware") or {})
    pins = dict(host_vars.get("stack") or {})
    if facts:
        found = {g.get("model") or (by_pci_id(g.get("device_id", "")) or type("", (), {"key": None})).key
                 for g in facts.get("pci_gpus") or []}
        found.discard(None)
        if len(found) > 1:
            raise InputError(f"host has mixed GPU models {sorted(found)}; gpuprov resolves one stack per model",
                             host=facts.get("host"), step="stack.resolve")
        if found:
            hardware["gpu"] = found.pop()
            hardware["count"] = len(facts.get("pci_gpus") or [])
        seen = facts_nvswitch(facts, hardware.get("gpu"))
        if seen is not None:
            hardware["nvswitch"] = seen
        os_key = os_key or (facts.get("os") or {}).get("key")
    if not hardware.get("gpu"):
        raise InputError("no GPU model: set hardware.gpu in the inventory or gather facts from the host",
                         step="stack.resolve")
    if not os_key:
        raise InputError("no OS key: the host's OS is unknown", step="stack.resolve",
                         hint=f"supported: {', '.join(OS_KEYS)}")
    unknown = sorted(set(pins) - {"cuda", "driver", "pytorch", "ngc", "nccl", "forward_compat"})
    if unknown:
        raise InputError(f"unknown stack variables {unknown}", step="stack.resolve",
                         hint="accepted: cuda, driver, pytorch, ngc, nccl, forward_compat")
    return resolve(hardware["gpu"], os_key, gpus=int(hardware.get("count") or 1),
                   nvswitch=bool(hardware.get("nvswitch", False)), cuda=pins.get("cuda"),
                   driver=pins.get("driver"), pytorch=pins.get("pytorch"), ngc=pins.get("ngc"),
                   nccl=pins.get("nccl"), forward_compat=bool(pins.get("forward_compat", False)), today=today)
