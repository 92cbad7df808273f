"""The data every operation shares: the change it proposes, the repository spec, the context it reads.

Operations are pure: facts + stack + repository spec in, `Change`s out. Nothing here touches a host.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field

from gpuprov.errors import GpuprovError, InputError, mask_credentials
from gpuprov.ops.pkg import VERSIONLOCK_LIST, Package, PackageManager, for_family

q = shlex.quote


@dataclass(frozen=True)
class Change:
    """One step that moves a host toward the desired state."""

    component: str
    summary: str
    commands: tuple[str, ...]
    reboot: bool = False
    diff: str | None = None
    disruptive: str | None = None       # what running work it would interrupt ("driver change", ...)
    requires: str | None = None         # the component whose change this one completes (refused with it)


@dataclass(frozen=True)
class RepoSpec:
    """Where packages come from: NVIDIA's CUDA repository or an inventory mirror of it."""

    url: str
    key_url: str | None
    key_data: str | None
    fingerprint: str | None
    proxy: str | None = None
    ca_pem: str | None = None
    label: str | None = None            # the repository's Release `Label:` (apt pins the repository by it)


@dataclass(frozen=True)
class OpContext:
    """What an operation reads: host facts, the resolved stack, the repository."""

    host: str
    facts: dict
    stack: dict
    repo: RepoSpec
    lock_timeout: int = 300
    host_vars: dict = field(default_factory=dict)

    @property
    def family(self) -> str:
        family = (self.facts.get("os") or {}).get("family")
        if family not in ("debian", "rhel"):
            raise GpuprovError(f"unsupported operating system family {family!r}", host=self.host,
                               step="plan", hint="gpuprov provisions Debian/Ubuntu and RHEL-family hosts only")
        return family

    @property
    def pm(self) -> PackageManager:
        return for_family(self.family, self.lock_timeout)

    def file(self, path: str) -> str | None:
        """Current content of a managed file (None when absent)."""
        return (self.facts.get("files") or {}).get(path)

    def installed(self, name: str) -> str | None:
        return (self.facts.get("packages") or {}).get(name)

    def service(self, name: str) -> dict:
        return (self.facts.get("services") or {}).get(name) or {}

    def error(self, component: str, message: str, hint: str) -> GpuprovError:
        return GpuprovError(message, host=self.host, step=component, hint=hint)


# True on the host when the installed driver answers: NVML works only when the loaded kernel module
# matches the installed library (on a host that had no driver, nvidia-smi loads the new module itself).
DRIVER_ANSWERS = "nvidia-smi -L >/dev/null 2>&1"


def driver_pending(ctx: OpContext) -> bool:
    """True while the loaded kernel module is not the stack's driver (a reboot is still to come)."""
    return ctx.facts.get("loaded_driver_version") != ctx.stack["driver"]["version"]


def service_change(ctx: OpContext, component: str, service: str, state: dict | None) -> Change | None:
    """Enable a driver-bound service; start it too unless the stack's driver is still to be loaded."""
    state = state or {}
    pending = driver_pending(ctx)
    if state.get("enabled") and (state.get("active") or pending):
        return None
    if pending:
        return Change(component, f"enable {service} (started now if the new driver already answers, "
                      "else with it after the reboot)",
                      (f"systemctl enable {service}", f"if {DRIVER_ANSWERS}; then systemctl start {service}; fi"))
    return Change(component, f"enable and start {service}", (f"systemctl enable --now {service}",))


def stack_packages(ctx: OpContext, section: str) -> list[Package]:
    """The exact packages of one stack section (`[]` when the section is null)."""
    entry = ctx.stack.get(section)
    if entry is None:
        return []
    try:
        return [Package(str(p["name"]), str(p["version"])) for p in entry["packages"]]
    except (KeyError, TypeError) as exc:
        raise InputError(f"stack section {section!r} has no valid package list ({exc})", host=ctx.host,
                         step=section, hint="re-resolve the stack (invoke stack.resolve)") from None


def at_version(ctx: OpContext, pkg: Package) -> bool:
    """Whether the package is installed at exactly the wanted version."""
    return ctx.pm.same_version(ctx.installed(pkg.name), pkg.version)


def locked(ctx: OpContext) -> dict[str, set[str]]:
    """Held packages: apt holds (facts["held"]) or dnf versionlock entries (name -> versions)."""
    if ctx.family == "debian":
        return {name: set() for name in ctx.facts.get("held") or []}
    return parse_versionlock(ctx.file(VERSIONLOCK_LIST) or "")


def parse_versionlock(text: str) -> dict[str, set[str]]:
    """`name-[epoch:]version-release.arch|*` lines -> {name: {"version-release"}} (exclusions skipped)."""
    entries: dict[str, set[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        parts = line.rsplit("-", 2)
        if len(parts) != 3:
            continue
        name, version, release = parts
        release = re.sub(r"\.(\*|x86_64|aarch64|noarch|i686)$", "", release)
        entries.setdefault(name, set()).add(f"{version.split(':')[-1]}-{release}")
    return entries


def package_change(ctx: OpContext, component: str, wanted: list[Package], *,
                   remove: tuple[str, ...] = (), reboot: bool = False, unhold: tuple[str, ...] = (),
                   first: tuple[str, ...] = ()) -> Change | None:
    """Install `wanted` at exact versions (and drop `remove`), unholding what moves and `unhold`; None when
    in state. Packages named in `first` are installed in a transaction of their own before the rest."""
    missing = [p for p in wanted if not at_version(ctx, p)]
    remove = tuple(name for name in remove if ctx.installed(name) is not None)
    if not missing and not remove:
        return None
    pm = ctx.pm
    held = locked(ctx)
    moving = {p.name for p in missing} | set(remove) | set(unhold)
    commands = [pm.update()]
    if moving & set(held):
        commands.append(pm.unhold(sorted(moving & set(held))))
    early = [p for p in missing if p.name in first]
    rest = [p for p in missing if p.name not in first]
    if early:
        commands.extend(pm.install(early))
    if rest or remove:
        commands.extend(pm.install(rest, remove=remove))
    parts = [f"install {pm.spec(p)} (installed: {ctx.installed(p.name) or 'none'})" for p in missing]
    parts += [f"remove {name} {ctx.installed(name)}" for name in remove]
    return Change(component, "; ".join(parts), tuple(commands), reboot=reboot)


# Name prefixes of the NVIDIA driver's packages (deb and rpm): what a driver metapackage pulls in, whatever it is
# (libnvidia-compute-570, nvidia-firmware-570-570.148.08, xserver-xorg-video-nvidia-570, libnvidia-egl-wayland1,
# kmod-nvidia-open-dkms, xorg-x11-nvidia...). The unattended-upgrades blacklist keeps away the same names.
DRIVER_FAMILIES = ("nvidia-", "libnvidia-", "cuda-drivers", "libcuda", "libxnvctrl", "xserver-xorg-video-nvidia",
                   "kmod-nvidia", "xorg-x11-nvidia")


def driver_packages(packages: dict[str, str]) -> list[str]:
    """The installed packages of the driver families (`packages`: name -> version, as facts list them)."""
    return sorted(name for name in packages if name.startswith(DRIVER_FAMILIES))


def driver_moves(ctx: OpContext) -> bool:
    """Whether this plan installs driver packages (the set built from the driver is then known only later)."""
    return any(not at_version(ctx, pkg) for pkg in stack_packages(ctx, "driver"))


def unified_diff(path: str, old: str | None, new: str | None) -> str:
    return "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
        fromfile=path if old is not None else "/dev/null", tofile=path if new is not None else "/dev/null"))


def write_file(path: str, content: str, mode: str = "0644") -> str:
    """Atomic write: the whole content to a temporary file beside the target, then rename. The temporary
    file is created readable by root only (it may hold credentials) and gets `mode` before the rename."""
    tmp = f"{path}.gpuprov.tmp"
    directory = path.rsplit("/", 1)[0] or "/"
    return (f"mkdir -p {q(directory)} && (umask 077 && printf %s {q(content)} > {q(tmp)}) && chmod {mode} {q(tmp)} "
            f"&& mv -f {q(tmp)} {q(path)}")


def file_change(ctx: OpContext, component: str, path: str, content: str | None, what: str, *,
                then: tuple[str, ...] = (), reboot: bool = False, mode: str = "0644") -> Change | None:
    """Make a managed file hold `content` (None: absent); `then` runs after the write. None when in state.

    The diff shows both versions with every secret masked."""
    current = ctx.file(path)
    if current == content:
        return None
    if content is None:
        command = f"rm -f {q(path)}"
        summary = f"remove {path} ({what})"
    else:
        command = write_file(path, content, mode)
        summary = f"{'update' if current is not None else 'create'} {path} ({what})"
    diff = unified_diff(path, None if current is None else mask_credentials(current),
                        None if content is None else mask_credentials(content))
    return Change(component, summary, (command, *then), reboot=reboot, diff=diff)
