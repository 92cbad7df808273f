"""Package-manager commands: apt (Debian/Ubuntu) and dnf (RHEL family), exact versions, quoted."""

from __future__ import annotations

import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuprov.core.errors import InputError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._:-]*")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~:_-]*")
_PREFIX = re.compile(r"[a-z0-9][a-z0-9-]*")
# A family of package names as an extended regular expression (awk's and Python's alike): built by gpuprov
# (gpuprov.provision.ops.families.family_pattern), never from input; no `/`, quote or backslash, so it sits in an
# awk literal.
_PATTERN = re.compile(r"[a-z0-9^$()|.*+?\[\]-]+")
VERSIONLOCK_LIST = "/etc/dnf/plugins/versionlock.list"


@dataclass(frozen=True)
class Package:
    """A package at one exact repository version string."""

    name: str
    version: str

    def __post_init__(self):
        if not _NAME.fullmatch(self.name) or not _VERSION.fullmatch(self.version):
            raise InputError(f"not a valid package name/version: {self.name!r} {self.version!r}",
                             step="plan", hint="check the stack data (gpuprov/data/*.yaml) or the lock file")


def _join(words: Iterable[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def _family(pattern: str) -> str:
    if not _PATTERN.fullmatch(pattern):
        raise ValueError(f"not a package family pattern: {pattern!r}")
    return pattern


def _selection(names: Sequence[str], prefixes: Sequence[str], pattern: str | None = None) -> tuple[str, str]:
    """An awk `-v` option and the condition that selects, by the package name held in `name`, the packages
    named `names`, those whose names start with one of `prefixes` and those whose names match `pattern`."""
    for name in names:
        if not _NAME.fullmatch(name):
            raise InputError(f"not a valid package name: {name!r}", step="plan",
                             hint="check the stack data (gpuprov/data/*.yaml) or the lock file")
    if not all(_PREFIX.fullmatch(prefix) for prefix in prefixes):
        raise ValueError(f"package name prefixes must be plain names: {prefixes!r}")
    option = f"-v names={shlex.quote(' ' + ' '.join(names) + ' ')}"
    condition = f'index(names, " " name " ") || name ~ /^({"|".join(prefixes)})/'
    return option, condition + (f" || name ~ /{_family(pattern)}/" if pattern else "")


class PackageManager(ABC):
    """Commands for one package manager; every value is shell-quoted."""

    family: str

    def __init__(self, lock_timeout: int = 300):
        self.lock_timeout = int(lock_timeout)

    @abstractmethod
    def spec(self, pkg: Package) -> str:
        """See Apt and Dnf."""

    @abstractmethod
    def same_version(self, installed: str | None, wanted: str) -> bool:
        """See Apt and Dnf."""

    @abstractmethod
    def update(self) -> str:
        """See Apt and Dnf."""

    @abstractmethod
    def install(self, packages: Sequence[Package], remove: Sequence[str] = ()) -> list[str]:
        """See Apt and Dnf."""

    @abstractmethod
    def install_names(self, names: Sequence[str]) -> str:
        """See Apt and Dnf."""

    @abstractmethod
    def hold(self, packages: Sequence[Package]) -> str:
        """See Apt and Dnf."""

    @abstractmethod
    def unhold(self, names: Sequence[str]) -> str:
        """See Apt and Dnf."""

    @abstractmethod
    def hold_installed(self, names: Sequence[str], prefixes: Sequence[str], pattern: str | None = None) -> str:
        """See Apt and Dnf."""


class Apt(PackageManager):
    family = "debian"

    def _apt(self, tool: str, args: str) -> str:
        return (f"DEBIAN_FRONTEND=noninteractive {tool} -o DPkg::Lock::Timeout={self.lock_timeout} "
                f"-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold {args}")

    def spec(self, pkg: Package) -> str:
        return f"{pkg.name}={pkg.version}"

    def same_version(self, installed: str | None, wanted: str) -> bool:
        return installed == wanted

    def update(self) -> str:
        return self._apt("apt-get", "-q update")

    def install(self, packages: Sequence[Package], remove: Sequence[str] = ()) -> list[str]:
        """One transaction: `name=version` installs (downgrades allowed) and `name-` removals."""
        words = [self.spec(p) for p in packages] + [f"{name}-" for name in remove]
        return [self._apt("apt-get", f"-y -q install --no-install-recommends --allow-downgrades {_join(words)}")]

    def install_names(self, names: Sequence[str]) -> str:
        return self._apt("apt-get", f"-y -q install --no-install-recommends {_join(names)}")

    def hold(self, packages: Sequence[Package]) -> str:
        return self._apt("apt-mark", f"hold {_join(p.name for p in packages)}")

    def unhold(self, names: Sequence[str]) -> str:
        return self._apt("apt-mark", f"unhold {_join(names)}")

    def hold_installed(self, names: Sequence[str], prefixes: Sequence[str], pattern: str | None = None) -> str:
        """Hold, as the host has them now, the installed packages among `names`, every installed package
        whose name starts with one of `prefixes` and every one whose name matches `pattern` (the packages a
        metapackage pulled in, known only on the host). Foreign-architecture packages are held too."""
        option, condition = _selection(names, prefixes, pattern)
        program = f"$1 ~ /^[hi]i/ {{ name = $2; sub(/:[a-z0-9]+$/, \"\", name); if ({condition}) print $2 }}"
        query = "dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\\n'"
        return (f"pkgs=$({query} | awk {option} {shlex.quote(program)} | sort -u) && "
                f"if [ -n \"$pkgs\" ]; then {self._apt('apt-mark', 'hold $pkgs')}; fi")

    def install_release(self, packages: Sequence[Package], pattern: str, remove: Sequence[str] = ()) -> str:
        """Install `packages` and, at the versions `packages` name, every package of the family `pattern` they
        depend on, recursively, in one transaction (downgrades allowed; `remove` removed in it).

        NVIDIA's metapackages depend on their parts by a minimum version (`cuda-compiler-13-2 (>= 13.2.1)`,
        which names the part of the same release), so apt alone takes the newest part in the repository: the
        closure is resolved here from the repository's own Depends, each `(>= V)` / `(= V)` of the family taken
        as exactly V (a version of the package whose upstream version is V), an unversioned one at the installed
        version, else the candidate. A family dependency no version satisfies fails the command before apt
        changes anything. The family's holds are lifted for the transaction (the pins op holds the family again)."""
        for pkg in packages:
            Package(pkg.name, pkg.version)
        start = " ".join(f"{p.name}={p.version}" for p in packages)
        program = (
            'function out(cmd,   line, text) { text = ""; while ((cmd | getline line) > 0) text = text line "\\n"; '
            'close(cmd); return text } '
            'function fail(why) { print "gpuprov: " why > "/dev/stderr"; exit 1 } '
            'function pick(name, want,   n, i, lines, f, v) { n = split(out("apt-cache madison " name), lines, "\\n"); '
            'for (i = 1; i <= n; i++) { split(lines[i], f, "|"); v = f[2]; gsub(/ /, "", v); '
            'if (v == want || index(v, want "-") == 1) return v } return "" } '
            'function current(name,   n, i, lines, v, got) { n = split(out("apt-cache policy " name), lines, "\\n"); '
            'for (i = 1; i <= n; i++) { v = lines[i]; if (v ~ /^ *(Installed|Candidate): /) { '
            'sub(/^ *[A-Za-z]+: /, "", v); if (v != "(none)" && got == "") got = v } } return got } '
            'BEGIN { n = split(start, todo, " "); for (i = 1; i <= n; i++) { split(todo[i], f, "="); seen[f[1]] = 1 } '
            'for (head = 1; head <= n; head++) { item = todo[head]; list = list " " item; '
            'stanza = out("apt-cache show " item); if (stanza == "") fail(item " is not in the repository"); '
            'm = split(stanza, lines, "\\n"); deps = ""; '
            'for (i = 1; i <= m && lines[i] != ""; i++) if (lines[i] ~ /^(Pre-)?Depends: /) { line = lines[i]; '
            'sub(/^[A-Za-z-]+: /, "", line); deps = deps "," line } '
            'k = split(deps, clauses, ","); '
            'for (j = 1; j <= k; j++) { clause = clauses[j]; sub(/\\|.*/, "", clause); gsub(/^ +| +$/, "", clause); '
            'name = clause; sub(/[ (].*/, "", name); sub(/:[a-z0-9]+$/, "", name); '
            'if (name == "" || name !~ family || (name in seen)) continue; '
            'if (name !~ /^[a-z0-9][a-z0-9+.-]*$/) fail("unexpected package name " name " in " item); '
            'seen[name] = 1; version = ""; '
            'if (clause ~ /\\(/) { rel = clause; sub(/^[^(]*\\( */, "", rel); sub(/ *\\).*$/, "", rel); '
            'if (rel !~ /^>?= *[0-9A-Za-z.+~:-]+$/) '
            'fail(item " depends on " clause ": not a minimum or exact version"); '
            'sub(/^>?= */, "", rel); version = pick(name, rel) } else version = current(name); '
            'if (version == "") fail("no version of " name " satisfies " clause " (a dependency of " item ")"); '
            'todo[++n] = name "=" version } } '
            'print substr(list, 2) }')
        option = f"-v start={shlex.quote(start)} -v family={shlex.quote(_family(pattern))}"
        words = " ".join(f"{shlex.quote(name)}-" for name in remove)
        held = self.unhold_installed(pattern)
        install = self._apt("apt-get", "-y -q install --no-install-recommends --allow-downgrades $pkgs"
                            + (f" {words}" if words else ""))
        return (f"( set -f && pkgs=$(awk {option} {shlex.quote(program)} </dev/null) && {held} && {install} )")

    def unhold_installed(self, pattern: str) -> str:
        """Lift the holds of the installed packages whose names match `pattern`."""
        program = (f"$1 ~ /^h/ {{ name = $2; sub(/:[a-z0-9]+$/, \"\", name); "
                   f"if (name ~ /{_family(pattern)}/) print $2 }}")
        query = "dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\\n'"
        return (f"held=$({query} | awk {shlex.quote(program)} | sort -u) && "
                f"if [ -n \"$held\" ]; then {self._apt('apt-mark', 'unhold $held')}; fi")


class Dnf(PackageManager):
    """dnf waits for the rpm lock by itself; `lock_timeout` has no dnf equivalent."""

    family = "rhel"

    def spec(self, pkg: Package) -> str:
        return f"{pkg.name}-{pkg.version}"

    def same_version(self, installed: str | None, wanted: str) -> bool:
        """rpm versions compared without the epoch (facts drop a zero epoch, stacks may omit it)."""
        return installed is not None and installed.split(":")[-1] == wanted.split(":")[-1]

    def update(self) -> str:
        return "dnf -y makecache"

    def install(self, packages: Sequence[Package], remove: Sequence[str] = ()) -> list[str]:
        """Removals first, then exact NEVRs (dnf installs exactly that version, up or down)."""
        commands = [f"dnf -y remove {_join(remove)}"] if remove else []
        if packages:
            commands.append("dnf -y --setopt=install_weak_deps=False install --allowerasing "
                            + _join(self.spec(p) for p in packages))
        return commands

    def install_names(self, names: Sequence[str]) -> str:
        return f"dnf -y --setopt=install_weak_deps=False install {_join(names)}"

    def hold(self, packages: Sequence[Package]) -> str:
        return f"dnf -y versionlock add {_join(self.spec(p) for p in packages)}"

    def unhold(self, names: Sequence[str]) -> str:
        return f"dnf -y versionlock delete {_join(names)}"

    def hold_installed(self, names: Sequence[str], prefixes: Sequence[str], pattern: str | None = None) -> str:
        """Lock, at their installed `name-EPOCH:VERSION-RELEASE.*`, the installed packages among `names`, every
        installed package under `prefixes` and every one matching `pattern` (see Apt.hold_installed); an entry
        the versionlock list has for such a name is replaced."""
        option, condition = _selection(names, prefixes, pattern)
        program = (
            '$0 == "@@rpm" { rpm = 1; next } '
            # versionlock.list lines: name-[epoch:]version-release.arch; exclusions (!) are no locks
            '!rpm { line = $0; sub(/^[ \\t]+/, "", line); if (line == "" || line ~ /^[#!]/) next; '
            'n = split(line, f, "-"); if (n < 3) next; name = f[1]; for (i = 2; i <= n - 2; i++) name = name "-" f[i]; '
            'locked[name] = 1; next } '
            '{ name = $1; evr = $2; sub(/^\\(none\\):/, "0:", evr); '
            f'if (({condition}) && !seen[name]++) {{ if (name in locked) del = del " " name; '
            'add = add " " name "-" evr ".*" } } '
            'END { print substr(del, 2); print substr(add, 2) }')
        return (f"( set -f && out=$({{ cat {VERSIONLOCK_LIST} 2>/dev/null || true; echo @@rpm; "
                "rpm -qa --qf '%{NAME} %{EPOCH}:%{VERSION}-%{RELEASE}\\n'; } | "
                f"awk {option} {shlex.quote(program)}) && "
                "del=$(printf '%s\\n' \"$out\" | sed -n 1p) && add=$(printf '%s\\n' \"$out\" | sed -n 2p) && "
                "if [ -n \"$del\" ]; then dnf -y versionlock delete $del; fi && "
                "if [ -n \"$add\" ]; then dnf -y versionlock add $add; fi )")


def for_family(family: str, lock_timeout: int = 300) -> PackageManager:
    """The package manager of an OS family ("debian" or "rhel")."""
    managers = {"debian": Apt, "rhel": Dnf}
    if family not in managers:
        raise InputError(f"no package manager for OS family {family!r}", step="plan",
                         hint="gpuprov supports the debian and rhel families")
    return managers[family](lock_timeout)
