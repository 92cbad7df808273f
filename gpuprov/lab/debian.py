"""Real Debian packages for the lab mirror: Docker (`docker.io`), what `invoke monitoring` installs
(`prometheus-node-exporter`, `prometheus`), and what `invoke harden` and its judges use (`unattended-upgrades`,
`lynis`), with every dependency a bare lab host lacks, downloaded once on the controller with `apt-get download`;
and, for `invoke lab.up --slurm` only, Slurm and munge (SLURM_PACKAGES).

Lab hosts have no Debian mirror: the lab mirror is their only package source, so it serves these real .debs
beside the stand-ins. Which packages are needed is what apt itself would install on a lab host: an
`apt-get install --simulate --no-install-recommends` of DEBIAN_PACKAGES against the host image's own dpkg status
(read from the lab base image), using a private apt state under `.lab/debian/` whose only source is the Debian
suite the base image was built from (GPUPROV_LAB_DEBIAN_MIRROR, default deb.debian.org). The controller's own
apt configuration and state are not touched.

    ensure_debian_debs(paths, client, image) -> DebianDebs    download what is missing (cached by image)
    cached_debian_debs(paths, names) -> DebianDebs | None     the last download of `names`, without any network

The result is cached per base image (its image id) in `.lab/debian/<key>/manifest.json`; the .debs sit in
`.lab/debian/debs/` and are shared between keys. A warm `lab.up` reads the manifest and checks the files only.

RELEASES are the Debian releases lab hosts can run (`--profile NAME@RELEASE`, check_release): each is
debootstrapped into a base image of its own (images.base_tag(suite)); the mirror's packages are resolved for the
default release's hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuprov.core.digest import file_sha256
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.lab.state import LabPaths


@dataclass(frozen=True)
class Release:
    """A Debian release lab hosts can run: its version, the Python its python3 is, and the packages its base image
    adds to images.BASE_PACKAGES."""

    version: str
    python: str
    extra: tuple[str, ...] = ()


# The Debian releases a lab host can run (`invoke lab.up --profile NAME@RELEASE`), each debootstrapped from Debian
# into a base image of its own. bookworm is the default and the only release gpuprov provisions (the stack tables'
# debian-12); bullseye and trixie hosts run the suite on the oldest and newest Python a supported Debian ships. The
# lab mirror's Debian packages are bookworm's. Debian splits distutils out of Python 3.9 (python3-distutils), and
# pip needs it before 3.10 (pip/_internal/locations/_distutils.py): a bullseye server that runs pip has it.
RELEASES = {"bookworm": Release("12", "3.11"), "bullseye": Release("11", "3.9", ("python3-distutils",)),
            "trixie": Release("13", "3.13")}
DEFAULT_RELEASE = "bookworm"

# What lab hosts can install from the lab mirror besides the stand-ins.
DEBIAN_PACKAGES = ("docker.io", "prometheus-node-exporter", "prometheus", "unattended-upgrades", "lynis")
# What `invoke lab.up --slurm` installs on its hosts (slurm-wlm 22.05): resolved and downloaded only when asked, and
# served beside the mirror's repository (gpuprov.lab.slurm), so that a lab without Slurm neither fetches nor serves it.
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MANIFEST = "manifest.json"
_INST = re.compile(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class DebianDeb:
    """One downloaded Debian package."""

    name: str
    version: str
    path: Path
    sha256: str


@dataclass(frozen=True)
class DebianDebs:
    """The real Debian packages the mirror serves, and the cache key they were resolved for."""

    key: str
    debs: tuple[DebianDeb, ...]

    @property
    def paths(self) -> list[Path]:
        return [deb.path for deb in self.debs]

    def version(self, name: str) -> str | None:
        return next((deb.version for deb in self.debs if deb.name == name), None)

    def digest(self) -> str:
        """Hash of the package set (names, versions, file hashes): part of the mirror's digest."""
        text = "".join(f"{d.name}\0{d.version}\0{d.sha256}\n" for d in sorted(self.debs, key=lambda d: d.name))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_release(release: str, where: str) -> str:
    """`release` when lab hosts can run it; InputError naming `where` and the releases otherwise."""
    if release not in RELEASES:
        raise InputError(f"{where}: unknown Debian release {release!r}", step="lab.up",
                         hint=f"choose from: {', '.join(RELEASES)} (default {DEFAULT_RELEASE})")
    return release


def _quiet(_: str) -> None:
    """A progress sink that shows nothing."""


def root_dir(paths: LabPaths) -> Path:
    return paths.state_dir / "debian"


def debs_dir(paths: LabPaths) -> Path:
    return root_dir(paths) / "debs"


def cache_key(image_id: str, suite: str, mirror: str, arch: str, names: tuple[str, ...] = DEBIAN_PACKAGES) -> str:
    recipe = json.dumps([image_id, suite, mirror, arch, sorted(names)]).encode()
    return hashlib.sha256(recipe).hexdigest()[:12]


def parse_simulation(text: str) -> list[tuple[str, str]]:
    """(name, version) of every `Inst` line of `apt-get --simulate install` output, in apt's order."""
    return [(m.group(1), m.group(2)) for m in map(_INST.match, text.splitlines()) if m]


def _load(manifest: Path, debs: Path) -> DebianDebs | None:
    """The manifest's packages when every .deb is present with its size (None otherwise)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    out = []
    for item in data.get("debs", []):
        path = debs / item["file"]
        if not path.is_file() or path.stat().st_size != item["size"]:
            return None
        out.append(DebianDeb(item["name"], item["version"], path, item["sha256"]))
    return DebianDebs(data["key"], tuple(out)) if out else None


def _names(manifest: Path) -> list[str] | None:
    """The package names a manifest was resolved for (None when it cannot be read)."""
    try:
        return sorted(json.loads(manifest.read_text(encoding="utf-8")).get("names", []))
    except (OSError, ValueError, AttributeError):
        return None


def cached_debian_debs(paths: LabPaths, names: tuple[str, ...] = DEBIAN_PACKAGES) -> DebianDebs | None:
    """The most recently resolved set of `names` whose files are all present (no network, no engine)."""
    manifests = sorted(root_dir(paths).glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for manifest in manifests:
        if _names(manifest) != sorted(names):
            continue
        found = _load(manifest, debs_dir(paths))
        if found is not None:
            return found
    return None


class _Apt:
    """apt-get with a private state (lists, cache, status, sources) under one folder."""

    def __init__(self, home: Path, suite: str, mirror: str, arch: str):
        self.home, self.suite, self.mirror, self.arch = home, suite, mirror, arch

    def options(self) -> list[str]:
        home = self.home
        opts = {"Dir::State": home / "state", "Dir::State::Lists": home / "state/lists",
                "Dir::State::status": home / "status", "Dir::State::extended_states": home / "state/extended_states",
                "Dir::Cache": home / "cache", "Dir::Etc::SourceList": home / "sources.list",
                "Dir::Etc::SourceParts": "-", "Dir::Etc::Preferences": home / "preferences",
                "Dir::Etc::PreferencesParts": "-", "APT::Architecture": self.arch,
                "APT::Architectures": self.arch, "APT::Install-Recommends": "false",
                "APT::Install-Suggests": "false", "APT::Get::List-Cleanup": "false",
                "Debug::NoLocking": "true"}
        if os.geteuid() == 0:
            opts["APT::Sandbox::User"] = "root"
        return [arg for key, value in opts.items() for arg in ("-o", f"{key}={value}")]

    def prepare(self, status: bytes) -> None:
        for sub in ("state/lists/partial", "cache/archives/partial"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        (self.home / "status").write_bytes(status)
        (self.home / "preferences").write_text("", encoding="utf-8")
        (self.home / "sources.list").write_text(
            f"deb [signed-by={KEYRING}] {self.mirror} {self.suite} main\n", encoding="utf-8")

    def run(self, args: list[str], step: str, cwd: Path | None = None, timeout: int = 900) -> str:
        cmd = ["apt-get", *self.options(), *args]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
        env.pop("APT_CONFIG", None)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise GpuprovError(f"`apt-get {args[0]}` failed with exit code {proc.returncode}", step=step,
                               command=" ".join(cmd), output=proc.stdout + proc.stderr,
                               hint=f"check that {self.mirror} is reachable (GPUPROV_LAB_DEBIAN_MIRROR selects "
                                    "another mirror), then rerun `invoke lab.up`")
        return proc.stdout


def _image_status(client, image: str) -> bytes:
    """The dpkg status database of a lab image (what a bare lab host has installed)."""
    from gpuprov.lab.labels import LABELS

    return client.containers.run(image, ["cat", "/var/lib/dpkg/status"], remove=True, labels=LABELS,
                                 network_mode="none", entrypoint=[])


def ensure_debian_debs(paths: LabPaths, client, image: str, *, names: tuple[str, ...] = DEBIAN_PACKAGES,
                       progress: Progress = _quiet) -> DebianDebs:
    """The real Debian packages (`names` and what a host of `image` lacks for them), downloaded once."""
    from gpuprov.lab.images import MIRROR, SUITE
    from gpuprov.lab.mirror import machine_arch

    if shutil.which("apt-get") is None:
        raise GpuprovError("apt-get is not installed, so the lab mirror cannot fetch docker.io", step="lab mirror",
                           hint="run the lab on a Debian machine (the controller needs apt-get)")
    arch = machine_arch()
    image_id = client.images.get(image).id
    key = cache_key(image_id, SUITE, MIRROR, arch, names)
    home = root_dir(paths) / key
    pool = debs_dir(paths)
    cached = _load(home / MANIFEST, pool)
    if cached is not None:
        progress(f"mirror: {len(cached.debs)} Debian packages ({', '.join(names)} and dependencies) cached")
        return cached
    progress(f"mirror: resolving {', '.join(names)} against {image} with apt-get ({MIRROR} {SUITE})")
    apt = _Apt(home / "apt", SUITE, MIRROR, arch)
    apt.prepare(_image_status(client, image))
    apt.run(["-q", "update"], "lab mirror: apt-get update (Debian)")
    wanted = parse_simulation(apt.run(["-q", "--simulate", "--no-install-recommends", "install", *names],
                                      "lab mirror: apt-get --simulate install (Debian)"))
    if not wanted:
        raise GpuprovError(f"apt-get would install nothing for {', '.join(names)}", step="lab mirror",
                           hint=f"remove {home} and rerun `invoke lab.up`")
    pool.mkdir(parents=True, exist_ok=True)
    missing = [f"{name}={version}" for name, version in wanted if not _pool_file(pool, name, version, arch)]
    if missing:
        progress(f"mirror: downloading {len(missing)} Debian packages with apt-get download")
        apt.run(["-q", "download", *missing], "lab mirror: apt-get download (Debian)", cwd=pool)
    debs = []
    for name, version in wanted:
        path = _pool_file(pool, name, version, arch)
        if path is None:
            raise GpuprovError(f"apt-get download left no .deb for {name} {version}", step="lab mirror",
                               command=f"apt-get download {name}={version}", hint=f"look into {pool}")
        debs.append({"name": name, "version": version, "file": path.name, "size": path.stat().st_size,
                     "sha256": file_sha256(path)})
    home.mkdir(parents=True, exist_ok=True)
    (home / MANIFEST).write_text(json.dumps({"key": key, "image": image, "image_id": image_id, "suite": SUITE,
                                             "mirror": MIRROR, "arch": arch, "names": list(names), "debs": debs},
                                            indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(home / "apt" / "cache", ignore_errors=True)
    loaded = _load(home / MANIFEST, pool)
    assert loaded is not None
    progress(f"mirror: {len(loaded.debs)} Debian packages ready: "
             + ", ".join(f"{d.name} {d.version}" for d in loaded.debs))
    return loaded


def _pool_file(pool: Path, name: str, version: str, arch: str) -> Path | None:
    """The downloaded .deb of (name, version): apt-get download names it name_version_arch.deb, with the
    epoch's colon escaped as %3a."""
    plain = version.split(":", 1)[-1]
    for candidate in (f"{name}_{plain}_{arch}.deb", f"{name}_{plain}_all.deb",
                      f"{name}_{version.replace(':', '%3a')}_{arch}.deb",
                      f"{name}_{version.replace(':', '%3a')}_all.deb"):
        path = pool / candidate
        if path.is_file():
            return path
    return None
