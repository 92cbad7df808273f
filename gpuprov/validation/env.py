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
run uploads and installs nothing.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.validation import LAYOUT, Layout
from gpuprov.validation.remote import INSECURE, SECURE

MANIFEST = "wheelhouse.json"
ARCHES = ("x86_64", "aarch64")
SCHEME = 2          # in the venv marker: venvs built before wheels were pinned and checked as root are rebuilt
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"   # where root looks for python3 (never the SSH user's PATH)
MIN_PYTHON = (3, 9)   # the oldest the suite runs on: RHEL/Rocky 9's (tests/unit/test_host_python_versions.py)

# Runs on the host as root with the checked python3 (-I: no environment, no user site, no current folder on
# sys.path): what the wheelhouse must fit, and the markers of an earlier run.
PROBE = r"""
import json, os, platform, sys
def read(path):
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError:
        return None
libc, libc_version = platform.libc_ver()
print(json.dumps({"python": os.path.realpath(sys.executable), "version": "%d.%d" % sys.version_info[:2],
                  "arch": platform.machine(), "libc": libc, "glibc": libc_version, "marker": read(sys.argv[1]),
                  "smoke": read(sys.argv[2])}))
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
class HostPython:
    """The host's python3 and what an earlier run left (the venv's and the suite's markers)."""

    path: str
    version: str
    arch: str
    glibc: str
    marker: str | None = None
    smoke_digest: str | None = None


def probe_command(layout: Layout = LAYOUT) -> str:
    """The probe, as root: python3 from the system PATH, used only when it and every folder above it (through
    its symlinks) are root's alone."""
    q = shlex.quote
    return "\n".join([
        SECURE, f"p=$(PATH={SYSTEM_PATH} command -v python3) || exit 127", 'r=$(readlink -f -- "$p")',
        f'why=$(secure "$p") && why=$(secure "$r") || {{ echo "refused: $p: $why" >&2; exit {INSECURE}; }}',
        f'exec "$r" -I -c {q(PROBE)} {q(layout.marker)} {q(layout.smoke_marker)}'])


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
    return HostPython(path=info["python"], version=info["version"], arch=info["arch"], glibc=info["glibc"],
                      marker=info["marker"], smoke_digest=info["smoke"])


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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
            files = {path.name: _sha256(path) for path in sorted(tmp.iterdir()) if path.suffix == ".whl"}
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
        f"--quiet -r {q(requirements)}",
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
    remote.root_folder(layout.root, step="python env")
    remote.user_folder(layout.incoming)
    hint = (f"{{what}}: root never installs it. Check who can write {layout.incoming} on the host "
            "(the SSH user's upload folder), then rerun to upload the wheels again")
    staged = stage_wheels(remote, python, wheelhouse, layout)
    if staged["bad"]:
        raise GpuprovError(f"wheels in the upload folder differ from the controller's: {', '.join(staged['bad'])}",
                           host=remote.name, step="python env", hint=hint.format(what="they were removed"))
    missing = staged["missing"]
    if missing:
        say(f"upload {len(missing)} wheels")
        for name in missing:
            remote.put_file(wheelhouse.folder / name, f"{layout.incoming}/{name}")
        staged = stage_wheels(remote, python, wheelhouse, layout)
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
    return done
