"""The suite's Python environment on a host: /opt/gpuprov/venv, built from a wheelhouse the controller makes.

The controller downloads the wheels for the host's Python, architecture and C library with `pip download`
(torch from the PyTorch index of the wheel variant, the rest through the controller's pip configuration) into
build/wheelhouse/<key>/ with a manifest of their SHA-256 digests (an index's credentials travel in pip's
environment, never on a command line or into the manifest). Hosts need no package index (air gapped hosts,
the lab).

On the host the SSH user steers nothing root runs: root finds python3 on a fixed PATH and uses it only when it
and every folder above it are root's alone; the missing wheels go over SFTP into the SSH user's upload folder,
and root copies each into the root-only wheelhouse (0700) checking its SHA-256, then installs every wheel pinned
to its exact version and digest (`pip install --require-hashes --no-index`). The venv carries a marker with the
digest of the wheel set and the Python it was built for; a host whose marker matches is left alone, so a second
run uploads and installs nothing. pip installs without byte-compiling, then `compileall -j 0` compiles the venv on
every core (pip compiles one file after another), so that the suite, run with -B, imports from .pyc files.

torch.compile (train.compile, the compile half of infer.parity) needs what TorchInductor runs: `g++` (its CPU code,
torch._inductor.config.cpp.cxx) and the interpreter's Python.h (`#include <Python.h>` in its generated modules, from
sysconfig's include path), and a C compiler (Triton's launcher on GPUs). When those checks are selected and the
host lacks any, root installs them from the distribution's own repositories (compiler_plan: apt-get gcc g++
pythonX.Y-dev on Debian/Ubuntu, dnf gcc gcc-c++ and the interpreter package's -devel on RHEL), or says why it cannot
(no such package manager, no package source offers them): the checks then skip naming what is missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.digest import file_sha256
from gpuprov.core.errors import GpuprovError
from gpuprov.validation import LAYOUT, Layout
from gpuprov.validation.remote import INSECURE, SECURE

MANIFEST = "wheelhouse.json"
ARCHES = ("x86_64", "aarch64")
SCHEME = 2          # in the venv marker: venvs built before wheels were pinned and checked as root are rebuilt
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"   # where root looks for python3 (never the SSH user's PATH)
MIN_PYTHON = (3, 9)   # the oldest the suite runs on: RHEL/Rocky 9's (tests/unit/test_host_python_versions.py)
COMPILE_CHECKS = ("train.compile", "infer.parity")   # the checks that run torch.compile
COMPILE_SKIP = r"/tests?/"   # not byte-compiled at install: the wheels' own test suites (torch._dynamo imports
                             # torch/testing/_internal, so that is compiled)

# Runs on the host as root with the checked python3 (-I: no environment, no user site, no current folder on
# sys.path): what the wheelhouse must fit, and the markers of an earlier run.
PROBE = r"""
import json, os, platform, shutil, subprocess, sys, sysconfig
def read(path):
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError:
        return None
def which(*names):
    for name in names:
        found = shutil.which(name, path=sys.argv[3])
        if found:
            return found
    return None
def os_release():
    found = {}
    for line in (read("/etc/os-release") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip().strip("'\"")
    return found
def rpm_owner(path):
    rpm = which("rpm")
    if rpm is None:
        return None
    try:
        done = subprocess.run([rpm, "-qf", "--qf", "%{NAME}", path], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None
libc, libc_version = platform.libc_ver()
python = os.path.realpath(sys.executable)
include = sysconfig.get_path("include") or ""
release = os_release()
print(json.dumps({"python": python, "version": "%d.%d" % sys.version_info[:2],
                  "arch": platform.machine(), "libc": libc, "glibc": libc_version, "marker": read(sys.argv[1]),
                  "smoke": read(sys.argv[2]),
                  "toolchain": {"cc": which("gcc", "cc"), "cxx": which("g++"), "include": include,
                                "headers": os.path.isfile(os.path.join(include, "Python.h")),
                                "os": release.get("ID", ""), "like": release.get("ID_LIKE", ""),
                                "managers": [name for name in ("apt-get", "dnf", "yum") if which(name)],
                                "rpm": rpm_owner(python)}}))
"""

# Runs as root with the checked python3: each wheel of the set (stdin: {name: sha256}) into the root-only
# wheelhouse, copied from the SSH user's upload folder (never following a symlink, regular files only) and
# checked on the copy; wheels of other sets dropped. Prints what is still missing and what arrived damaged.
STAGE = r"""
import errno, hashlib, json, os, stat, sys
house, incoming = sys.argv[1], sys.argv[2]
files = json.load(sys.stdin)
st = os.lstat(house) if os.path.lexists(house) else None
if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o700:
    if st is not None and stat.S_ISDIR(st.st_mode):
        import shutil
        shutil.rmtree(house)
    elif st is not None:
        os.unlink(house)
    os.mkdir(house, 0o700)
    os.chmod(house, 0o700)
def sha(fd):
    digest = hashlib.sha256()
    for block in iter(lambda: os.read(fd, 1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()
missing, bad = [], []
for name, want in sorted(files.items()):
    target = os.path.join(house, name)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            if sha(fd) == want:
                continue
        finally:
            os.close(fd)
    except OSError:
        pass
    source = os.path.join(incoming, name)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        (bad if exc.errno == errno.ELOOP else missing).append(name)
        if exc.errno == errno.ELOOP:
            os.unlink(source)
        continue
    part = target + ".part"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            bad.append(name)
            continue
        out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        digest = hashlib.sha256()
        try:
            for block in iter(lambda: os.read(fd, 1 << 20), b""):
                digest.update(block)
                os.write(out, block)
        finally:
            os.close(out)
        if digest.hexdigest() == want:
            os.replace(part, target)
        else:
            bad.append(name)
    finally:
        os.close(fd)
        for leftover in (part, source):
            try:
                os.unlink(leftover)
            except OSError:
                pass
for name in os.listdir(house):
    if name not in files:
        path = os.path.join(house, name)
        os.unlink(path) if not os.path.isdir(path) or os.path.islink(path) else __import__("shutil").rmtree(path)
print(json.dumps({"missing": missing, "bad": bad}))
"""


@dataclass(frozen=True)
class Toolchain:
    """What torch.compile finds on the host (on the system PATH) and how the host installs packages."""

    cc: str | None = None          # gcc or cc: Triton's launcher
    cxx: str | None = None         # g++: TorchInductor's CPU code (torch._inductor.config.cpp.cxx)
    include: str = ""              # the interpreter's include folder (sysconfig), where Python.h belongs
    headers: bool = False          # Python.h is there
    os_id: str = ""                # /etc/os-release ID and ID_LIKE
    os_like: str = ""
    managers: tuple[str, ...] = ()   # apt-get, dnf, yum found
    rpm: str | None = None         # the rpm package the interpreter belongs to (RHEL: python3, python3.11)


@dataclass(frozen=True)
class HostPython:
    """The host's python3 and what an earlier run left (the venv's and the suite's markers)."""

    path: str
    version: str
    arch: str
    glibc: str
    marker: str | None = None
    smoke_digest: str | None = None
    toolchain: Toolchain = field(default_factory=Toolchain)


def probe_command(layout: Layout = LAYOUT) -> str:
    """The probe, as root: python3 from the system PATH, used only when it and every folder above it (through
    its symlinks) are root's alone."""
    q = shlex.quote
    return "\n".join([
        SECURE, f"p=$(PATH={SYSTEM_PATH} command -v python3) || exit 127", 'r=$(readlink -f -- "$p")',
        f'why=$(secure "$p") && why=$(secure "$r") || {{ echo "refused: $p: $why" >&2; exit {INSECURE}; }}',
        f'exec "$r" -I -c {q(PROBE)} {q(layout.marker)} {q(layout.smoke_marker)} {q(SYSTEM_PATH)}'])


def probe_host(remote, layout: Layout = LAYOUT) -> HostPython:
    """One root command: the host's python3 (version, architecture, glibc) and the markers of the last run."""
    result = remote.run(probe_command(layout), timeout=60, step="python env", check=False)
    if result.rc == 127:
        raise GpuprovError(f"the host has no python3 on the system PATH ({SYSTEM_PATH})", host=remote.name,
                           step="python env", hint="install python3 on the host (apt-get install python3), or run "
                                                   "the suite in a container image with --image")
    if result.rc == INSECURE:
        raise GpuprovError(f"the host's python3 is not root's alone, so root does not run it: "
                           f"{result.stderr.strip().removeprefix('refused: ')}", host=remote.name,
                           step="python env", command=result.shown_command(),
                           hint="install python3 from the distribution (apt-get install python3) so that it and "
                                "every folder above it are owned by root and writable by root alone")
    try:
        info = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise GpuprovError("cannot read the host's Python", host=remote.name, step="python env",
                           command=result.shown_command(), output=result.stderr or result.stdout) from None
    if tuple(int(part) for part in info["version"].split(".")) < MIN_PYTHON:
        oldest = ".".join(map(str, MIN_PYTHON))
        raise GpuprovError(f"the host's python3 is Python {info['version']} ({info['python']}); the suite needs "
                           f"Python {oldest} or newer", host=remote.name, step="python env",
                           command=result.shown_command(),
                           hint=f"make python3 on the system PATH ({SYSTEM_PATH}) a Python {oldest} or newer from "
                                "the distribution (RHEL/Rocky 8: dnf install python39, then alternatives --set "
                                "python3 /usr/bin/python3.9), or run the suite in a container image with --image")
    if info["libc"] != "glibc" or not info["glibc"]:
        raise GpuprovError(f"the host's Python is not built on glibc ({info['libc'] or 'unknown C library'}): "
                           "PyTorch publishes manylinux wheels only", host=remote.name, step="python env",
                           hint="run the suite in a container image with --image")
    if info["arch"] not in ARCHES:
        raise GpuprovError(f"unsupported architecture {info['arch']} (PyTorch wheels exist for "
                           f"{', '.join(ARCHES)})", host=remote.name, step="python env")
    tools = info["toolchain"]
    toolchain = Toolchain(cc=tools["cc"], cxx=tools["cxx"], include=tools["include"], headers=tools["headers"],
                          os_id=tools["os"], os_like=tools["like"], managers=tuple(tools["managers"]),
                          rpm=tools["rpm"])
    return HostPython(path=info["python"], version=info["version"], arch=info["arch"], glibc=info["glibc"],
                      marker=info["marker"], smoke_digest=info["smoke"], toolchain=toolchain)


# ------------------------------------------------------------------------------- torch.compile's toolchain

def compiler_wanted(only: tuple[str, ...] | list[str] | None) -> bool:
    """Whether the selected checks (--only's names and groups, the runner's matching; None: all) run
    torch.compile."""
    return only is None or any(name == token or name.startswith(token + ".")
                               for token in only for name in COMPILE_CHECKS)


@dataclass(frozen=True)
class CompilerPlan:
    """What torch.compile lacks on a host and the packages root installs for it; `refused` says why it cannot."""

    missing: tuple[str, ...] = ()     # "g++", "gcc", "Python.h"
    packages: tuple[str, ...] = ()
    manager: str = ""                 # apt-get | dnf | yum
    refused: str = ""

    @property
    def command(self) -> str:
        """The root command that installs the packages (non-interactive, no recommended or weak extras)."""
        names = " ".join(shlex.quote(name) for name in self.packages)
        if self.manager == "apt-get":
            return ("DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 install "
                    f"--no-install-recommends {names}")
        return f"{self.manager} -q -y install --setopt=install_weak_deps=False {names}" if self.manager else ""

    def to_dict(self) -> dict:
        return {"missing": list(self.missing), "packages": list(self.packages), "command": self.command,
                "refused": self.refused}


DEBIAN_FAMILY = {"debian", "ubuntu"}
RHEL_FAMILY = {"rhel", "centos", "fedora", "rocky", "almalinux"}


def compiler_plan(python: HostPython) -> CompilerPlan:
    """The distribution's packages for what torch.compile lacks on the host: g++ (TorchInductor's CPU code),
    gcc (Triton's launcher) and the headers of exactly the host's interpreter (python3.X-dev on Debian and
    Ubuntu; the -devel of the rpm package the interpreter belongs to on RHEL)."""
    tools = python.toolchain
    missing = tuple(what for what, found in (("g++", tools.cxx), ("gcc", tools.cc), ("Python.h", tools.headers))
                    if not found)
    if not missing:
        return CompilerPlan()
    family = set(f"{tools.os_id} {tools.os_like}".split())
    if "apt-get" in tools.managers and family & DEBIAN_FAMILY:
        names, manager = {"g++": "g++", "gcc": "gcc", "Python.h": f"python{python.version}-dev"}, "apt-get"
    elif {"dnf", "yum"} & set(tools.managers) and family & RHEL_FAMILY:
        if "Python.h" in missing and not tools.rpm:
            return CompilerPlan(missing, refused=f"{python.path} belongs to no rpm package, so no -devel package "
                                                 f"has its Python.h (wanted in {tools.include})")
        names = {"g++": "gcc-c++", "gcc": "gcc", "Python.h": f"{tools.rpm}-devel"}
        manager = "dnf" if "dnf" in tools.managers else "yum"
    else:
        return CompilerPlan(missing, refused=(
            f"gpuprov installs compilers with apt-get on Debian/Ubuntu and dnf or yum on RHEL-like systems; this host "
            f"is {tools.os_id or 'of an unknown distribution'} with {', '.join(tools.managers) or 'none of them'}"))
    return CompilerPlan(missing, tuple(names[what] for what in missing), manager)


def env_plan(python: HostPython, wheelhouse: Wheelhouse, only: tuple[str, ...] | None,
             layout: Layout = LAYOUT) -> dict:
    """What the environment step would do on the host (validate --dry-run): build the venv or keep it, and the
    packages torch.compile's toolchain needs with the command that installs them (or why it cannot). Changes
    nothing."""
    digest = wheelhouse.digest(python)
    plan = {"dry_run": True, "venv": layout.venv, "wheelset": digest, "wheels": len(wheelhouse.files),
            "build": python.marker != digest}
    if compiler_wanted(only):
        plan["compiler"] = compiler_plan(python).to_dict()
    return plan


def plan_lines(host: str, env: dict) -> list[str]:
    """validate --dry-run's lines for one host's environment plan."""
    if env.get("mode") == "image":
        return [f"{host}: the suite runs in {env['image']}: nothing is installed on the host"]
    lines = [f"{host}: {env['venv']}: " + (f"build from {env['wheels']} wheels ({env['request']}; root's wheelhouse "
                                           "takes the ones it lacks over SFTP)" if env["build"] else
                                           f"kept (built from this wheel set, {env['wheelset'][:12]})")]
    compiler = env.get("compiler")
    if compiler is not None:
        lines.append(f"{host}: torch.compile: " + (
            f"cannot install {', '.join(compiler['missing'])}: {compiler['refused']}" if compiler["refused"] else
            f"install {' '.join(compiler['packages'])}: {compiler['command']}" if compiler["packages"] else
            "g++, gcc and Python.h are there"))
    return lines


# apt-get's words for a package no configured source offers (or lists older than the source)
NOT_OFFERED = ("Unable to locate package", "has no installation candidate", "404  Not Found", "404 Not Found")


def ensure_compiler(remote, python: HostPython, layout: Layout = LAYOUT,
                    say: Callable[[str], None] = lambda what: None) -> dict:
    """Install what torch.compile lacks (compiler_plan), then check it is there. A host that cannot install it
    (no known package manager, no source offering the packages) is not an error: the report says why, and the
    compile checks skip naming what is missing. Also makes the suite's root-only compile cache (layout.root/
    cache, where the checks keep TorchInductor's kernels instead of /tmp, which others can write)."""
    remote.root_folder(f"{layout.root}/cache", mode="0700", step="compiler")
    plan = compiler_plan(python)
    done = {**plan.to_dict(), "installed": []}
    if not plan.missing or plan.refused:
        if plan.refused:
            say(f"torch.compile's toolchain not installed: {plan.refused}")
        return done
    say(f"install {' '.join(plan.packages)} (torch.compile)")
    q = shlex.quote
    headers = f"{python.toolchain.include}/Python.h"
    checks = [(f"PATH={SYSTEM_PATH} command -v {tool} >/dev/null", tool) for tool in ("g++", "gcc")]
    checks.append((f"test -f {q(headers)}", headers))
    command = "\n".join(["set -e", plan.command, *(f"{test} || {{ echo {q(f'E: no {what} after the install')} >&2; "
                                                    "exit 1; }" for test, what in checks)])
    started = time.monotonic()
    result = remote.run(command, timeout=1800, step="compiler", check=False)
    if result.rc != 0 and plan.manager == "apt-get" and any(word in result.stderr + result.stdout
                                                            for word in NOT_OFFERED):
        say("apt-get update (the package lists offer no such package)")
        remote.run("apt-get -q -o DPkg::Lock::Timeout=300 update", timeout=600, step="compiler", check=False)
        result = remote.run(command, timeout=1800, step="compiler", check=False)
    if result.rc != 0:
        lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(("E:", "Error:", "No match"))] or lines[-1:]
        done["refused"] = f"`{plan.command}` failed (exit {result.rc}): {'; '.join(errors[-2:]) or 'no output'}"
        say(f"torch.compile's toolchain not installed: {done['refused']}")
        return done
    done["installed"] = list(plan.packages)
    done["seconds"] = round(time.monotonic() - started, 3)
    return done


@dataclass(frozen=True)
class WheelRequest:
    """What a host's venv needs: torch of a wheel variant and release, numpy, onnx and ONNX Runtime, for one
    Python version, architecture and glibc."""

    python: str                   # "3.11"
    arch: str                     # "x86_64" | "aarch64"
    glibc: str                    # "2.36"
    wheel: str                    # "cpu" | "cu128" | ...
    torch_version: str | None     # "2.7" | "2.7.1" | None (what the index has newest)
    torch_index: str | None = field(repr=False)   # URL (credentials too); None: the controller's pip config

    @property
    def gpu(self) -> bool:
        return self.wheel != "cpu"

    @property
    def index_shown(self) -> str | None:
        """The torch index without its credentials (what reports, folder names and the manifest carry)."""
        return strip_userinfo(self.torch_index) if self.torch_index else self.torch_index

    def pip_env(self) -> dict[str, str]:
        """pip's environment for the torch download: the index (and its credentials) never on a command line."""
        return {"PIP_INDEX_URL": self.torch_index} if self.torch_index else {}

    def torch_requirement(self) -> str:
        if not self.torch_version:
            return "torch"
        return f"torch=={self.torch_version}" + (".*" if self.torch_version.count(".") == 1 else "")

    def requirements(self) -> list[str]:
        """What is installed into the venv (pip itself runs from its wheel and is not installed)."""
        return [self.torch_requirement(), "numpy", "onnx", "onnxruntime-gpu" if self.gpu else "onnxruntime"]

    def key(self) -> str:
        """The wheelhouse folder's name: everything the downloaded set depends on."""
        version = self.torch_version or "latest"
        index = "" if not self.torch_index else "-" + hashlib.sha256(self.index_shown.encode()).hexdigest()[:8]
        return f"cp{self.python.replace('.', '')}-{self.arch}-glibc{self.glibc}-{self.wheel}-torch{version}{index}"

    def platforms(self) -> list[str]:
        """manylinux tags the host's glibc accepts, newest first."""
        major, minor = (int(part) for part in self.glibc.split(".")[:2])
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 16, -1)] if major == 2 else []
        return [*tags, f"manylinux2014_{self.arch}"]


def strip_userinfo(url: str) -> str:
    """`url` without `user:password@` (an index's credentials)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _secrets_of(url: str | None) -> list[str]:
    from urllib.parse import unquote, urlsplit

    if not url:
        return []
    parts = urlsplit(url)
    secret = parts.password or parts.username   # a token alone comes as the user name
    return [secret, unquote(secret)] if secret else []


def wheel_pin(name: str) -> tuple[str, str]:
    """(project, version) of a wheel file name (PEP 427: NAME-VERSION(-BUILD)?-PY-ABI-PLATFORM.whl)."""
    parts = name[:-len(".whl")].split("-")
    if not name.endswith(".whl") or len(parts) not in (5, 6):
        raise GpuprovError(f"{name} is not a wheel file name", step="wheelhouse")
    return parts[0].replace("_", "-").lower(), parts[1]


@dataclass
class Wheelhouse:
    """A downloaded wheel set on the controller: its folder, {file: sha256}, and what to install from it."""

    folder: Path
    files: dict[str, str]
    requirements: list[str]
    request: dict = field(default_factory=dict)

    @property
    def pip_wheel(self) -> str:
        wheels = sorted(name for name in self.files if name.startswith("pip-") and name.endswith(".whl"))
        if not wheels:
            raise GpuprovError(f"{self.folder} has no pip wheel", step="wheelhouse",
                               hint=f"remove {self.folder} so that the next run downloads it again")
        return wheels[-1]

    def pins(self) -> list[str]:
        """The requirements file root installs from: every wheel but pip, at its exact version and digest."""
        by_project: dict[str, list[tuple[str, str]]] = {}
        for name, sha in sorted(self.files.items()):
            if not name.startswith("pip-"):
                project, version = wheel_pin(name)
                by_project.setdefault(project, []).append((version, sha))
        lines = []
        for project, found in sorted(by_project.items()):
            versions = sorted({version for version, _ in found})
            if len(versions) > 1:
                raise GpuprovError(f"{self.folder} holds {project} in {len(versions)} versions ({', '.join(versions)})"
                                   ": one version of each project can be pinned", step="wheelhouse",
                                   hint=f"remove {self.folder} so that the next run downloads it again")
            lines.append(f"{project}=={versions[0]} " + " ".join(f"--hash=sha256:{sha}" for _, sha in found))
        return lines

    def digest(self, python: HostPython) -> str:
        """What the venv marker records: the wheel set, the requirements and the Python it was built with."""
        text = json.dumps({"files": sorted(self.files.items()), "requirements": self.requirements,
                           "python": [python.path, python.version], "scheme": SCHEME}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def request_for(python: HostPython, wheel: str | None, torch_version: str | None,
                torch_index: str | None) -> WheelRequest:
    """The wheel request of a host: `torch_index` None means the PyTorch index of the variant, "" none."""
    from gpuprov.validation.suite_config import TORCH_INDEX

    wheel = wheel or "cpu"
    version = None if torch_version in (None, "latest") else torch_version
    index = TORCH_INDEX.format(wheel=wheel) if torch_index is None else (torch_index or None)
    return WheelRequest(python=python.version, arch=python.arch, glibc=python.glibc, wheel=wheel,
                        torch_version=version, torch_index=index)


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def load_wheelhouse(folder: Path) -> Wheelhouse | None:
    """A wheelhouse folder with its manifest, or None when there is none (or it is incomplete)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = manifest.get("files") or {}
    if not files or not all((folder / name).is_file() for name in files):
        return None
    return Wheelhouse(folder, dict(files), list(manifest.get("requirements") or []), manifest.get("request") or {})


def pip_download_commands(request: WheelRequest, dest: Path) -> list[list[str]]:
    """The controller's `pip download` commands: torch from its index (in pip's environment, request.pip_env),
    then the rest and pip itself."""
    common = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:",
              "--python-version", request.python, "--implementation", "cp",
              "--abi", f"cp{request.python.replace('.', '')}", "--progress-bar", "off",
              "--disable-pip-version-check"]
    for platform in request.platforms():
        common += ["--platform", platform]
    torch = [*common, request.torch_requirement()]
    return [torch, [*common, *request.requirements()[1:], "pip"]]


def wheelhouse_for(request: WheelRequest, root: Path, say: Callable[[str], None] = lambda what: None,
                   run: Callable = subprocess.run) -> Wheelhouse:
    """The wheelhouse for a request, downloaded once into root/<key>/ (later runs reuse it; remove the folder
    to download again). Hosts of the same kind share it; a download in progress is waited for."""
    folder = Path(root) / request.key()
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(str(folder), threading.Lock())
    with lock:
        found = load_wheelhouse(folder)
        if found is not None:
            return found
        say(f"download wheels ({request.key()})")
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
        try:
            for number, command in enumerate(pip_download_commands(request, tmp)):
                extra = request.pip_env() if number == 0 else {}
                done = run(command, capture_output=True, text=True, check=False, env={**os.environ, **extra})
                if done.returncode != 0:
                    output = done.stderr or done.stdout
                    for secret in _secrets_of(request.torch_index):
                        output = output.replace(secret, "****")
                    raise GpuprovError(
                        f"pip download failed for {request.key()}", step="wheelhouse",
                        command=" ".join(shlex.quote(part) for part in command) + (
                            f"  (index {request.index_shown}, from PIP_INDEX_URL)" if extra else ""),
                        output=output, hint=(
                            "the controller's pip needs an index with these wheels (pip config, or "
                            "validate.torch_index in the inventory); on an air-gapped controller, put the wheels "
                            f"into {folder}/ with a {MANIFEST} listing them"))
            files = {path.name: file_sha256(path) for path in sorted(tmp.iterdir()) if path.suffix == ".whl"}
            wheelhouse = Wheelhouse(folder, files, request.requirements(),
                                    dataclasses.asdict(request) | {"torch_index": request.index_shown})
            (tmp / MANIFEST).write_text(json.dumps({"request": wheelhouse.request, "requirements":
                                                    wheelhouse.requirements, "files": files}, indent=2,
                                                   sort_keys=True), encoding="utf-8")
            if folder.exists():   # an incomplete folder from an interrupted run
                stale = folder.with_name(f".{folder.name}.stale-{os.getpid()}")
                folder.rename(stale)
                _remove_tree(stale)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                _remove_tree(tmp)
        return load_wheelhouse(folder) or wheelhouse


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def install_script(python: HostPython, wheelhouse: Wheelhouse, digest: str, layout: Layout = LAYOUT) -> str:
    """The root script that builds the venv from the root-only wheelhouse (a fresh venv: nothing stale stays):
    every wheel pinned to its version and SHA-256, which pip checks again as it installs."""
    q = shlex.quote
    pip = f"{layout.wheelhouse}/{wheelhouse.pip_wheel}/pip"
    requirements = f"{layout.wheelhouse}/.requirements"
    return "\n".join([
        "set -e",
        "umask 022",
        f"cat > {q(requirements)} <<'GPUPROV-PINS'",
        *wheelhouse.pins(),
        "GPUPROV-PINS",
        f"rm -rf {q(layout.venv)}",
        f"{q(python.path)} -I -m venv --without-pip {q(layout.venv)}",
        f"{q(layout.python)} -I {q(pip)} install --isolated --no-index --find-links {q(layout.wheelhouse)} "
        f"--require-hashes --only-binary=:all: --no-cache-dir --disable-pip-version-check --no-warn-script-location "
        f"--no-compile --quiet -r {q(requirements)}",
        # every core compiles (pip compiles one file after another), the packages' own test suites left out (the
        # suite never imports them); a file this Python cannot compile stays source, as pip leaves it
        f"{q(layout.python)} -I -m compileall -qq -j 0 -x {q(COMPILE_SKIP)} {q(layout.venv + '/lib')} || :",
        f"rm -f {q(requirements)}",
        f"printf '%s\\n' {q(digest)} > {q(layout.marker)}",
    ])


def stage_wheels(remote, python: HostPython, wheelhouse: Wheelhouse, layout: Layout = LAYOUT) -> dict:
    """Root copies the set's wheels from the SSH user's upload folder into the root-only wheelhouse, checking
    each copy's SHA-256 ({"missing": [...], "bad": [...]})."""
    q = shlex.quote
    result = remote.run(f"{q(python.path)} -I -c {q(STAGE)} {q(layout.wheelhouse)} {q(layout.incoming)}",
                        stdin=json.dumps(wheelhouse.files), timeout=900, step="python env")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise GpuprovError("cannot read what staging the wheels did", host=remote.name, step="python env",
                           command=result.shown_command(), output=result.stderr or result.stdout) from None


def ensure_env(remote, python: HostPython, wheelhouse: Wheelhouse, layout: Layout = LAYOUT,
               say: Callable[[str], None] = lambda what: None) -> dict:
    """Make the host's venv match the wheel set: nothing when its marker says it does; else root takes the
    wheels it lacks from the SSH user's upload folder (pushing the missing ones there first), checking each one's
    SHA-256 on its own copy, drops wheels of other sets, rebuilds the venv with every wheel pinned, writes the
    marker. Returns what was done (for the report)."""
    digest = wheelhouse.digest(python)
    done = {"venv": layout.venv, "wheelset": digest, "wheels": len(wheelhouse.files), "uploaded": [],
            "installed": False}
    if python.marker == digest:
        return done
    marks = {"started": time.monotonic()}
    remote.root_folder(layout.root, step="python env")
    remote.user_folder(layout.incoming)
    hint = (f"{{what}}: root never installs it. Check who can write {layout.incoming} on the host "
            "(the SSH user's upload folder), then rerun to upload the wheels again")
    staged = stage_wheels(remote, python, wheelhouse, layout)
    if staged["bad"]:
        raise GpuprovError(f"wheels in the upload folder differ from the controller's: {', '.join(staged['bad'])}",
                           host=remote.name, step="python env", hint=hint.format(what="they were removed"))
    missing = staged["missing"]
    marks["staged"] = time.monotonic()
    if missing:
        say(f"upload {len(missing)} wheels")
        for name in missing:
            remote.put_file(wheelhouse.folder / name, f"{layout.incoming}/{name}")
        marks["uploaded"] = time.monotonic()
        staged = stage_wheels(remote, python, wheelhouse, layout)
    marks["checked"] = time.monotonic()
    done["uploaded"] = missing
    if staged["bad"] or staged["missing"]:
        raise GpuprovError("wheels differ from the controller's after upload: "
                           f"{', '.join(staged['bad'] + staged['missing'])}", host=remote.name, step="python env",
                           hint=hint.format(what="they were removed"))
    say("install the Python environment")
    remote.run("sh -s", stdin=install_script(python, wheelhouse, digest, layout), timeout=1800,
               step="python env", hint="the wheels may not fit the host's Python: remove the wheelhouse folder on "
                                       "the controller to download them again")
    done["installed"] = True
    marks["installed"] = time.monotonic()
    uploaded = marks.get("uploaded", marks["staged"])
    done["seconds"] = {"stage": round(marks["staged"] - marks["started"] + marks["checked"] - uploaded, 3),
                       "upload": round(uploaded - marks["staged"], 3),
                       "install": round(marks["installed"] - marks["checked"], 3)}
    return done
