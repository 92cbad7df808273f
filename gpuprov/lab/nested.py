"""Container images for the Docker engine *inside* a lab host (nested containers), made from the host's own files.

Lab hosts reach no registry, so nothing can be pulled there. `ensure_image(host)` makes, on the lab host, an image
of its own Python: /usr/bin/python3 and its standard library, /bin/sh, the shared libraries they load (their
`ldd` closure), /etc/passwd and /etc/group, and any `extra_paths` (for example /opt/gpuprov/venv and
/opt/gpuprov/smoke, to run the suite in a container) with the libraries their `.so` files load. The archive is
written deterministically (sorted, mtime 0, root-owned), so its tag (`REPOSITORY:<sha256 of the image's PATH and
the archive>[:12]`) changes only when they do; an image of that tag on the host is reused.

The image has what the lab's simulated nvidia-smi needs (it is a Python script, copied into GPU containers by the
stand-in nvidia-container-runtime-hook), so on a provisioned lab host

    tag = ensure_image(host)
    docker run --rm --gpus all TAG nvidia-smi -L

lists the profile's GPUs. The engine on the lab host must be running (provisioning with `container_engine:
docker`, or docker.io from the lab mirror).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuprov.core.errors import GpuprovError
from gpuprov.lab.engine import container_of

PYTHON_IMAGE = "gpuprov-lab/python"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs on the lab host as root (python3 -c SCRIPT REPOSITORY [EXTRA_PATH...]); prints the image's tag last.
SCRIPT = r'''
import hashlib, os, stat, subprocess, sys, tarfile, tempfile

repository, extra = sys.argv[1], sys.argv[2:]
search = os.environ.get("GPUPROV_IMAGE_PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
python = os.path.realpath("/usr/bin/python3")
stdlib = "/usr/lib/python%d.%d" % sys.version_info[:2]
SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data"}
paths, elves = set(), set()


def add(path):
    """`path`, its directories, and the targets of the symlinks on the way, never a path through a symlink
    (merged /usr: /bin/sh is /bin -> usr/bin, then /usr/bin/sh -> dash, then /usr/bin/dash)."""
    path = os.path.normpath(path)
    if path == "/" or path in paths or not os.path.lexists(path):
        return
    parent = os.path.dirname(path)
    real_parent = os.path.realpath(parent)
    if real_parent != parent:
        add(parent)
        add(os.path.join(real_parent, os.path.basename(path)))
        return
    paths.add(path)
    add(parent)
    if os.path.islink(path):
        add(os.path.join(parent, os.readlink(path)))
    if path.endswith(".so") or ".so." in os.path.basename(path):
        elves.add(os.path.realpath(path))


def add_tree(top, skip=()):
    add(top)
    top = os.path.realpath(top)
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for name in dirs + files:
            add(os.path.join(root, name))


def is_elf(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


for path in ("/usr/bin/python3", python, "/bin/sh", "/usr/bin/dash", "/etc/passwd", "/etc/group",
             "/etc/ld.so.cache", "/etc/nsswitch.conf"):
    add(path)
elves.update((python, os.path.realpath("/bin/sh")))
add_tree(stdlib, SKIP)
for path in extra:
    if not os.path.lexists(path):
        sys.exit("no such path on the lab host: " + path)
    if os.path.isdir(path):
        add_tree(path)
    else:
        add(path)
        elves.add(os.path.realpath(path))
for elf in sorted(e for e in elves if is_elf(e)):
    out = subprocess.run(["ldd", elf], capture_output=True, text=True).stdout
    for line in out.splitlines():
        words = line.split()
        lib = words[2] if len(words) >= 3 and words[1] == "=>" else words[0] if words else ""
        if lib.startswith("/"):
            add(lib)
            add(os.path.realpath(lib))

fd, archive = tempfile.mkstemp(prefix="gpuprov-lab-image-", suffix=".tar", dir="/var/tmp")
os.close(fd)
try:
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        tmp = tarfile.TarInfo("tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
        for path in sorted(paths):
            info = tar.gettarinfo(path, arcname=path.lstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isreg():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            elif info.isdir() or info.issym() or info.islnk():
                tar.addfile(info)
    digest = hashlib.sha256(search.encode() + b"\0")
    with open(archive, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    tag = "%s:%s" % (repository, digest.hexdigest()[:12])
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0:
        proc = subprocess.run(["docker", "import", "--change", "ENV PATH=" + search,
                               "--change", 'CMD ["/usr/bin/python3"]', archive, tag],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit("docker import failed: " + proc.stdout + proc.stderr)
    print(tag)
finally:
    os.unlink(archive)
'''


def ensure_image(host, *, repository: str = PYTHON_IMAGE, extra_paths: Iterable[str] = (),
                 path_first: Iterable[str] = ()) -> str:
    """The tag of an image of the lab host's own Python (and `extra_paths`) in the host's Docker engine, made on
    the host when it lacks it. `path_first`: folders put before the usual ones on the image's PATH (a venv's bin,
    so that `python3` is the venv's). `host`: a LabHost, a container name or id, or a docker Container."""
    container = container_of(host)
    command = ["python3", "-c", SCRIPT, repository, *extra_paths]
    search = ":".join([*path_first, *DEFAULT_PATH.split(":")])
    result = container.exec_run(command, environment={"GPUPROV_IMAGE_PATH": search})
    output = result.output.decode(errors="replace").strip()
    if result.exit_code != 0 or not output:
        raise GpuprovError(f"making the nested image {repository} failed (exit code {result.exit_code})",
                           host=container.name, step="lab nested image",
                           command=f"python3 -c <gpuprov.lab.nested.SCRIPT> {repository} {' '.join(extra_paths)}",
                           output=output, hint="is Docker installed and running on the lab host?")
    return output.splitlines()[-1]
