"""The lab mirror: a signed flat apt repository of stand-in packages and real Debian packages (docker.io,
prometheus-node-exporter, unattended-upgrades, lynis, the compilers and Python headers torch.compile needs, and
what a bare lab host lacks for them, see gpuprov.lab.debian), served over HTTP by a lab container on the lab's
internal network (`deb [signed-by=...] http://<ip>/ /`). `invoke validate` installs gcc, g++ and python3.X-dev
from it on lab hosts as it does on a real host from the distribution's repository (gpuprov.validation.env).

The repository also carries a newer point release of every lab profile's newest driver branch
(`standins.point_release_packages`: `595.58.03-1` and `595.999.01-1` of the same packages), as NVIDIA's
repository carries every point release of a branch. apt (2.6) installs an older metapackage version
(`nvidia-open=595.58.03-1`) only when the packages it depends on at exactly its version are pinned to that
version too (their candidates are otherwise the newer release and the install fails with "but 595.999.01-1 is to
be installed"): provisioning writes its apt pins before it installs the driver. It carries as well a newer patch
release of each such profile's CUDA toolkit (`standins.newer_cuda_release`: `13.2.1-1` and `13.2.99-1` of
cuda-toolkit-13-2 and of every part of it), whose parts the older toolkit's minimum-version Depends admit: apt
alone installs the locked toolkit with the newer release's parts, and `apt-get dist-upgrade` moves them unless
they are held (gpuprov.provision.ops.cuda, gpuprov.provision.ops.pins).

    ensure_mirror(lab_or_network) -> MirrorInfo    build the repository if needed, (re)start its container
    running_mirror(client, paths) -> MirrorInfo    the mirror as it serves now (None if it does not)
    mirror_vars(info) -> dict                      the inventory's `mirror:` variables
    remove_mirror(client)                          remove the mirror container (lab.down)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.errors import GpuprovError
from gpuprov.lab.debian import DEBIAN_PACKAGES, DebianDeb, DebianDebs
from gpuprov.lab.engine import find_lab_container
from gpuprov.lab.labels import BASE_REPO, HOST_REPO, LABEL, LABELS, NETWORK, ROLE_LABEL
from gpuprov.lab.removal import GONE_STATES, remove_container
from gpuprov.lab.smi_answers import gpu_profiles_table
from gpuprov.lab.standins import (
    PackageSpec,
    build_debs,
    inputs_digest,
    lab_stacks,
    point_release_packages,
    standin_packages,
)
from gpuprov.lab.state import LabPaths, LabState

MIRROR_NAME = "gpuprov-lab-mirror"
RELEASE_LABEL = "gpuprov-lab"  # the Release `Label:` apt pins the lab mirror by
DIGEST_LABEL = "gpuprov.lab.mirror-digest"
KEY_UID = "gpuprov lab mirror <lab@gpuprov.invalid>"
SERVE_DIR = "/srv/mirror"
DEBIAN_POOL = "pool/debian"
POINT_RELEASE_POOL = "pool/point-release"
LAYOUT = "2"  # the repository's layout (part of its digest): stand-ins, point release and Debian pools, one index
READY_TIMEOUT_S = 30
# What validate installs for torch.compile (g++ for TorchInductor's CPU code, gcc for Triton's launcher, Python.h):
# python3-dev depends on the python3.X-dev of the release's python3, so the mirror serves that one.
COMPILER_PACKAGES = ("gcc", "g++", "python3-dev")
MIRROR_DEBIAN = (*DEBIAN_PACKAGES, *COMPILER_PACKAGES)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class MirrorInfo:
    """How lab hosts reach the mirror: `deb [signed-by=<key>] <url> /`."""

    url: str
    key_file: Path
    fingerprint: str
    ip: str = ""
    repo: Path | None = None
    packages: tuple[PackageSpec, ...] = ()
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    point_release: tuple[PackageSpec, ...] = ()
    debian: tuple[DebianDeb, ...] = ()


@dataclass(frozen=True)
class MirrorRepo:
    """A built, signed repository directory (content-addressed by `digest`)."""

    path: Path
    digest: str
    fingerprint: str
    key_file: Path
    packages: tuple[PackageSpec, ...]
    point_release: tuple[PackageSpec, ...] = ()
    debian: tuple[DebianDeb, ...] = ()


def mirror_vars(info: MirrorInfo) -> dict:
    """The inventory's `mirror:` variables for the lab hosts."""
    return {"url": info.url, "key_file": str(info.key_file), "fingerprint": info.fingerprint,
            "label": RELEASE_LABEL}



def _quiet(_: str) -> None:
    """A progress sink that shows nothing."""


def _run(cmd: list[str], step: str, *, env: dict | None = None, hint: str = "") -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=600)
    if proc.returncode != 0:
        raise GpuprovError(f"`{cmd[0]}` failed with exit code {proc.returncode}", step=step,
                           command=" ".join(cmd), output=proc.stdout + proc.stderr,
                           hint=hint or "fix the problem shown above, then rerun `invoke lab.up`")
    return proc.stdout


# ---------------------------------------------------------------------------------------------- tools

def ensure_tools(progress: Progress = _quiet) -> None:
    """gpg and dpkg-deb on the controller; as root on Debian, apt-get installs what is missing."""
    missing = [pkg for prog, pkg in (("gpg", "gnupg"), ("dpkg-deb", "dpkg")) if shutil.which(prog) is None]
    if not missing:
        return
    if os.geteuid() != 0 or not Path("/etc/debian_version").exists():
        raise GpuprovError(f"the lab mirror needs {', '.join(missing)}", step="lab mirror",
                           hint=f"run: sudo apt-get install -y {' '.join(missing)}")
    progress(f"mirror: installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    try:
        _run(install, "lab mirror: apt-get install", env=env)
    except GpuprovError:
        _run(["apt-get", "update"], "lab mirror: apt-get update", env=env)
        _run(install, "lab mirror: apt-get install", env=env)


def machine_arch() -> str:
    """The Debian architecture of this machine (the lab containers run on it)."""
    dpkg = shutil.which("dpkg")
    if dpkg:
        return _run([dpkg, "--print-architecture"], "lab mirror").strip()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


# ------------------------------------------------------------------------------------------ signing key

def _gpg(home: Path, *args: str) -> str:
    return _run(["gpg", "--homedir", str(home), "--batch", "--no-tty", "--pinentry-mode", "loopback",
                 "--passphrase", "", *args], "lab mirror: gpg")


SOCKET_PATH_MAX = 100   # a Unix socket's path is at most 107 bytes; gpg-agent's longest is S.gpg-agent.browser


@contextmanager
def _agent_home(home: Path) -> Iterator[Path]:
    """`home` as gpg and its agent are given it: through a short symlink under the temporary folder when the agent's
    socket paths in it would be too long for a Unix socket (a deep checkout, or pytest's folders), so that key
    generation and signing work wherever the repository lies."""
    if len(str(home / "S.gpg-agent.browser")) <= SOCKET_PATH_MAX:
        yield home
        return
    folder = Path(tempfile.mkdtemp(prefix="gpuprov-gpg-"))
    try:
        (folder / "home").symlink_to(home.resolve(), target_is_directory=True)
        yield folder / "home"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stop_agent(home: Path) -> None:
    if shutil.which("gpgconf"):
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)


def key_fingerprint(home: Path) -> str | None:
    """The 40-hex fingerprint of the lab mirror key in `home`, or None when there is none."""
    if not home.is_dir():
        return None
    out = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--list-keys",
                          KEY_UID], capture_output=True, text=True, check=False).stdout
    fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    return fprs[0] if fprs else None


def ensure_key(paths: LabPaths, progress: Progress = _quiet) -> str:
    """The lab mirror's signing key (ed25519, made once in .lab/mirror-gnupg); exports .lab/mirror-key.asc.
    Returns the fingerprint."""
    home = paths.state_dir / "mirror-gnupg"
    fpr = key_fingerprint(home)
    if fpr is None:
        progress("mirror: generating the lab mirror signing key")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True, mode=0o700)
        with _agent_home(home) as short:
            try:
                _gpg(short, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
            finally:
                _stop_agent(short)
        fpr = key_fingerprint(home)
        if fpr is None:
            raise GpuprovError("gpg made no key", step="lab mirror", command=f"gpg --homedir {home} --list-keys",
                               hint=f"remove {home} and rerun `invoke lab.up`")
    key_file = paths.state_dir / "mirror-key.asc"
    armored = _gpg(home, "--armor", "--export", fpr)
    if not key_file.exists() or key_file.read_text(encoding="utf-8") != armored:
        key_file.write_text(armored, encoding="utf-8")
    return fpr


# ------------------------------------------------------------------------------------------- repository

def _hashes(data: bytes) -> dict[str, str]:
    return {"MD5sum": hashlib.md5(data).hexdigest(), "SHA1": hashlib.sha1(data).hexdigest(),
            "SHA256": hashlib.sha256(data).hexdigest()}


def packages_index(debs: list[Path], root: Path) -> str:
    """The `Packages` file for `debs` (paths under `root`): each control plus Filename, Size and hashes."""
    stanzas = []
    for deb in sorted(debs):
        control = _run(["dpkg-deb", "--field", str(deb)], "lab mirror: dpkg-deb --field").rstrip("\n")
        data = deb.read_bytes()
        extra = [f"Filename: {deb.relative_to(root).as_posix()}", f"Size: {len(data)}"]
        extra += [f"{name}: {value}" for name, value in _hashes(data).items()]
        lines = control.splitlines()
        cut = next((i for i, line in enumerate(lines) if line.startswith("Description:")), len(lines))
        stanzas.append("\n".join(lines[:cut] + extra + lines[cut:]))
    return "\n\n".join(stanzas) + "\n"


def release_text(root: Path, names: list[str], arch: str,
                 description: str = "gpuprov lab mirror: stand-in packages (not NVIDIA software) and Debian "
                                    "packages") -> str:
    """A flat repository's `Release` (no Suite: `deb URL /` checks none)."""
    lines = ["Origin: gpuprov-lab", f"Label: {RELEASE_LABEL}",
             f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}", f"Architectures: {arch} all",
             f"Description: {description}"]
    files = {name: (root / name).read_bytes() for name in names}
    for field_name, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        lines.append(f"{field_name}:")
        lines += [f" {hashlib.new(algo, data).hexdigest()} {len(data):>8} {name}" for name, data in files.items()]
    return "\n".join(lines) + "\n"


def _link(source: Path, target: Path) -> None:
    """Hard-link `source` to `target` (a copy across file systems)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _write_index(paths: LabPaths, fpr: str, root: Path, debs: list[Path], arch: str, description: str) -> None:
    """Packages, Packages.gz, Release, InRelease and Release.gpg of the flat repository at `root`."""
    index = packages_index(debs, root).encode()
    (root / "Packages").write_bytes(index)
    (root / "Packages.gz").write_bytes(gzip.compress(index, mtime=0))
    (root / "Release").write_text(release_text(root, ["Packages", "Packages.gz"], arch, description),
                                  encoding="utf-8")
    with _agent_home(paths.state_dir / "mirror-gnupg") as home:
        try:
            _gpg(home, "--local-user", fpr, "--digest-algo", "SHA512", "--clearsign",
                 "--output", str(root / "InRelease"), str(root / "Release"))
            _gpg(home, "--local-user", fpr, "--digest-algo", "SHA512", "--armor", "--detach-sign",
                 "--output", str(root / "Release.gpg"), str(root / "Release"))
        finally:
            _stop_agent(home)


def build_repo(paths: LabPaths, stacks: list[dict] | None = None, kernel: str | None = None,
               progress: Progress = _quiet, debian: DebianDebs | None = None) -> MirrorRepo:
    """Build (or reuse) the signed repository for `stacks` (default: `lab_stacks()`) under .lab/mirror/: the
    stand-ins, the newer point release of each profile's newest driver branch (in pool/point-release/) and the
    real Debian packages `debian` (in pool/debian/)."""
    ensure_tools(progress)
    fpr = ensure_key(paths, progress)
    kernel = kernel or platform.release()
    arch = machine_arch()
    stacks = stacks if stacks is not None else lab_stacks()
    specs = standin_packages(stacks, kernel)
    point = point_release_packages(stacks)
    real = debian.debs if debian is not None else ()
    gpu_table = gpu_profiles_table()
    inputs = inputs_digest([*specs, *point], gpu_table, arch)
    debian_digest = debian.digest() if debian is not None else "none"
    digest = hashlib.sha256(f"{inputs}:{debian_digest}:{fpr}:{LAYOUT}".encode()).hexdigest()[:16]
    cache = paths.state_dir / "mirror"
    repo = cache / digest
    key_file = paths.state_dir / "mirror-key.asc"
    built = MirrorRepo(repo, digest, fpr, key_file, tuple(specs), tuple(point), tuple(real))
    if (repo / "InRelease").exists():
        progress(f"mirror: repository {digest} cached ({len(specs)} stand-ins, {len(real)} Debian packages, "
                 f"{len(point)} in the point release)")
        return built
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        debs = build_debs(specs, work / "pool", gpu_table, arch)
        debs += build_debs(point, work / POINT_RELEASE_POOL, gpu_table, arch)
        for deb in real:
            target = work / DEBIAN_POOL / deb.path.name
            _link(deb.path, target)
            debs.append(target)
        _write_index(paths, fpr, work, debs, arch,
                     "gpuprov lab mirror: stand-in packages (not NVIDIA software) and Debian packages")
        shutil.copyfile(key_file, work / "gpuprov-lab-mirror.asc")
        for old in cache.iterdir():
            if old.is_dir() and old != work:
                shutil.rmtree(old, ignore_errors=True)
        work.rename(repo)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"mirror: built {len(specs)} stand-in packages ({len(point)} more in the point release), added "
             f"{len(real)} Debian packages and signed repository {digest} in {time.monotonic() - started:.1f} s")
    return built


# ------------------------------------------------------------------------------------------- container

def repo_tar(repo: Path, root: str) -> io.BytesIO:
    """The folder `repo` as a tar rooted at `root` (a path under the mirror's /srv), read-only as the mirror's own
    files (folders 0555, files 0444)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted([repo, *repo.rglob("*")]):
            relative = path.relative_to(repo).as_posix()
            info = tarfile.TarInfo(root if relative == "." else f"{root}/{relative}")
            info.mtime = int(path.stat().st_mtime)
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o555
                tar.addfile(info)
            else:
                data = path.read_bytes()
                info.size, info.mode = len(data), 0o444
                tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _image(client, lab: LabState | str, image: str | None) -> str:
    import docker.errors

    candidates = [image] if image else []
    if isinstance(lab, LabState) and lab.image:
        candidates.append(lab.image)
    for repo in (HOST_REPO, BASE_REPO):
        for found in client.images.list(name=repo, filters={"label": f"{LABEL}=1"}):
            candidates += found.tags
    for tag in candidates:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            continue
    raise GpuprovError("no lab image to run the mirror from", step="lab mirror",
                       hint="run `invoke lab.up` (it builds the lab images)")


def _network(client, name: str):
    for network in client.networks.list(names=[name]):
        if network.name == name:
            if (network.attrs.get("Labels") or {}).get(LABEL) != "1":
                raise GpuprovError(f"network {name} is not the lab's", step="lab mirror",
                                   hint="use the lab's internal network (run `invoke lab.up`)")
            return network
    raise GpuprovError(f"the lab network {name} does not exist", step="lab mirror", hint="run `invoke lab.up`")


def _ip(container, network: str) -> str | None:
    container.reload()
    return (((container.attrs.get("NetworkSettings") or {}).get("Networks") or {}).get(network) or {}).get("IPAddress")


def _wait_serving(container, deadline: float) -> None:
    probe = ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1/InRelease', timeout=3)"]
    result = None
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            break
        result = container.exec_run(probe)
        if result.exit_code == 0:
            return
        time.sleep(0.3)
    logs = container.logs(tail=30).decode(errors="replace")
    raise GpuprovError(f"the mirror does not serve http://127.0.0.1/InRelease (status {container.status})",
                       step="lab mirror", command=f"docker logs {MIRROR_NAME}",
                       output=logs + (result.output.decode(errors="replace") if result else ""),
                       hint="read the logs above, then `invoke lab.down` and `invoke lab.up`")


def ensure_mirror(lab: LabState | str = NETWORK, *, paths: LabPaths | None = None, client=None,
                  image: str | None = None, stacks: list[dict] | None = None,
                  progress: Progress = _quiet) -> MirrorInfo:
    """Build the repository if needed and make sure `gpuprov-lab-mirror` serves it on the lab's internal
    network (a LabState, or the network's name). Returns the URL, key file and fingerprint."""
    from gpuprov.lab.engine import ensure_engine

    network_name = (lab.network or NETWORK) if isinstance(lab, LabState) else lab
    paths = paths or (lab.paths if isinstance(lab, LabState) else LabPaths.default())
    timings: dict[str, float] = {}
    client = client or ensure_engine(progress)
    tag = _image(client, lab, image)
    mark = time.monotonic()
    debian = _debian_debs(paths, client, tag, progress)
    timings["debian_s"] = time.monotonic() - mark
    mark = time.monotonic()
    repo = build_repo(paths, stacks, progress=progress, debian=debian)
    timings["build_s"] = time.monotonic() - mark
    mark = time.monotonic()
    network = _network(client, network_name)
    container = find_lab_container(client, MIRROR_NAME, "lab mirror")
    fresh = (container is not None and container.status not in GONE_STATES
             and container.labels.get(DIGEST_LABEL) == repo.digest
             and tag in (container.image.tags or []) and network_name in
             ((container.attrs.get("NetworkSettings") or {}).get("Networks") or {}))
    if container is not None and not fresh:
        progress(f"mirror: replacing {MIRROR_NAME} (repository or image changed, or the engine is removing it)")
        remove_container(container)
        container = None
    if container is None:
        labels = {**LABELS, ROLE_LABEL: "mirror", DIGEST_LABEL: repo.digest}
        container = client.containers.create(
            tag, name=MIRROR_NAME, hostname=MIRROR_NAME, detach=True, labels=labels, network=network.name,
            command=["python3", "-m", "http.server", "80", "--bind", "0.0.0.0", "--directory", SERVE_DIR],
            entrypoint=[], working_dir="/", cap_drop=["ALL"], cap_add=["NET_BIND_SERVICE"],
            security_opt=["no-new-privileges"])
        container.put_archive("/srv", repo_tar(repo.path, "mirror"))
        progress(f"mirror: created {MIRROR_NAME} from {tag} on {network.name}")
    container.reload()
    if container.status != "running":
        container.start()
    _wait_serving(container, time.monotonic() + READY_TIMEOUT_S)
    ip = _ip(container, network.name)
    if not ip:
        raise GpuprovError(f"{MIRROR_NAME} has no address on {network.name}", step="lab mirror",
                           command=f"docker inspect {MIRROR_NAME}", hint="`invoke lab.down`, then `invoke lab.up`")
    timings["serve_s"] = time.monotonic() - mark
    url = f"http://{ip}/"
    progress(f"mirror: serving {len(repo.packages)} stand-ins, {len(repo.point_release)} of a newer point release "
             f"and {len(repo.debian)} Debian packages at {url} (key {repo.fingerprint})")
    return MirrorInfo(url=url, key_file=repo.key_file, fingerprint=repo.fingerprint, ip=ip, repo=repo.path,
                      packages=repo.packages, timings=timings, point_release=repo.point_release,
                      debian=repo.debian)


def _debian_debs(paths: LabPaths, client, image: str, progress: Progress) -> DebianDebs:
    """The real Debian packages for the mirror, resolved against the lab's base image (the host image has the
    same packages) so that a rebuilt host image does not resolve again. When they cannot be fetched (no
    network) the last downloaded set is used, if there is one."""
    from gpuprov.lab.debian import cached_debian_debs, ensure_debian_debs
    from gpuprov.lab.images import _image_exists, base_tag

    base = base_tag() if _image_exists(client, base_tag()) else image
    try:
        return ensure_debian_debs(paths, client, base, names=MIRROR_DEBIAN, progress=progress)
    except GpuprovError as exc:
        cached = cached_debian_debs(paths, MIRROR_DEBIAN)
        if cached is None:
            raise
        progress(f"mirror: using the Debian packages downloaded before ({exc})")
        return cached


def running_mirror(client, paths: LabPaths, network: str = NETWORK) -> MirrorInfo | None:
    """The mirror as it serves now (for rewriting the inventory without rebuilding), or None."""
    container = find_lab_container(client, MIRROR_NAME, "lab mirror")
    home = paths.state_dir / "mirror-gnupg"
    fpr = key_fingerprint(home)
    if container is None or container.status != "running" or fpr is None:
        return None
    ip = _ip(container, network)
    if not ip:
        return None
    return MirrorInfo(url=f"http://{ip}/", key_file=paths.state_dir / "mirror-key.asc", fingerprint=fpr, ip=ip)


def remove_mirror(client, progress: Progress = _quiet) -> bool:
    """Remove the mirror container (before the lab network). Returns whether there was one."""
    container = find_lab_container(client, MIRROR_NAME, "lab mirror")
    if container is None:
        return False
    remove_container(container)
    progress(f"mirror: removed {MIRROR_NAME}")
    return True
