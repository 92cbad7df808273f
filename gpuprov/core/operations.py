"""Operations every capability shares: the `Change` a plan proposes, the context an operation reads, and the
primitives that build changes: a managed file (staged, judged by an outside validator before it replaces the old
one, its diff masked, then a reload or restart: `managed_file`, `file_change`), a systemd unit's wanted states
(enabled, running, reload or restart, disruptive or not: `service_change`), a package set at exact versions
(`package_change`).

Operations are pure: facts + desired state in, `Change`s out. Nothing here touches a host.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field

from gpuprov.core.errors import GpuprovError, mask_credentials
from gpuprov.core.packages import VERSIONLOCK_LIST, Package, PackageManager, for_family

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
    affects: tuple[str, ...] | None = None   # the facts it can alter (None: any); the batch gathers only those again


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


def install_change(component: str, pm: PackageManager, names: list[str], installed: dict,
                   why: str = "") -> Change | None:
    """Install the packages of `names` that `installed` (facts' name -> version) lacks, at the version the sources
    offer; None when every one is there."""
    missing = [name for name in names if installed.get(name) is None]
    if not missing:
        return None
    return Change(component, f"install {' '.join(missing)}" + (f" ({why})" if why else ""),
                  (pm.update(), pm.install_names(missing)))


def change_dict(change, refused: list[str] | None = None) -> dict:
    """A Change as the plan table and the JSON report show it; `refused` lists the work that stopped it."""
    data = {"component": change.component, "summary": change.summary, "commands": list(change.commands),
            "reboot": change.reboot, "disruptive": change.disruptive, "diff": change.diff}
    if refused:
        data["refused"] = refused
    return data


def unified_diff(path: str, old: str | None, new: str | None) -> str:
    return "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
        fromfile=path if old is not None else "/dev/null", tofile=path if new is not None else "/dev/null"))


# --- the file primitive -----------------------------------------------------------------------------------------

STAGED = ".gpuprov.tmp"                 # the temporary file beside the target, renamed over it
_MODE = re.compile(r"0?[0-7]{3}")
_OWNER = re.compile(r"[a-z_][a-z0-9_-]*(:[a-z_][a-z0-9_-]*)?")


def staged_path(path: str) -> str:
    """Where a new version of `path` is written (and checked) before it replaces the old one."""
    return f"{path}{STAGED}"


def stage_file(path: str, content: str, mode: str = "0644", owner: str | None = None) -> str:
    """The whole content to staged_path(path), created readable by root only (it may hold credentials), then given
    `mode` (and `owner`, user[:group])."""
    if not _MODE.fullmatch(mode):
        raise ValueError(f"file mode {mode!r} is not an octal mode such as 0644")
    if owner is not None and not _OWNER.fullmatch(owner):
        raise ValueError(f"file owner {owner!r} is not user or user:group")
    tmp = staged_path(path)
    directory = path.rsplit("/", 1)[0] or "/"
    command = f"mkdir -p {q(directory)} && (umask 077 && printf %s {q(content)} > {q(tmp)}) && chmod {mode} {q(tmp)}"
    return command + (f" && chown {q(owner)} {q(tmp)}" if owner else "")


def write_file(path: str, content: str, mode: str = "0644", owner: str | None = None) -> str:
    """Atomic write: stage_file, then rename over `path`."""
    return f"{stage_file(path, content, mode, owner)} && mv -f {q(staged_path(path))} {q(path)}"


def check_command(validate: str, staged: str, rejected: str) -> str:
    """Run the outside validator `validate` (a command template whose one `%s` is the staged file) and, when it
    refuses, say `rejected: <its output>`, remove the staged file and fail the step: the old file stays."""
    if validate.count("%s") != 1:
        raise ValueError(f"a validate command needs exactly one %s (the file to check), not {validate!r}")
    check = validate.replace("%s", q(staged))
    return (f"if ! out=$({check} 2>&1); then echo {q(rejected + ': ')}\"$out\" >&2; rm -f {q(staged)}; exit 1; fi")


def managed_file(component: str, path: str, current: str | None, content: str | None, what: str, *,
                 mode: str = "0644", owner: str | None = None, validate: str | None = None,
                 rejected: str | None = None, then: tuple[str, ...] = (), reboot: bool = False,
                 always: bool = False, summary: str | None = None) -> Change | None:
    """Make `path` hold `content` (None: absent), from its `current` content; None when it already does (unless
    `always`: the caller saw other drift the write and `then` repair).

    The new content is staged beside the file; `validate` (a template, `%s` = the staged file: `sshd -t -f %s`,
    `nft -c -f %s`, `promtool check config %s`) judges it BEFORE the rename, so a file the validator rejects never
    replaces the old one (the step fails saying `rejected`, default "<program> rejected <path>"). `then` runs after
    the rename (reload, restart). The diff shows both versions with every secret masked."""
    if current == content and not always:
        return None
    verb = "remove" if content is None else "update" if current is not None else "create"
    if content is None:
        commands: tuple[str, ...] = (f"rm -f {q(path)}",)
    elif validate is None:
        commands = (write_file(path, content, mode, owner),)
    else:
        staged = staged_path(path)
        commands = (stage_file(path, content, mode, owner),
                    check_command(validate, staged, rejected or f"{validate.split()[0]} rejected {path}"),
                    f"mv -f {q(staged)} {q(path)}")
    diff = unified_diff(path, None if current is None else mask_credentials(current),
                        None if content is None else mask_credentials(content))
    return Change(component, summary or f"{verb} {path} ({what})", (*commands, *then), reboot=reboot, diff=diff,
                  affects=None if then else ("files",))


def file_change(ctx: OpContext, component: str, path: str, content: str | None, what: str,
                **options) -> Change | None:
    """managed_file for a file the facts list (ctx.file): same options."""
    return managed_file(component, path, ctx.file(path), content, what, **options)


# --- the service primitive --------------------------------------------------------------------------------------

def service_change(component: str, unit: str, state: dict | None, *, enabled: bool | None = True,
                   restart: bool = False, reload: bool = False, when: str | None = None,
                   disruptive: str | None = None, why: str = "", summary: str | None = None) -> Change | None:
    """Bring a systemd unit to its wanted states, from `state` (facts' services entry: exists, enabled, active).

    enabled=True: enabled and running (`systemctl enable --now`); False: stopped and disabled; None: enablement left
    as it is. `restart`: a change the unit takes only on a restart (it also starts a stopped unit); `reload`: one it
    takes on a reload (a running unit not restarted anyway). `when`: a host-side shell condition the start or
    restart waits for (the driver answers, the daemon lacks a runtime); with it, a stopped unit is no drift by
    itself (it starts with the condition, at boot). `disruptive` names the running work a restart interrupts (the
    apply step is then guarded by the busy check). None when the unit is in state."""
    if not re.fullmatch(r"[\w@.:-]+", unit):
        raise ValueError(f"systemd unit name {unit!r} has characters a unit name cannot have")
    state = state or {}
    is_enabled, active = bool(state.get("enabled")), bool(state.get("active"))
    u = q(unit)

    def conditional(command: str) -> str:
        return command if when is None else f"if {when}; then {command}; fi"

    if enabled is False:
        if not (is_enabled or active):
            return None
        commands, default = (f"systemctl disable --now {u}",), f"stop and disable {unit}"
    elif restart:
        enable = enabled and not is_enabled
        commands = ((f"systemctl enable {u}",) if enable else ()) + (conditional(f"systemctl restart {u}"),)
        default = f"{'enable and ' if enable else ''}restart {unit}"
    elif enabled and not is_enabled and when is not None:
        commands = (f"systemctl enable {u}", conditional(f"systemctl start {u}"))
        default = f"enable {unit} (started once `{when}` holds)"
    elif enabled and not (is_enabled and active) and when is None:
        commands, default = (f"systemctl enable --now {u}",), f"enable and start {unit}"
    elif reload and active:
        commands, default = (f"systemctl reload {u}",), f"reload {unit}"
    else:
        return None
    text = summary or default + (f" ({why})" if why else "")
    return Change(component, text, commands, disruptive=disruptive)
