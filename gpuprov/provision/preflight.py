"""Preflight: read-only checks that must pass before provisioning, from facts plus one probe command."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from gpuprov.core.debversion import check, compare_versions, is_valid, nearest
from gpuprov.core.errors import mask_credentials

MIN_FREE_MIB = {"/": 5120}  # driver, CUDA toolkit and DCGM unpack to several GiB
WARN_FREE_MIB = 10240


@dataclass(frozen=True)
class Check:
    """One preflight result: status is pass, warn, fail or skip."""

    name: str
    status: str
    detail: str
    remedy: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "remedy": self.remedy}


def probe_command(facts: dict, repo, wanted: Iterable = ()) -> tuple[str, str]:
    """One read-only command: is the package source reachable, are the running kernel's headers available, which
    versions of each wanted package does the repository hold, is the source configured twice.

    Returns (command, stdin). The repository URL and the proxy (either may hold credentials) and the extra CA
    travel on stdin, never on a command line: curl reads them from its config on stdin and from a here-document.
    Nothing changes on the host; on RHEL the dnf lookup works in a temporary folder that is removed at exit.
    """
    family = facts["os"]["family"]
    names = sorted({pkg.name for pkg in wanted})
    kernel = facts.get("kernel") or ""
    headers = f"linux-headers-{kernel}" if family == "debian" else f"kernel-devel-{kernel}"
    index = "InRelease" if family == "debian" else "repodata/repomd.xml"
    ca = " --cacert /dev/fd/3 3<<EOF\n$ca\nEOF" if repo.ca_pem else ""
    script = [
        "IFS= read -r base; IFS= read -r proxy; ca=$(cat)",
        "command -v curl >/dev/null 2>&1 || { echo 'source=nocurl'; exit 0; }",
        "get() {",
        "  p=$1; shift",
        "  { printf 'url = \"%s/%s\"\\n' \"$base\" \"$p\"",
        "    [ -z \"$proxy\" ] || printf 'proxy = \"%s\"\\n' \"$proxy\"; } |",
        f"    curl -fsS --connect-timeout 10 -K - \"$@\"{ca}",
        "}",
        f"echo \"source=$(get {index} --max-time 15 -o /dev/null -w '%{{http_code}}' 2>/dev/null)\"",
    ]
    if family == "debian":
        # no package cache is written: preflight leaves the host exactly as it was
        lookup = ("apt-cache -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= show "
                  f"{shlex.quote(headers)} >/dev/null 2>&1")
        script.append("scan() { { get Packages.gz --max-time 120 | gzip -dc || get Packages --max-time 120; } "
                      f"2>/dev/null | awk -v names={shlex.quote(' ' + ' '.join(names) + ' ')} "
                      f"-v headers={shlex.quote(headers)} {shlex.quote(_DEB_SCAN)}; }}")
        script.append(f"if {lookup}; then echo headers=known{'; scan' if names else ''}; else scan; fi")
    else:
        script.append(f"if dnf -q list --available {shlex.quote(headers)} >/dev/null 2>&1; then echo headers=known; fi")
        if names:
            script += _dnf_scan(names)
    script.append(f"for f in $(grep -rlsF {shlex.quote(_without_scheme(repo.url))} /etc/apt/sources.list "
                  "/etc/apt/sources.list.d /etc/yum.repos.d); do case $f in *gpuprov-nvidia*) ;; "
                  "*) echo \"duplicate=$f\";; esac; done")
    stdin = f"{repo.url.rstrip('/')}\n{repo.proxy or ''}\n{repo.ca_pem or ''}"
    return f"sh -c {shlex.quote(chr(10).join(script))}", stdin


# every version of each wanted package in a Debian flat repository's Packages index; the headers' name too
_DEB_SCAN = """/^Package: / { p = $2; n++; if (p == headers) h = 1 }
/^Version: / && index(names, " " p " ") { print "pkg=" p "=" $2 }
END { print "index=" (n ? "ok" : "missing"); if (h) print "headers=repo" }"""
# `dnf list` rows are NAME.ARCH EVR REPO, wrapped onto two lines when the name is long
_DNF_SCAN = """/^(Available|Installed) Packages/ { next }
{ for (i = 1; i <= NF; i++) t[k++] = $i }
k >= 3 { n = t[0]; sub(/\\.[^.]*$/, "", n); print "pkg=" n "=" t[1]; k = 0 }"""


def _dnf_scan(names: list[str]) -> list[str]:
    """dnf against the repository alone, from a repo file and cache in a temporary folder removed at exit."""
    return [
        "scan() {",
        "  d=$(mktemp -d) || { echo index=missing; return; }",
        "  trap 'rm -rf \"$d\"' EXIT",
        '  [ -z "$ca" ] || printf \'%s\\n\' "$ca" > "$d/ca.pem"',
        "  { printf '[gpuprov-preflight]\\nname=gpuprov preflight\\nbaseurl=%s\\ngpgcheck=0\\n' \"$base\"",
        "    [ -z \"$proxy\" ] || printf 'proxy=%s\\n' \"$proxy\"",
        "    [ -z \"$ca\" ] || printf 'sslcacert=%s/ca.pem\\n' \"$d\"; } > \"$d/preflight.repo\"",
        "  set -- -q --setopt=reposdir=\"$d\" --setopt=cachedir=\"$d/cache\" --repo=gpuprov-preflight",
        "  if dnf \"$@\" makecache >/dev/null 2>&1; then echo index=ok; else echo index=missing; return; fi",
        f"  dnf \"$@\" list --showduplicates --available {' '.join(shlex.quote(n) for n in names)} 2>/dev/null |",
        f"    awk {shlex.quote(_DNF_SCAN)}",
        "}",
        "scan",
    ]


def _without_scheme(url: str) -> str:
    """`https://user:pw@mirror/nvidia/` -> `mirror/nvidia`: what a sources entry for it contains, no secret."""
    return re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/@]*@)?", "", url).rstrip("/")


def parse_probe(output: str) -> dict[str, str]:
    """`key=value` lines of the probe; a key given more than once keeps every value, space-separated."""
    found: dict[str, str] = {}
    for key, value in re.findall(r"^(source|headers|duplicate|index|pkg)=(\S*)$", output, re.M):
        found[key] = f"{found[key]} {value}" if key in found else value
    return found


def evaluate(facts: dict, probe: dict[str, str] | None, repo, stack: dict | None,
             wanted: Iterable | None = None) -> list[Check]:
    """All preflight checks for one host. Without a probe (nothing to install) the checks that need one
    are reported as skipped. `wanted` (objects with .name and .version) adds the package_versions check."""
    checks = [_os(facts), _secure_boot(facts, stack), _nouveau(facts), _package_manager(facts), _cloud_init(facts)]
    checks += _disk(facts)
    if probe is None:
        if not facts.get("kernel_headers"):
            checks.append(Check("kernel_headers", "skip", "not checked: nothing to install"))
        checks += [Check(name, "skip", "not checked: nothing to install") for name in ("package_source",
                                                                                       "duplicate_source")]
    else:
        checks += [_source(probe, repo), _duplicate_source(probe)]
    if probe is not None or facts.get("kernel_headers"):
        checks.append(_headers(facts, probe or {}))
    if wanted is not None:
        checks.append(_package_versions(facts["os"]["family"], probe, list(wanted)))
    return checks


def _os(facts: dict) -> Check:
    os_ = facts["os"]
    if os_.get("key"):
        return Check("os", "pass", os_["key"])
    return Check("os", "fail", f"unsupported OS {os_.get('pretty_name')!r}",
                 "use Ubuntu 22.04/24.04, Debian 12 or RHEL/Rocky 9")


def _secure_boot(facts: dict, stack: dict | None) -> Check:
    if facts.get("secure_boot") is None:
        return Check("secure_boot", "warn", "Secure Boot state unknown (no SecureBoot EFI variable readable)",
                     "find out on the host with: mokutil --sb-state; if it is enabled, the driver's DKMS modules "
                     "must be signed with an enrolled Machine Owner Key")
    if facts["secure_boot"] is False:
        return Check("secure_boot", "pass", "Secure Boot off (or a BIOS boot)")
    packages = facts.get("packages") or {}
    installed = stack and any(packages.get(p["name"]) == p["version"] for p in stack["driver"]["packages"])
    if installed and facts.get("loaded_driver_version"):
        return Check("secure_boot", "pass", "Secure Boot on; the NVIDIA module is already loaded (signed)")
    return Check("secure_boot", "fail", "Secure Boot is on and the driver's kernel modules would be built unsigned "
                 "by DKMS, so they would not load",
                 "enroll a Machine Owner Key (mokutil --import) for DKMS signing, or turn Secure Boot off, "
                 "then rerun; or rerun with --skip-preflight if the modules are signed another way")


def _nouveau(facts: dict) -> Check:
    if facts.get("nouveau_loaded"):
        return Check("nouveau", "warn", "nouveau is loaded", "provision blacklists it and rebuilds the initramfs; "
                     "a reboot is needed before the NVIDIA driver loads")
    return Check("nouveau", "pass", "nouveau not loaded")


def _headers(facts: dict, probe: dict[str, str]) -> Check:
    if facts.get("kernel_headers"):
        return Check("kernel_headers", "pass", f"headers for {facts.get('kernel')} installed")
    found = probe.get("headers", "").split()
    if found and set(found) <= {"known", "repo"}:
        where = "in the configured sources" if "known" in found else "in the NVIDIA package source"
        return Check("kernel_headers", "pass", f"headers for {facts.get('kernel')} available {where}")
    return Check("kernel_headers", "fail", f"no headers for the running kernel {facts.get('kernel')} "
                 "in any configured source; DKMS cannot build the driver",
                 "boot a kernel whose headers your mirror carries, or add them to the mirror")


def _package_manager(facts: dict) -> Check:
    busy = facts.get("package_manager_busy") or []
    if busy:
        return Check("package_manager", "warn", "package manager busy: " + "; ".join(busy),
                     "provision waits for the lock (DPkg::Lock::Timeout); make sure it finishes")
    if facts.get("dpkg_interrupted"):
        return Check("package_manager", "warn", "an interrupted dpkg run was found",
                     "provision runs dpkg --configure -a first")
    return Check("package_manager", "pass", "idle")


def _cloud_init(facts: dict) -> Check:
    if facts.get("cloud_init") == "running":
        return Check("cloud_init", "warn", "cloud-init is still running (first boot)",
                     "provision waits for cloud-init status --wait")
    return Check("cloud_init", "pass", facts.get("cloud_init") or "not present")


def _source(probe: dict[str, str], repo) -> Check:
    code = probe.get("source", "")
    url = mask_credentials(repo.url)
    via = f" via proxy {mask_credentials(repo.proxy)}" if repo.proxy else ""
    if code == "nocurl":
        return Check("package_source", "fail", "curl is missing on the host", "install curl, then rerun")
    if code.startswith("2"):
        return Check("package_source", "pass", f"{url} answered {code}{via}")
    return Check("package_source", "fail", f"{url} unreachable from the host{via} (HTTP {code or 'none'})",
                 "check the mirror URL, the proxy and the CA in the inventory's mirror settings")


def _duplicate_source(probe: dict[str, str]) -> Check:
    if probe.get("duplicate"):
        return Check("duplicate_source", "fail", f"the package source is already configured in {probe['duplicate']}; "
                     "apt refuses two entries with different signed-by keys",
                     "remove that file (for example the one the cuda-keyring package wrote), then rerun")
    return Check("duplicate_source", "pass", "no other entry for the package source")


def _disk(facts: dict) -> list[Check]:
    free = facts.get("disk_free_mib") or {}
    checks = []
    for mount, minimum in MIN_FREE_MIB.items():
        have = free.get(mount)
        if have is None:
            checks.append(Check(f"disk {mount}", "warn", "free space unknown"))
        elif have < minimum:
            checks.append(Check(f"disk {mount}", "fail", f"{have} MiB free, need {minimum} MiB",
                                f"free space on {mount}"))
        else:
            status = "warn" if have < WARN_FREE_MIB else "pass"
            checks.append(Check(f"disk {mount}", status, f"{have} MiB free"))
    return checks


def _package_versions(family: str, probe: dict[str, str] | None, wanted: list) -> Check:
    """Each wanted name=version must be in the repository's index; a missing one names the nearest it has."""
    if probe is None:
        return Check("package_versions", "skip", "not checked: nothing to install")
    if not wanted:
        return Check("package_versions", "pass", "no packages to install")
    if probe.get("index") != "ok":
        return Check("package_versions", "warn", "the repository's package index could not be read; "
                     "package versions not checked", "see the package_source check")

    def plain(version: str) -> str:  # dnf shows a non-zero epoch, stacks leave it out (as Dnf.same_version)
        return version.split(":", 1)[-1] if family == "rhel" else version

    available: dict[str, set[str]] = {}
    for entry in probe.get("pkg", "").split():
        name, _, version = entry.partition("=")
        available.setdefault(name, set()).add(plain(version))
    missing = []
    for pkg in wanted:
        want, have = plain(pkg.version), available.get(pkg.name, set())
        if family == "debian":
            check(want)   # InvalidVersion (bad input, exit 2): the stack or its lock pins a version dpkg refuses
        # rpm versions Debian cannot order (`1.el9_4`) are matched as text; odd index entries are never ordered
        orderable = is_valid(want)
        if want not in have and not (orderable and any(compare_versions(v, want) == 0 for v in have if is_valid(v))):
            near = nearest(want, have) if orderable else []
            missing.append(f"{pkg.name}={pkg.version} ({'nearest: ' + ', '.join(near) if near else 'no version'})")
    if missing:
        return Check("package_versions", "fail", "not in the repository: " + "; ".join(missing),
                     "sync the mirror with NVIDIA's repository, or pin versions it carries (inventory stack vars, "
                     "then --update-lock)")
    return Check("package_versions", "pass", f"all {len(wanted)} packages at their exact versions in the repository")


def run_preflight(conn, facts: dict, repo, stack: dict | None, wanted: Iterable | None = None) -> list[Check]:
    """Probe the host (one read-only command) and evaluate every check; `wanted` packages (objects with .name
    and .version, e.g. gpuprov.core.packages.Package) are looked up in the repository the host will use."""
    wanted = None if wanted is None else list(wanted)
    command, stdin = probe_command(facts, repo, wanted or ())
    result = conn.run(command, stdin=stdin, timeout=180)
    return evaluate(facts, parse_probe(result.stdout), repo, stack, wanted)
