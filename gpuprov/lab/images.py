"""Lab images: a Debian 12 base made with debootstrap and `docker import`, and the host image on top."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpuprov.core.errors import GpuprovError
from gpuprov.lab.labels import BASE_REPO, HOST_REPO, IMAGE_LABEL, IMAGE_LABELS, REGISTRY_REPO

FILES = Path(__file__).with_name("files")
SUITE = "bookworm"
MIRROR = os.environ.get("GPUPROV_LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Everything the host image needs is installed by debootstrap, so building the host image
# needs no network. The hosts' sources.list names no mirror: they reach only the lab mirror.
# python3-apt: what Debian servers carry and Ansible's apt module needs (the benchmark's peer)
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "sudo", "iproute2",
                 "nftables", "procps", "kmod", "ca-certificates", "gnupg", "curl", "iputils-ping",
                 "netcat-openbsd", "less", "python3-apt")
HOST_CONTEXT_FILES = ("sources.list", "sshd-gpuprov-lab.conf")


def _short_hash(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:12]


def base_packages(suite: str = SUITE) -> tuple[str, ...]:
    """What debootstrap installs for a Debian suite: BASE_PACKAGES and the release's own (debian.RELEASES)."""
    from gpuprov.lab.debian import RELEASES

    return (*BASE_PACKAGES, *RELEASES[suite].extra)


def base_tag(suite: str = SUITE) -> str:
    """Tag of the base image of a Debian suite; changes when the recipe (suite, variant, packages) changes."""
    recipe = f"{suite} minbase {','.join(sorted(base_packages(suite)))} v2".encode()
    return f"{BASE_REPO}:{_short_hash(recipe)}"


def _image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _unmount_below(root: Path) -> None:
    """Unmount anything a failed debootstrap left mounted inside `root`, deepest first."""
    with open("/proc/mounts", encoding="utf-8") as handle:
        points = [line.split()[1] for line in handle]
    for point in sorted((p for p in points if p.startswith(str(root) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def ensure_base_image(client, progress: Callable[[str], None] = print, suite: str = SUITE) -> str:
    """Build the base image of a Debian suite (default Debian 12) unless its tag is already on the engine.
    Returns the tag."""
    tag = base_tag(suite)
    if _image_exists(client, tag):
        progress(f"image: base {tag} cached")
        return tag
    if shutil.which("debootstrap", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
        raise GpuprovError("debootstrap is not installed", step="lab base image",
                           hint="run: apt-get install -y debootstrap")
    progress(f"image: building base {tag} with debootstrap ({suite}, minbase) from {MIRROR}")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpuprov-lab-base-"))
    root = work / "root"
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(base_packages(suite))}", suite, str(root), MIRROR]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        if proc.returncode != 0:
            log = root / "debootstrap" / "debootstrap.log"
            detail = log.read_text(errors="replace") if log.exists() else proc.stdout + proc.stderr
            raise GpuprovError(f"debootstrap failed with exit code {proc.returncode}", step="lab base image",
                               command=" ".join(cmd), output=detail,
                               hint=f"check that {MIRROR} is reachable (set GPUPROV_LAB_DEBIAN_MIRROR "
                                    "to use another mirror), then rerun `invoke lab.up`")
        for leftover in (root / "var/cache/apt/archives").glob("*.deb"):
            leftover.unlink()
        archive = work / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(archive), "."],
                       check=True, capture_output=True)
        changes = [f"LABEL {IMAGE_LABEL}=1", 'CMD ["/bin/bash"]']
        client.api.import_image_from_file(str(archive), repository=tag.split(":")[0],
                                          tag=tag.split(":")[1], changes=changes)
    finally:
        _unmount_below(root)
        shutil.rmtree(work, ignore_errors=True)
    progress(f"image: base {tag} built in {time.monotonic() - started:.0f} s")
    return tag


def host_context(base: str, public_key: str) -> dict[str, bytes]:
    """The host image's build context: file name -> bytes."""
    dockerfile = (FILES / "Dockerfile.in").read_text(encoding="utf-8").replace("@BASE_IMAGE@", base)
    context = {"Dockerfile": dockerfile.encode(),
               "lspci": (Path(__file__).with_name("pci.py")).read_bytes(),
               "authorized_keys": (public_key.strip() + "\n").encode()}
    for name in HOST_CONTEXT_FILES:
        context[name] = (FILES / name).read_bytes()
    return context


def host_tag(context: dict[str, bytes]) -> str:
    """Content-addressed tag: a changed Dockerfile, file, key or base gives a new image."""
    parts = [name.encode() + b"\0" + data for name, data in sorted(context.items())]
    return f"{HOST_REPO}:{_short_hash(*parts)}"


def _context_tar(context: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in sorted(context.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def ensure_host_image(client, base: str, public_key: str, progress: Callable[[str], None] = print) -> str:
    """Build the host image from the base unless its content tag exists. Returns the tag."""
    import docker.errors

    context = host_context(base, public_key)
    tag = host_tag(context)
    if _image_exists(client, tag):
        progress(f"image: host {tag} cached")
        return tag
    progress(f"image: building host {tag}")
    started = time.monotonic()
    try:
        client.images.build(fileobj=_context_tar(context), custom_context=True, tag=tag, labels=IMAGE_LABELS,
                            rm=True, forcerm=True, pull=False, network_mode="none")
    except docker.errors.BuildError as exc:
        log = "".join(str(item.get("stream", item.get("error", ""))) for item in exc.build_log)
        raise GpuprovError(f"building the host image failed: {exc.msg}", step="lab host image",
                           command=f"docker build -t {tag} (context: gpuprov/lab/files)", output=log,
                           hint="fix gpuprov/lab/files/Dockerfile.in, then rerun `invoke lab.up`") from exc
    progress(f"image: host {tag} built in {time.monotonic() - started:.0f} s")
    return tag


def remove_images(client, progress: Callable[[str], None] = print) -> list[str]:
    """Remove the images the lab built (host and registry images first, then bases). Returns their tags."""
    removed = []
    for repo in (HOST_REPO, REGISTRY_REPO, BASE_REPO):
        for image in client.images.list(name=repo, filters={"label": f"{IMAGE_LABEL}=1"}):
            for tag in image.tags:
                client.images.remove(tag, noprune=False)
                removed.append(tag)
                progress(f"image: removed {tag}")
    return removed
