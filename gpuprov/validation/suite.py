"""Copy the suite (gpuprov/smoke) to a host, write its config, run it there (in the venv, or in a container
image), and read the one JSON document it prints."""

from __future__ import annotations

import hashlib
import json
import shlex
from importlib import resources

from gpuprov.errors import GpuprovError
from gpuprov.smoke.core import STATUSES
from gpuprov.validation import LAYOUT, Layout

SCHEMA = 1
TIMEOUTS = {"quick": 900, "burn-in": 5400}   # seconds for the whole suite; each check has its own timeout
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


def push_suite(remote, current: str | None, layout: Layout = LAYOUT, files: dict[str, bytes] | None = None) -> bool:
    """Put the suite at layout.smoke unless the host has this version already (its digest marker); the new
    copy is staged, then swapped in with renames. Returns whether it was copied."""
    files = smoke_files() if files is None else files
    digest = files_digest(files)
    if current == digest:
        return False
    q = shlex.quote
    remote.user_folder(layout.incoming, mode="0700")
    stage = f"{layout.incoming}/smoke.{digest[:12]}"
    folders = [stage, *(f"{stage}/{f}" for f in sorted({name.rsplit("/", 1)[0] for name in files if "/" in name}))]
    remote.run(f"rm -rf {q(stage)} && mkdir -p " + " ".join(q(f) for f in folders), sudo=False, timeout=60,
               step="copy suite")
    for name, data in files.items():
        remote.put_bytes(data, f"{stage}/{name}")
    old = f"{layout.smoke}.old"
    remote.run("\n".join([
        "set -e",
        f"printf '%s\\n' {q(digest)} > {q(stage)}/.gpuprov-digest",
        f"chown -R 0:0 {q(stage)} && chmod -R u=rwX,go=rX {q(stage)}",
        f"rm -rf {q(old)}",
        f"if [ -e {q(layout.smoke)} ]; then mv {q(layout.smoke)} {q(old)}; fi",
        f"mv {q(stage)} {q(layout.smoke)}",
        f"rm -rf {q(old)}",
    ]), timeout=120, step="copy suite")
    return True


def write_config(remote, config: dict, layout: Layout = LAYOUT) -> None:
    from gpuprov.json_text import dump_json

    remote.write_text(dump_json(config, sort_keys=True) + "\n", layout.config, step="suite config")


def suite_command(*, level: str, strict: bool, only: list[str] | None = None, image: str | None = None,
                  layout: Layout = LAYOUT, ulimits: dict | None = None) -> str:
    """The command that runs the suite: in the host's venv, or in `image` through docker with the GPUs, the
    host's IPC namespace and unlimited locked memory (what NCCL and pinned memory need)."""
    q = shlex.quote
    args = ["-m", "smoke", "--config", layout.config, "--level", level, *(["--strict"] if strict else []),
            *(["--only", ",".join(only)] if only else [])]
    if image is None:
        return f"cd {q(layout.root)} && PYTHONDONTWRITEBYTECODE=1 {q(layout.python)} " + " ".join(q(a) for a in args)
    docker = ["docker", "run", "--rm", *DOCKER_FLAGS, *ulimit_flags(ulimits), "-v", f"{layout.smoke}:{layout.smoke}:ro",
              "-v", f"{layout.run}:{layout.run}:ro", "-w", layout.root, "-e", "PYTHONDONTWRITEBYTECODE=1",
              image, "python3", *args]
    return " ".join(q(a) for a in docker)


def run_suite(remote, command: str, level: str) -> dict:
    """Run the suite (as root) and return its document; a run that prints no valid document is an error."""
    result = remote.run(command, timeout=TIMEOUTS[level], step="suite", check=False)
    return parse_document(remote.name, result.stdout, result.stderr, result.rc, result.shown_command())


def parse_document(host: str, stdout: str, stderr: str = "", rc: int = 0, command: str = "") -> dict:
    """The suite's JSON document, checked: schema, and every result with a check name, a known status and a
    reason. The runner exits non-zero when a check failed, so the exit code alone decides nothing."""
    def fail(why: str) -> GpuprovError:
        return GpuprovError(f"the suite printed no valid result document ({why}); exit {rc}", host=host,
                            step="suite", command=command, output=(stderr + "\n" + stdout).strip(),
                            hint="read the output above; a missing module means the venv or image lacks it")

    text = stdout.strip()
    try:
        doc = json.loads(text)
    except ValueError:
        start = text.rfind("\n{")
        try:
            doc = json.loads(text[start + 1:]) if start >= 0 else None
        except ValueError:
            doc = None
    if not isinstance(doc, dict):
        raise fail("not JSON")
    if doc.get("schema") != SCHEMA:
        raise fail(f"schema {doc.get('schema')!r}, expected {SCHEMA}")
    results = doc.get("results")
    if not isinstance(results, list):
        raise fail("no results list")
    for item in results:
        if not isinstance(item, dict) or not isinstance(item.get("check"), str) or \
                item.get("status") not in STATUSES or not isinstance(item.get("reason"), str):
            raise fail(f"bad result {item!r:.200}")
        item.setdefault("figures", {})
        item.setdefault("thresholds", {})
        item.setdefault("seconds", 0.0)
    doc.setdefault("versions", {})
    return doc
