"""Preflight: read-only checks that must pass before provisioning, from facts plus one probe command."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

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


def probe_command(facts: dict, repo) -> tuple[str, str | None]:
    """One read-only command that tests the package source and looks for the running kernel's headers.

    Returns (command, stdin): the extra CA, when given, travels on stdin so nothing is written on the host.
    """
    family = facts["os"]["family"]
    base = repo.url.rstrip("/")
    index = f"{base}/InRelease" if family == "debian" else f"{base}/repodata/repomd.xml"
    curl = ["curl", "-fsS", "--max-time", "15"] + (["--proxy", repo.proxy] if repo.proxy else [])
    curl += ["--cacert", "/dev/stdin"] if repo.ca_pem else []
    fetch = 'printf %s "$ca" | ' + " ".join(shlex.quote(word) for word in curl)
    kernel = facts.get("kernel") or ""
    headers = f"linux-headers-{kernel}" if family == "debian" else f"kernel-devel-{kernel}"
    # no package cache is written: preflight leaves the host exactly as it was
    lookup = (f"apt-cache -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= show {shlex.quote(headers)}"
              " >/dev/null 2>&1" if family == "debian"
              else f"dnf -q list --available {shlex.quote(headers)} >/dev/null 2>&1")
    script = "\n".join([
        "command -v curl >/dev/null 2>&1 || { echo 'source=nocurl'; exit 0; }",
        "ca=$(cat)",
        f"code=$({fetch} -o /dev/null -w '%{{http_code}}' {shlex.quote(index)} 2>/dev/null)",
        'echo "source=$code"',
        f"if {lookup}; then echo headers=known; "
        f"elif [ {shlex.quote(family)} = debian ] && {fetch} {shlex.quote(base + '/Packages')} 2>/dev/null"
        f" | grep -qx {shlex.quote('Package: ' + headers)}; then echo headers=repo; else echo headers=missing; fi",
        f"for f in $(grep -rlsF {shlex.quote(base)} /etc/apt/sources.list /etc/apt/sources.list.d /etc/yum.repos.d);"
        " do case $f in *gpuprov-nvidia*) ;; *) echo \"duplicate=$f\";; esac; done",
    ])
    return f"sh -c {shlex.quote(script)}", repo.ca_pem or ""


def parse_probe(output: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in re.findall(r"^(source|headers|duplicate)=(\S*)$", output, re.M):
        found[key] = f"{found[key]} {value}" if key in found else value
    return found


def evaluate(facts: dict, probe: dict[str, str] | None, repo, stack: dict | None) -> list[Check]:
    """All preflight checks for one host. Without a probe (nothing to install) the checks that need one
    are reported as skipped."""
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
    return checks


def _os(facts: dict) -> Check:
    os_ = facts["os"]
    if os_.get("key"):
        return Check("os", "pass", os_["key"])
    return Check("os", "fail", f"unsupported OS {os_.get('pretty_name')!r}",
                 "use Ubuntu 22.04/24.04, Debian 12 or RHEL/Rocky 9")


def _secure_boot(facts: dict, stack: dict | None) -> Check:
    if facts.get("secure_boot") is not True:
        state = {False: "off", None: "unknown"}[facts.get("secure_boot")]
        return Check("secure_boot", "pass", f"Secure Boot {state}")
    installed = stack and any(facts["packages"].get(p["name"]) == p["version"] for p in stack["driver"]["packages"])
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
    found = probe.get("headers")
    if found in {"known", "repo"}:
        where = "in the configured sources" if found == "known" else "in the NVIDIA package source"
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
    via = f" via proxy {mask_url(repo.proxy)}" if repo.proxy else ""
    if code == "nocurl":
        return Check("package_source", "fail", "curl is missing on the host", "install curl, then rerun")
    if code.startswith("2"):
        return Check("package_source", "pass", f"{repo.url} answered {code}{via}")
    return Check("package_source", "fail", f"{repo.url} unreachable from the host{via} (HTTP {code or 'none'})",
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


def mask_url(url: str | None) -> str | None:
    """A URL with any user:password replaced by ***."""
    return re.sub(r"//[^/@\s]+@", "//***@", url) if url else url


def run_preflight(conn, facts: dict, repo, stack: dict | None) -> list[Check]:
    """Probe the host (one read-only command) and evaluate every check."""
    command, stdin = probe_command(facts, repo)
    result = conn.run(command, stdin=stdin, timeout=60)
    return evaluate(facts, parse_probe(result.stdout), repo, stack)
