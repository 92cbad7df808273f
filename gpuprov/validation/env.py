"""The suite's Python environment on a host: /opt/gpuprov/venv, built from a wheelhouse the controller makes.

The controller downloads the wheels for the host's Python, architecture and C library with `pip download`
(torch from the PyTorch index of the wheel variant, the rest through the controller's pip configuration) into
build/wheelhouse/<key>/ with a manifest of their SHA-256 digests, pushes the missing ones over SFTP, checks them
on the host, and installs them with `pip install --no-index --find-links`, so hosts need no package index (air
gapped hosts, the lab). The venv carries a marker with the digest of the wheel set and the Python it was built
for; a host whose marker matches is left alone, so a second run uploads and installs nothing.
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

MANIFEST = "wheelhouse.json"
ARCHES = ("x86_64", "aarch64")

# Runs on the host with its python3: what the wheelhouse must fit, and the markers of an earlier run.
PROBE = r"""
import json, platform, sys
def read(path):
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError:
        return None
libc, libc_version = platform.libc_ver()
print(json.dumps({"python": sys.executable, "version": "%d.%d" % sys.version_info[:2], "arch": platform.machine(),
                  "libc": libc, "glibc": libc_version, "marker": read(sys.argv[1]), "smoke": read(sys.argv[2])}))
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


def probe_host(remote, layout: Layout = LAYOUT) -> HostPython:
    """One command: the host's python3 (version, architecture, glibc) and the markers of the last run."""
    q = shlex.quote
    result = remote.run(f"command -v python3 >/dev/null || exit 127; python3 -c {q(PROBE)} {q(layout.marker)} "
                        f"{q(layout.smoke_marker)}", sudo=False, timeout=60, step="python env", check=False)
    if result.rc == 127:
        raise GpuprovError("the host has no python3", host=remote.name, step="python env",
                           hint="install python3 on the host (apt-get install python3), or run the suite in a "
                                "container image with --image")
    try:
        info = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise GpuprovError("cannot read the host's Python", host=remote.name, step="python env",
                           command=result.shown_command(), output=result.stderr or result.stdout) from None
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
    torch_index: str | None       # URL; None: the controller's pip configuration alone

    @property
    def gpu(self) -> bool:
        return self.wheel != "cpu"

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
        index = "" if not self.torch_index else "-" + hashlib.sha256(self.torch_index.encode()).hexdigest()[:8]
        return f"cp{self.python.replace('.', '')}-{self.arch}-glibc{self.glibc}-{self.wheel}-torch{version}{index}"

    def platforms(self) -> list[str]:
        """manylinux tags the host's glibc accepts, newest first."""
        major, minor = (int(part) for part in self.glibc.split(".")[:2])
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 16, -1)] if major == 2 else []
        return [*tags, f"manylinux2014_{self.arch}"]


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

    def digest(self, python: HostPython) -> str:
        """What the venv marker records: the wheel set, the requirements and the Python it was built with."""
        text = json.dumps({"files": sorted(self.files.items()), "requirements": self.requirements,
                           "python": [python.path, python.version]}, sort_keys=True)
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
    """The controller's `pip download` commands: torch from its index, then the rest and pip itself."""
    common = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:",
              "--python-version", request.python, "--implementation", "cp",
              "--abi", f"cp{request.python.replace('.', '')}", "--progress-bar", "off",
              "--disable-pip-version-check"]
    for platform in request.platforms():
        common += ["--platform", platform]
    torch = [*common, *(["--index-url", request.torch_index] if request.torch_index else []),
             request.torch_requirement()]
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
            for command in pip_download_commands(request, tmp):
                done = run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise GpuprovError(
                        f"pip download failed for {request.key()}", step="wheelhouse",
                        command=" ".join(shlex.quote(part) for part in command),
                        output=(done.stderr or done.stdout), hint=(
                            "the controller's pip needs an index with these wheels (pip config, or "
                            "validate.torch_index in the inventory); on an air-gapped controller, put the wheels "
                            f"into {folder}/ with a {MANIFEST} listing them"))
            files = {path.name: _sha256(path) for path in sorted(tmp.iterdir()) if path.suffix == ".whl"}
            wheelhouse = Wheelhouse(folder, files, request.requirements(), dataclasses.asdict(request))
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
    """The root script that builds the venv from the pushed wheels (a fresh venv: nothing stale stays)."""
    q = shlex.quote
    pip = f"{layout.wheelhouse}/{wheelhouse.pip_wheel}/pip"
    requirements = " ".join(q(r) for r in wheelhouse.requirements)
    return "\n".join([
        "set -e",
        f"rm -rf {q(layout.venv)}",
        f"{q(python.path)} -m venv --without-pip {q(layout.venv)}",
        f"{q(layout.python)} {q(pip)} install --isolated --no-index --find-links {q(layout.wheelhouse)} "
        f"--no-cache-dir --disable-pip-version-check --no-warn-script-location --quiet {requirements}",
        f"printf '%s\\n' {q(digest)} > {q(layout.marker)}",
    ])


def ensure_env(remote, python: HostPython, wheelhouse: Wheelhouse, layout: Layout = LAYOUT,
               say: Callable[[str], None] = lambda what: None) -> dict:
    """Make the host's venv match the wheel set: nothing when its marker says it does; else push the missing
    wheels, check every wheel's SHA-256 on the host, drop wheels of other sets, rebuild the venv, write the
    marker. Returns what was done (for the report)."""
    digest = wheelhouse.digest(python)
    done = {"venv": layout.venv, "wheelset": digest, "wheels": len(wheelhouse.files), "uploaded": [],
            "installed": False}
    if python.marker == digest:
        return done
    remote.user_folder(layout.wheelhouse)
    sftp = remote.sftp()
    present = {entry.filename: entry.st_size for entry in sftp.listdir_attr(layout.wheelhouse)}
    missing = [name for name in sorted(wheelhouse.files)
               if present.get(name) != (wheelhouse.folder / name).stat().st_size]
    if missing:
        say(f"upload {len(missing)} wheels")
    for name in missing:
        remote.put_file(wheelhouse.folder / name, f"{layout.wheelhouse}/{name}")
    done["uploaded"] = missing
    for name in sorted(set(present) - set(wheelhouse.files)):
        sftp.remove(f"{layout.wheelhouse}/{name}")
    sums = "".join(f"{sha}  {name}\n" for name, sha in sorted(wheelhouse.files.items()))
    check = remote.run(f"cd {shlex.quote(layout.wheelhouse)} && sha256sum -c --strict -", sudo=False, stdin=sums,
                       timeout=600, step="python env", check=False)
    if check.rc != 0:
        bad = [line.rsplit(":", 1)[0] for line in check.stdout.splitlines() if not line.endswith(": OK")]
        for name in bad:
            if name in wheelhouse.files:
                sftp.remove(f"{layout.wheelhouse}/{name}")
        raise GpuprovError(f"wheels differ from the controller's after upload: {', '.join(bad) or check.stderr}",
                           host=remote.name, step="python env",
                           hint="they were removed from the host; rerun to upload them again")
    say("install the Python environment")
    remote.run("sh -s", stdin=install_script(python, wheelhouse, digest, layout), timeout=1800,
               step="python env", hint="the wheels may not fit the host's Python: remove the wheelhouse folder on "
                                       "the controller to download them again")
    done["installed"] = True
    return done
