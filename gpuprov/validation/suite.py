"""Copy the suite (gpuprov/smoke) to a host, write its config, run it there (in the venv, or in a container
image), and read the one JSON document it prints."""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from importlib import resources

from gpuprov.core.errors import GpuprovError
from gpuprov.validation import LAYOUT, Layout

OUTPUT_TAIL = 16384   # characters of a failed run's output kept in its error (the tail)
# seconds for the whole suite (each check has its own timeout): at burn-in, dcgmi diag -r 4 alone may take its
# 5400 s (tools_dcgm.TIMEOUT_FOR), and the other checks up to 1800 s more; the burn-in load comes on top
TIMEOUTS = {"quick": 900, "burn-in": 7200}
# NVIDIA's flags for PyTorch containers: the GPUs, the host's IPC namespace (DataLoader shared memory), unlimited
# locked memory (pinned buffers, NCCL) and a 64 MiB stack. The ulimits can be changed per host (validate.image_ulimits).
DOCKER_FLAGS = ("--gpus", "all", "--ipc=host")
ULIMITS = {"memlock": -1, "stack": 67108864}


def ulimit_flags(ulimits: dict | None = None) -> list[str]:
    """`--ulimit NAME=VALUE` for each limit (NVIDIA's unless `ulimits` overrides; None drops one)."""
    chosen = {**ULIMITS, **(ulimits or {})}
    return [part for name, value in chosen.items() if value is not None for part in ("--ulimit", f"{name}={value}")]


def smoke_files() -> dict[str, bytes]:
    """The suite's files by path relative to the package (no caches)."""
    out: dict[str, bytes] = {}

    def walk(node, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            name = f"{prefix}{child.name}"
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, name + "/")
            elif not child.name.endswith((".pyc", ".pyo")):
                out[name] = child.read_bytes()

    walk(resources.files("gpuprov.smoke"), "")
    return out


def files_digest(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def suite_archive(files: dict[str, bytes]) -> str:
    """The suite as a base64 tar (root-owned, 0644 files), for a root command's stdin."""
    import base64
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            archive.addfile(info, io.BytesIO(files[name]))
    return base64.encodebytes(buffer.getvalue()).decode()


def push_suite(remote, current: str | None, layout: Layout = LAYOUT, files: dict[str, bytes] | None = None) -> bool:
    """Put the suite at layout.smoke unless the host has this version already (its digest marker). It travels
    on a root command's stdin into a root-only staging folder (nothing the SSH user can write), its files'
    SHA-256 are checked there as root, then it is swapped in with renames. Returns whether it was copied."""
    files = smoke_files() if files is None else files
    digest = files_digest(files)
    if current == digest:
        return False
    from gpuprov.validation.remote import Remote

    q = shlex.quote
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items()))
    old = f"{layout.smoke}.old"
    remote.guarded("\n".join([
        "set -e", Remote.root_folder_script(layout.root), "umask 077",
        f"stage=$(mktemp -d {q(layout.root + '/.smoke.XXXXXX')})", "trap 'rm -rf \"$stage\"' EXIT",
        'base64 -d | tar -x --no-same-owner --no-same-permissions -C "$stage"',
        f"(cd \"$stage\" && sha256sum -c --strict --quiet >&2) <<'GPUPROV-SUMS'\n{sums}GPUPROV-SUMS",
        f"printf '%s\\n' {q(digest)} > \"$stage/.gpuprov-digest\"",
        'chmod -R u=rwX,go=rX "$stage"',
        f"rm -rf {q(old)}",
        f"if [ -e {q(layout.smoke)} ]; then mv {q(layout.smoke)} {q(old)}; fi",
        f"mv \"$stage\" {q(layout.smoke)}", "trap - EXIT",
        f"rm -rf {q(old)}",
    ]), layout.root, stdin=suite_archive(files), timeout=120, step="copy suite")
    return True


def write_config(remote, config: dict, layout: Layout = LAYOUT) -> None:
    from gpuprov.core.json_text import dump_json

    remote.write_text(dump_json(config, sort_keys=True) + "\n", layout.config, step="suite config")


def suite_command(*, level: str, strict: bool, only: list[str] | None = None, image: str | None = None,
                  layout: Layout = LAYOUT, ulimits: dict | None = None) -> str:
    """The command that runs the suite: in the host's venv, or in `image` through docker with the GPUs, the
    host's IPC namespace and unlimited locked memory (what NCCL and pinned memory need)."""
    q = shlex.quote
    args = ["-m", "smoke", "--config", layout.config, "--level", level, *(["--strict"] if strict else []),
            *(["--only", ",".join(only)] if only else [])]
    if image is None:
        return f"cd {q(layout.root)} && {q(layout.python)} -E -s -B " + " ".join(q(a) for a in args)
    docker = ["docker", "run", "--rm", *DOCKER_FLAGS, *ulimit_flags(ulimits), "-v", f"{layout.smoke}:{layout.smoke}:ro",
              "-v", f"{layout.run}:{layout.run}:ro", "-w", layout.root, "-e", "PYTHONDONTWRITEBYTECODE=1",
              image, "python3", *args]
    return " ".join(q(a) for a in docker)


def run_suite(remote, command: str, level: str, datasheet: dict | None = None, load_s: float = 0.0) -> dict:
    """Run the suite (as root) and return its document, checked against `datasheet` (the suite config's); a run
    that prints no valid document is an error. `load_s`: the burn-in time the config adds to the level's
    (suite_config.load_seconds)."""
    result = remote.run(command, timeout=TIMEOUTS[level] + math.ceil(load_s), step="suite", check=False)
    return parse_document(remote.name, result.stdout, result.stderr, result.rc, result.shown_command(), datasheet)


def parse_document(host: str, stdout: str, stderr: str = "", rc: int = 0, command: str = "",
                   datasheet: dict | None = None) -> dict:
    """The suite's JSON document (its last line when something printed before it), checked strictly
    (gpuprov.validation.document: types, finite numbers, known statuses, bounded sizes, figures within the GPU's
    datasheet). The runner exits non-zero when a check failed, so the exit code alone decides nothing. Anything
    else is a GpuprovError of the host, with the tail of its output."""
    from gpuprov.core.connection import output_cut
    from gpuprov.validation.document import DocumentError, suite_document

    def fail(why: str, hint: str = "read the output above; a missing module means the venv or image lacks it"):
        cut = output_cut(stdout)
        if cut:
            why += f"; its output was cut: the first {cut} bytes were dropped"
        output = (stderr + "\n" + stdout).strip()
        return GpuprovError(f"the suite printed no valid result document ({why}); exit {rc}", host=host,
                            step="suite", command=command, output=output[-OUTPUT_TAIL:], hint=hint)

    text = stdout.strip()
    doc = None
    for candidate in (text, text[text.rfind("\n{") + 1:] if "\n{" in text else None):
        try:
            doc = json.loads(candidate) if candidate else None
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            break
    if not isinstance(doc, dict):
        raise fail("not a JSON object")
    try:
        return suite_document(doc, datasheet)
    except DocumentError as exc:
        raise fail(str(exc), hint="the host's suite (or what runs it) was changed, or measured wrong: check it, "
                                  "then validate again") from None
