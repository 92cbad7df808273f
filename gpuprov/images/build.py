"""Build a rendered image context (build/images/<name>/) on the Docker engine, step by step.

The engine's build stream (decoded, as the SDK's `APIClient.build(decode=True)` yields it) has `Step N/M :
INSTRUCTION` lines, what each step printed, ` ---> Using cache` for a step the engine reused, `aux.ID` for the
image and `error` for a failed step. `StepStream` turns it into `Step`s with their output, reports each step as it
starts and ends, and raises `BuildStepError` naming the failed step with the tail of its output.

The context goes to the engine as an uncompressed tar, each member as the SDK's own archive describes it. Where the
engine listens on a Unix socket (as it does by default) it goes through gpuprov.images.engine: the files' data sent
by the kernel (sendfile), no SDK imported. Elsewhere (DOCKER_HOST tcp, ssh, TLS) the SDK sends it, streamed while it
is read in 1 MiB pieces (`context_stream`): the SDK's own `path=` first writes the whole tar to a temporary file and
then sends it 16 KiB at a time, which made a no-change rebuild of the lab's contexts (250 MB of wheels each) far
slower than `docker build`'s upload of the same files.

The rendered context's content hash (gpuprov.images.labels.context_hash) goes into the image as the build-time
label io.gpuprov.context-hash (so the Dockerfile and the hash do not depend on each other): `--changed-only`
compares it with the label of the image already tagged, and builds only when they differ. `docker buildx bake`
builds the same contexts from images.bake's docker-bake.json where buildx is installed.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.images.labels import CONTEXT_HASH, context_hash

_STEP = re.compile(r"Step (\d+)/(\d+) : (.*)")
# the engine's own lines between steps, not what a step printed
_ENGINE = re.compile(r" ---> (Using cache|Running in \w+|[0-9a-f]{12}|)$|Removing intermediate container \w+$"
                     r"|Successfully (built|tagged) .*")
TAIL_LINES = 25
CHUNK = 1 << 20

Event = Callable[[str, "Step"], None]


@dataclass
class Step:
    """One Dockerfile instruction as the engine ran it."""

    number: int
    total: int
    instruction: str
    cached: bool = False
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic, repr=False)

    @property
    def is_from(self) -> bool:
        return self.instruction.upper().startswith("FROM ")


@dataclass
class Built:
    """What one image's build did: its steps, or nothing when --changed-only found it unchanged."""

    name: str
    tags: list[str]
    context_hash: str
    image_id: str | None = None
    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0
    skipped: bool = False

    @property
    def cache_hits(self) -> int:
        return sum(step.cached for step in self.steps)

    @property
    def work_steps(self) -> int:
        """Steps that can be cache hits (every step but FROM)."""
        return sum(not step.is_from for step in self.steps)

    def to_dict(self) -> dict:
        return {"name": self.name, "tags": self.tags, "context_hash": self.context_hash, "image_id": self.image_id,
                "skipped": self.skipped, "seconds": round(self.seconds, 3), "cache_hits": self.cache_hits,
                "steps": [{"step": s.number, "instruction": s.instruction, "cached": s.cached,
                           "seconds": round(s.seconds, 3)} for s in self.steps]}


class BuildStepError(GpuprovError):
    """A Dockerfile step failed: the step, the engine's error and the step's output tail."""


class StepStream:
    """Reads the decoded build stream of one image: `on_event("start"|"end", step)` as steps start and end, and
    `on_event("status", step)` when a layer of a pulled base changes state (its line is the step's last)."""

    def __init__(self, name: str, on_event: Event):
        self.name = name
        self.on_event = on_event
        self.steps: list[Step] = []
        self.image_id: str | None = None
        self._partial = ""
        self._layers: dict[str, str] = {}

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def feed(self, item: dict) -> None:
        """One stream item: text, pull status, the image id, or an error (BuildStepError)."""
        if "error" in item or "errorDetail" in item:
            self._flush()
            self._fail(str((item.get("errorDetail") or {}).get("message") or item.get("error")))
        if "stream" in item:
            text = self._partial + str(item["stream"])
            *lines, self._partial = text.split("\n")
            for line in lines:
                self._line(line.rstrip("\r"))
        if "status" in item and self.current is not None:
            self._status(str(item.get("id") or ""), str(item["status"]))
        if isinstance(item.get("aux"), dict) and item["aux"].get("ID"):
            self.image_id = item["aux"]["ID"]

    def finish(self) -> str:
        """The built image's id, once the stream has ended (the last step ended)."""
        self._flush()
        self._end()
        if not self.image_id:
            self._fail("the engine's build stream ended without an image id")
        return str(self.image_id)

    def _status(self, layer: str, status: str) -> None:
        """A pull's status: once per layer and state (the engine repeats "Downloading" with byte counts)."""
        if self._layers.get(layer) == status:
            return
        self._layers[layer] = status
        self.current.lines.append(f"{layer}: {status}" if layer else status)
        self.on_event("status", self.current)

    def _flush(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""

    def _line(self, line: str) -> None:
        match = _STEP.fullmatch(line)
        if match:
            self._end()
            step = Step(int(match[1]), int(match[2]), match[3])
            self.steps.append(step)
            self.on_event("start", step)
        elif self.current is not None and line == " ---> Using cache":
            self.current.cached = True
        elif self.current is not None and line and not _ENGINE.fullmatch(line):
            self.current.lines.append(line)

    def _end(self) -> None:
        step = self.current
        if step is not None and not step.seconds:
            step.seconds = max(time.monotonic() - step.started, 1e-6)
            self.on_event("end", step)

    def _fail(self, message: str) -> None:
        step = self.current
        raise BuildStepError(f"{f'step {step.number}/{step.total}' if step else 'the build'} failed: {message}",
                             step=f"build {self.name}", command=step.instruction if step else None,
                             output="\n".join(step.lines[-TAIL_LINES:]) if step else None,
                             hint=f"fix the spec or template behind this step, then `invoke images.build --name "
                                  f"{self.name}` again")


def _repository_tag(reference: str) -> tuple[str, str]:
    """(repository, tag) of a reference, as the SDK's parse_repository_tag splits it ("latest" when none)."""
    repository, colon, tag = reference.rpartition(":")
    return (repository, tag) if colon and "/" not in tag else (reference, "latest")


def engine_client(timeout: int = 3600):
    """A Docker SDK client of this machine's engine (DOCKER_HOST, else the local socket), or GpuprovError. The
    timeout bounds the wait for the next stream item, so a silent build step may take that long."""
    import docker

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no engine answers"
        raise GpuprovError(f"no Docker engine answers on this machine ({type(exc).__name__})", step="images",
                           hint="start Docker (systemctl start docker; `invoke lab.up` starts one on Debian), or "
                                "point DOCKER_HOST at an engine") from None
    return client


class Engine:
    """The engine as images.build uses it: `api` builds, inspects and tags (the engine's own API on its Unix socket
    where it listens on one, else the SDK's APIClient); `sdk`, the SDK's client for the rest (containers, pushes),
    made when first asked for. `containers` is the SDK's, so that an Engine runs containers as the SDK's client
    does."""

    def __init__(self, api, sdk=None):
        self.api, self._sdk = api, sdk
        self._lock = threading.Lock()

    @property
    def sdk(self):
        with self._lock:
            if self._sdk is None:
                self._sdk = engine_client()
            return self._sdk

    @property
    def containers(self):
        return self.sdk.containers


def build_engine(timeout: int = 3600) -> Engine:
    """The engine of this machine for builds (DOCKER_HOST, else the local socket), or GpuprovError; the timeout as
    engine_client's."""
    from gpuprov.images.engine import EngineRefused, SocketEngine, socket_path

    path = socket_path()
    if path is None:
        client = engine_client(timeout)
        return Engine(client.api, client)
    api = SocketEngine(path, timeout)
    try:
        api.ping()
    except (OSError, EngineRefused) as exc:
        raise GpuprovError(f"no Docker engine answers on {path} ({type(exc).__name__})", step="images",
                           hint="start Docker (systemctl start docker; `invoke lab.up` starts one on Debian), or "
                                "point DOCKER_HOST at an engine") from None
    return Engine(api)


def existing_image(api, tags: list[str]) -> dict | None:
    """The engine's inspection of the first of `tags` it has an image for (None: none of them)."""
    missing = _not_found(api)
    for tag in tags:
        try:
            return api.inspect_image(tag)
        except missing as exc:
            if getattr(exc, "status", 404) != 404:
                raise
    return None


def _not_found(api) -> tuple[type[Exception], ...]:
    """What `api` raises for an image it does not have (the socket's EngineRefused says 404)."""
    from gpuprov.images.engine import EngineRefused, SocketEngine

    if isinstance(api, SocketEngine):
        return (EngineRefused,)
    import docker.errors

    return (docker.errors.ImageNotFound,)


def build_image(api, name: str, context: Path, tags: list[str], *, labels: dict[str, str] | None = None,
                no_cache: bool = False, changed_only: bool = False, on_event: Event = lambda kind, step: None
                ) -> Built:
    """Build `context` as `tags` (the first names the build, the others are added to the image) through `api`
    (a SocketEngine, or the SDK's APIClient), with the build-time `labels` (io.gpuprov.context-hash is the
    context's hash unless they give it).

    With changed_only, an image already tagged with the context's hash is not built again: it gets any of `tags`
    it lacks, and the result says skipped."""
    from gpuprov.images.engine import EngineRefused, SocketEngine

    started = time.monotonic()
    labels = dict(labels or {})
    digest = labels.get(CONTEXT_HASH) or labels.setdefault(CONTEXT_HASH, context_hash(context))
    found = existing_image(api, tags) if changed_only else None
    if found is not None and (found.get("Config", {}).get("Labels") or {}).get(CONTEXT_HASH) == digest:
        image_id = _tag_all(api, found["Id"], tags)
        return Built(name, tags, digest, image_id, skipped=True, seconds=time.monotonic() - started)
    stream = StepStream(name, on_event)
    if isinstance(api, SocketEngine):
        parts, size = context_archive(context)
        items, refused = api.build(parts, size, tag=tags[0], labels=labels, nocache=no_cache), (EngineRefused,)
    else:
        import docker.errors

        items = api.build(fileobj=context_stream(context), custom_context=True, tag=tags[0], decode=True, rm=True,
                          forcerm=True, nocache=no_cache, pull=False, labels=labels)
        refused = (docker.errors.APIError,)
    hint = f"check the Docker engine (docker info) and the context {context}"
    try:
        for item in items:
            stream.feed(item)
    except refused as exc:
        raise GpuprovError(f"the engine refused the build of {name}: {exc.explanation or exc}",
                           step=f"build {name}", hint=hint) from None
    except OSError as exc:     # the socket's: the engine went away, or said nothing for the timeout
        raise GpuprovError(f"the engine stopped answering the build of {name} ({type(exc).__name__})",
                           step=f"build {name}", hint=hint) from None
    image_id = _tag_all(api, stream.finish(), tags[1:])   # the build tagged the first
    return Built(name, tags, digest, image_id, stream.steps, time.monotonic() - started)


def context_archive(context: Path) -> tuple[list, int]:
    """The build context as an uncompressed tar, planned: its pieces (bytes, and (path, size) for the data of a
    file) and its size. Every folder and file under `context` (the files context_hash covers; render writes no
    .dockerignore), each member as the SDK's own archive describes it (tarfile's gettarinfo, so the engine's
    layer cache sees the same files), the end padded to a record as tarfile does."""
    root, parts, size = Path(context), [], 0
    with tarfile.open(fileobj=io.BytesIO(), mode="w") as archive:   # describes the members, holds none
        for path in _members(root):
            info = archive.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            if info is None:   # a socket: the SDK leaves it out too
                continue
            parts.append(info.tobuf(archive.format, archive.encoding, archive.errors))
            size += len(parts[-1])
            if info.isreg():
                padding = tarfile.NUL * (-info.size % tarfile.BLOCKSIZE)
                parts += [(path, info.size), padding]
                size += info.size + len(padding)
    end = tarfile.NUL * (2 * tarfile.BLOCKSIZE)
    end += tarfile.NUL * (-(size + len(end)) % tarfile.RECORDSIZE)
    return [*parts, end], size + len(end)


def context_stream(context: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    """context_archive's tar in pieces of `chunk` to 2 x `chunk` bytes, its files read as they are sent (for the
    SDK). GpuprovError when a file cannot be read whole."""
    pending = bytearray()
    for part in context_archive(context)[0]:
        for block in [part] if isinstance(part, bytes) else _file_blocks(*part, chunk):
            pending += block
            if len(pending) >= chunk:
                yield bytes(pending)
                pending.clear()
    if pending:
        yield bytes(pending)


def _members(root: Path) -> list[Path]:
    """Every folder and file under `root` (symbolic links not followed), sorted by path."""
    found = []
    for folder, folders, files in os.walk(root):
        found += [Path(folder, name) for name in folders + files]
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def _file_blocks(path: Path, size: int, chunk: int) -> Iterator[bytes]:
    """The first `size` bytes of the file, `chunk` at a time; GpuprovError when it is shorter or unreadable."""
    try:
        with open(path, "rb") as handle:
            left = size
            while left:
                block = handle.read(min(chunk, left))
                if not block:
                    raise OSError(f"it shrank to {size - left} bytes while it was sent")
                left -= len(block)
                yield block
    except OSError as exc:
        raise GpuprovError(f"cannot send {path} to the engine: {exc.strerror or exc}", step="build context",
                           hint="render the image again (invoke images.render --name ...), then build it") from None


def _tag_all(api, image_id: str, tags: list[str]) -> str:
    """Tag the image as each of `tags`; its id."""
    for reference in tags:
        repository, tag = _repository_tag(reference)
        api.tag(image_id, repository, tag, force=True)
    return image_id


def in_parallel(work: Callable, items: Iterable, parallel: int) -> list:
    """`work(item)` for every item, at most `parallel` at a time, the results in the items' order (the first
    exception raised by one is raised, once the running ones end; no item starts after it). A lazy `items` makes
    each item while the earlier ones run (images.build renders the next image while one builds); an exception in
    making one is raised once the running ones end. The workers are daemon threads: an interrupted run leaves at
    once, and the engine stops a build whose client has gone."""
    results: dict[int, object] = {}
    errors: list[BaseException] = []
    slots = threading.Semaphore(parallel)

    def run(index: int, item) -> None:
        try:
            results[index] = work(item)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            errors.append(exc)
        finally:
            slots.release()

    threads: list[threading.Thread] = []
    try:
        for index, item in enumerate(items):
            slots.acquire()
            if errors:
                break
            threads.append(threading.Thread(target=run, args=(index, item), daemon=True, name=f"build-{index}"))
            threads[-1].start()
    except Exception:
        for thread in threads:
            thread.join()
        raise
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [results[index] for index in range(len(threads))]


# ------------------------------------------------------------------------------------------------ buildx

def buildx_available() -> bool:
    """Whether `docker buildx` answers (the buildx CLI plugin is installed)."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    return subprocess.run([docker, "buildx", "version"], capture_output=True, check=False).returncode == 0


def bake_command(bake_file: Path, targets: list[str], *, no_cache: bool = False, push: bool = False) -> list[str]:
    """`docker buildx bake` for these targets of a bake file (images.bake's: contexts, tags and build-time labels),
    with plain progress (one line per event)."""
    command = ["docker", "buildx", "bake", "--file", str(bake_file), "--progress", "plain"]
    command += ["--no-cache"] if no_cache else []
    command += ["--push"] if push else []
    return command + targets


def require_buildx() -> None:
    """InputError (exit 2) when the buildx plugin is missing: checked before anything is rendered or built."""
    if not buildx_available():
        raise InputError("--builder buildx needs the docker buildx plugin, which is not installed here",
                         step="images.build", hint="install docker-buildx (or docker-buildx-plugin), or build "
                                                   "with the default builder (the Docker SDK)")


def bake(command: list[str], on_line: Callable[[str], None]) -> None:
    """Run a bake command, streaming its lines; GpuprovError with the output's tail when it fails."""
    tail: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
            tail = (tail + [line.rstrip("\n")])[-TAIL_LINES:]
    if proc.returncode != 0:
        raise GpuprovError(f"docker buildx bake failed with exit code {proc.returncode}", step="images.build",
                           command=" ".join(command), output="\n".join(tail),
                           hint="read the failed step above; the same context builds with the default builder too")
