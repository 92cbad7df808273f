"""Rebuilds that cost what `docker build`'s cost (issue 18, item 13): the context streamed as the SDK's own archive
(judged byte for byte by docker.utils.tar, and by the engine's layer cache), hashed once per build, its unchanged
files not read again; the versions read inside an image reused for the same image ID (the comparison with the spec
made every time); and the lab's wheelhouse downloaded only when an image that installs from it is built.

Builds run on this machine's engine (started as gpuprov.lab.engine does when none answers), from `scratch`, so no
base image is needed; what the engine did is judged by the engine (`docker image inspect`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from docker.utils import tar as sdk_archive
from dockerfile_parse import DockerfileParser
from helpers.images import context_tree
from invoke import Context

import gpuprov.images
from gpuprov.core.errors import GpuprovError
from gpuprov.images import verify
from gpuprov.images.build import build_image, context_stream, in_parallel
from gpuprov.images.labels import CONTEXT_HASH, context_hash, image_labels
from gpuprov.images.render import FileDigests, Rendered, WheelsNotDownloaded, render
from gpuprov.images.spec import load_specs
from gpuprov.images.verify import PROBE, verify_image, versions_record
from gpuprov.tasks import images as image_tasks

PROJECT = Path(__file__).resolve().parents[2]
REPOSITORY = "gpuprov-test/images-rebuild"
HOUR_AGO = time.time_ns() - 3600 * 10**9


@pytest.fixture(scope="module")
def engine():
    from gpuprov.lab.engine import ensure_engine

    return ensure_engine(lambda line: None)


@pytest.fixture
def tags(request):
    """Tags unique to the test; every image they name is removed afterwards."""
    names = [f"{REPOSITORY}:{request.node.name[:60]}-{n}" for n in ("a", "b")]
    yield names
    subprocess.run(["docker", "rmi", "-f", *names], capture_output=True, check=False)


def inspect(reference: str) -> dict:
    """`docker image inspect`, as the docker CLI reports it."""
    proc = subprocess.run(["docker", "image", "inspect", reference], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)[0]


# ------------------------------------------------------------------------------------------- the context stream

def test_the_streamed_context_is_the_sdks_own_archive_byte_for_byte(tmp_path):
    context = context_tree(tmp_path / "ctx")
    pieces = list(context_stream(context, chunk=4096))
    assert b"".join(pieces) == sdk_archive(str(context)).read()
    # streamed as it is read, in pieces of one to two chunks, never the whole
    assert len(pieces) > 3 and all(4096 <= len(piece) < 2 * 4096 for piece in pieces[:-1])


def test_a_file_that_shrinks_while_it_is_sent_is_an_error_naming_it(tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    big = context / "big.whl"
    big.write_bytes(b"w" * 20000)
    stream = context_stream(context, chunk=4096)
    next(stream)
    big.write_bytes(b"")
    with pytest.raises(GpuprovError) as caught:
        list(stream)
    assert caught.value.message == f"cannot send {big} to the engine: it shrank to 4096 bytes while it was sent"


@pytest.mark.docker
def test_a_context_the_sdk_built_is_all_cache_hits_when_streamed(engine, tmp_path, tags):
    context = context_tree(tmp_path / "ctx")
    labels = {CONTEXT_HASH: context_hash(context)}
    sdk = list(engine.api.build(path=str(context), tag=tags[0], decode=True, rm=True, labels=labels))
    assert any("Successfully built" in item.get("stream", "") for item in sdk), sdk
    streamed = build_image(engine.api, "tree", context, tags[1:], labels=labels)
    assert streamed.cache_hits == streamed.work_steps == len(streamed.steps) - 1
    assert inspect(tags[1])["Id"] == inspect(tags[0])["Id"] == streamed.image_id


@pytest.mark.docker
def test_the_context_is_hashed_once_when_the_labels_carry_its_hash(engine, tmp_path, tags, monkeypatch):
    context = context_tree(tmp_path / "ctx")
    digest = context_hash(context)

    def again(folder):
        raise AssertionError(f"{folder} hashed again")

    monkeypatch.setattr("gpuprov.images.build.context_hash", again)
    built = build_image(engine.api, "tree", context, tags[:1], labels={CONTEXT_HASH: digest})
    assert built.context_hash == digest == inspect(tags[0])["Config"]["Labels"][CONTEXT_HASH]


def test_images_are_built_at_most_parallel_at_a_time_and_reported_in_their_order():
    running, most, guard = [], [], threading.Lock()

    def work(item):
        with guard:
            running.append(item)
            most.append(len(running))
        time.sleep(0.05 * (5 - item))       # the first ones end last
        with guard:
            running.remove(item)
        return item * 10

    assert in_parallel(work, [0, 1, 2, 3, 4], 2) == [0, 10, 20, 30, 40]
    assert max(most) == 2
    most.clear()
    assert in_parallel(work, [0, 1, 2], 1) == [0, 10, 20] and max(most) == 1


def test_an_unexpected_error_in_one_build_is_raised_and_no_later_build_starts():
    started = []

    def work(item):
        started.append(item)
        if item == 1:
            raise KeyError("a bug")
        time.sleep(0.2 if item == 0 else 0)
        return item

    with pytest.raises(KeyError):
        in_parallel(work, [0, 1, 2, 3], 2)
    assert started == [0, 1]


@pytest.mark.parametrize("parallel", ["0", "two", -1])
def test_parallel_is_a_whole_number_from_1_before_anything_is_written(tmp_path, capsys, parallel):
    from invoke import Config
    from invoke.exceptions import Exit

    reports = tmp_path / "reports"
    with pytest.raises(Exit) as caught:
        image_tasks.build(Context(Config(overrides={"gpuprov": {"reports": str(reports)}})), parallel=parallel)
    assert caught.value.code == 2 and capsys.readouterr().err.splitlines()[0] == (
        f"error: --parallel must be a whole number >= 1, not {parallel!r}")
    assert not reports.exists()


# --------------------------------------------------------------------------------- the versions read in an image

class Inspected:
    """An engine's answer to inspect_image: what `images` holds (reference -> (Id, labels))."""

    def __init__(self, images: dict):
        self.images = images
        self.api = self

    def inspect_image(self, reference: str) -> dict:
        image_id, labels = self.images[reference]
        return {"Id": image_id, "Config": {"Labels": labels}}


CPU = {"torch": "2.13.0+cpu", "cuda": None, "cudnn": None, "nccl": None}


@pytest.fixture
def probes(monkeypatch):
    """Each container the verification starts (the image it runs), answering CPU's versions."""
    started = []

    def probe(client, image, run_as=None):
        started.append(run_as or image)
        return dict(CPU)

    monkeypatch.setattr(verify, "image_versions", probe)
    return started


def test_a_rebuild_to_the_same_image_id_reuses_the_versions_read_in_it(tmp_path, probes):
    record = tmp_path / "lab.versions.json"
    client = Inspected({"lab:1": ("sha256:" + "a" * 64, {"io.gpuprov.purpose": "train"})})
    first = verify_image(client, "lab:1", {"torch": "2.13"}, {"io.gpuprov.purpose": "train"}, record=record)
    again = verify_image(client, "lab:1", {"torch": "2.13"}, {"io.gpuprov.purpose": "train"}, record=record)
    assert probes == ["sha256:" + "a" * 64]     # one container, of the image's ID
    assert not first.reused and again.reused and first.problems == again.problems == []
    assert again.versions == CPU and again.to_dict()["versions_read"] == "recorded for this image ID"
    assert json.loads(record.read_text()) == {"image_id": "sha256:" + "a" * 64, "probe": PROBE, "versions": CPU}


def test_the_spec_is_compared_again_when_the_versions_are_reused(tmp_path, probes):
    record = tmp_path / "lab.versions.json"
    client = Inspected({"lab:1": ("sha256:" + "a" * 64, {"io.gpuprov.purpose": "train"})})
    verify_image(client, "lab:1", {"torch": "2.13"}, {}, record=record)
    later = verify_image(client, "lab:1", {"torch": "2.14", "cuda": "12.8"}, {"io.gpuprov.purpose": "infer"},
                         record=record)
    assert later.reused and later.problems == [
        "torch: the spec has 2.14, the image reports 2.13.0+cpu", "cuda: the spec has 12.8, the image reports none",
        "label io.gpuprov.purpose: the spec has 'infer', the image has 'train'"]


@pytest.mark.parametrize("record_text", [
    None,                                                                         # none yet
    "{not json",                                                                  # damaged
    json.dumps({"image_id": "sha256:" + "b" * 64, "probe": PROBE, "versions": CPU}),   # another image
    json.dumps({"image_id": "sha256:" + "a" * 64, "probe": "print(1)", "versions": CPU}),  # another probe
    json.dumps({"image_id": "sha256:" + "a" * 64, "probe": PROBE, "versions": "2.13"}),    # not versions
    json.dumps(["sha256:" + "a" * 64]),                                           # not a record
])
def test_versions_not_recorded_for_this_image_and_probe_are_read_in_a_container(tmp_path, probes, record_text):
    record = tmp_path / "lab.versions.json"
    if record_text is not None:
        record.write_text(record_text)
    client = Inspected({"lab:1": ("sha256:" + "a" * 64, {})})
    found = verify_image(client, "lab:1", {"torch": "2.13"}, {}, record=record)
    assert probes == ["sha256:" + "a" * 64] and not found.reused
    assert json.loads(record.read_text())["image_id"] == "sha256:" + "a" * 64


# ----------------------------------------------------------------------------- images.build, rebuild and change

def lab_image():
    return next(image for image in load_specs() if image.id == "lab-pytorch-cpu")


def tiny_context(folder: Path, image, note: str) -> Path:
    """A context that carries the spec's labels (what the verification compares) and a file to change."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "note.txt").write_text(note)
    lines = ["FROM scratch", "COPY note.txt /note.txt"]
    lines += [f'LABEL {key}="{value}"' for key, value in image_labels(image).items()]
    (folder / "Dockerfile").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.docker
def test_a_no_change_build_starts_no_container_and_a_change_is_rebuilt_and_verified(
        engine, tmp_path, tags, probes, monkeypatch):
    image = lab_image()
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path / "out")
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(image_tasks, "_tags", lambda image, registry, revision: list(tags))
    context = tiny_context(tmp_path / "ctx", image, "one\n")

    def build(**options):
        item = Rendered(image, context, (context / "Dockerfile").read_text(), context_hash(context))
        [entry] = image_tasks._build_sdk([item], registry=None, changed_only=options.get("changed_only", False),
                                         no_cache=False, push=False, progress=lambda text, style=None: None)
        assert entry["result"] != "failed", entry
        return entry

    first = build()
    assert first["result"] == "built" and first["verification"]["versions_read"] == "in a container"
    again = build()
    assert again["result"] == "built" and again["cache_hits"] == len(again["steps"]) - 1 >= 3
    assert again["image_id"] == first["image_id"] == inspect(tags[0])["Id"]
    assert again["verification"]["versions_read"] == "recorded for this image ID"
    assert probes == [first["image_id"]]             # one container for both builds
    tiny_context(context, image, "two\n")
    changed = build()
    assert changed["result"] == "built" and changed["image_id"] != first["image_id"] == again["image_id"]
    assert not changed["steps"][1]["cached"]
    assert changed["verification"]["versions_read"] == "in a container"
    assert probes == [first["image_id"], changed["image_id"]] and changed["image_id"] == inspect(tags[0])["Id"]
    unchanged = build(changed_only=True)
    assert unchanged["result"] == "unchanged" and "verification" not in unchanged and len(probes) == 2
    record = json.loads(versions_record(image.id).read_text())
    assert record["image_id"] == changed["image_id"] and versions_record(image.id).parent == tmp_path / "out"


# ------------------------------------------------------------------------------------------- wheels, lazily

def local_specs() -> set[str]:
    """The shipped specs on a local base, as the YAML says (a spec's images are its name and matrix entries)."""
    names = set()
    for path in (PROJECT / "gpuprov" / "images" / "specs").glob("*.yaml"):
        spec = yaml.safe_load(path.read_text())
        if "local" in (spec.get("base") or {}):
            names.add(spec["name"])
    return names


@pytest.fixture
def no_download(monkeypatch):
    def download(*args, **kwargs):
        raise AssertionError("the wheelhouse was downloaded")

    monkeypatch.setattr("gpuprov.validation.env.wheelhouse_for", download)


def test_only_images_on_a_local_base_need_wheels_and_none_are_downloaded_to_render(tmp_path, no_download):
    refused, wheel_copies = set(), {}
    for image in load_specs():
        try:
            rendered = render(image, output=tmp_path / "out", wheelhouse=tmp_path / "empty", download=False)
        except WheelsNotDownloaded as exc:
            refused.add(image.name)
            assert exc.message.startswith(f"{image.id} installs from the wheelhouse cp311-")
            assert f"invoke images.build --name {image.id}" in exc.hint
            assert not (tmp_path / "out" / image.id).exists()
            continue
        copies = [row["value"] for row in DockerfileParser(str(rendered.folder / "Dockerfile")).structure
                  if row["instruction"] == "COPY"]
        wheel_copies[image.id] = [copy for copy in copies if "wheel" in copy]
    assert refused == local_specs() == {"lab-pytorch-cpu", "lab-pytorch-cpu-infer"}
    assert wheel_copies and all(copies == [] for copies in wheel_copies.values())
    assert not (tmp_path / "empty").exists()


def test_the_render_task_downloads_nothing_and_names_each_image_it_left_out(tmp_path, monkeypatch, capsys,
                                                                          no_download):
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path / "out")
    monkeypatch.setattr(gpuprov.images, "WHEELHOUSE", tmp_path / "wheelhouse")
    image_tasks.render(Context(), name=["lab-pytorch-cpu", "cuda-pytorch-train"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("lab-pytorch-cpu installs from the wheelhouse cp311-x86_64-glibc2.36-cpu-torch2.13.0, which is not "
            "downloaded yet (about 250 MB): not rendered; `invoke images.build --name lab-pytorch-cpu` downloads it "
            "when it builds the image; `invoke images.render --wheels --name lab-pytorch-cpu` renders it now") in out
    assert sorted(path.name for path in (tmp_path / "out").iterdir() if path.is_dir()) == [
        "cuda-pytorch-train-2.8.0-cu128", "cuda-pytorch-train-2.8.0-cu129"]


def fake_wheelhouse(root: Path) -> Path:
    """A downloaded wheelhouse as gpuprov.validation.env writes it: wheels and their manifest, an hour old."""
    folder = root / "cp311-x86_64-glibc2.36-cpu-torch2.13.0"
    folder.mkdir(parents=True)
    names = ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "numpy-2.4.6-cp311-cp311-linux_x86_64.whl",
             "onnx-1.23.2-cp311-cp311-linux_x86_64.whl", "onnxruntime-1.32.0-cp311-cp311-linux_x86_64.whl",
             "pip-26.3-py3-none-any.whl"]
    files = {}
    for name in names:
        (folder / name).write_bytes(name.encode() * 1000)
        os.utime(folder / name, ns=(HOUR_AGO, HOUR_AGO))
        files[name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "wheelhouse.json").write_text(json.dumps({
        "files": files, "requirements": ["torch==2.13.0", "numpy", "onnx", "onnxruntime"], "request": {}}))
    return root


def test_a_downloaded_wheelhouse_is_linked_without_a_download_and_its_wheels_read_once(tmp_path, monkeypatch,
                                                                                    no_download):
    root = fake_wheelhouse(tmp_path / "wheelhouse")
    read = []
    real = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda handle, name: read.append(Path(handle.name).name)
                        or real(handle, name))
    first = render(lab_image(), output=tmp_path / "out", wheelhouse=root, download=False)
    wheels = first.folder / "wheels"
    torch = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert os.stat(wheels / torch).st_ino == os.stat(root / "cp311-x86_64-glibc2.36-cpu-torch2.13.0" / torch).st_ino
    assert "torch==2.13.0+cpu" in first.dockerfile and "pip-26.3-py3-none-any.whl/pip install" in first.dockerfile
    assert sum(name.endswith(".whl") for name in read) == 5
    read.clear()
    second = render(lab_image(), output=tmp_path / "out", wheelhouse=root, download=False)
    assert [name for name in read if name.endswith(".whl")] == [] and read    # the smoke suite's new copies are read
    assert second.context_hash == first.context_hash == context_hash(second.folder)


def test_the_digest_cache_gives_the_hash_of_a_full_read(tmp_path):
    context = context_tree(tmp_path / "ctx")
    for path in (context / "wheels").iterdir():
        os.utime(path, ns=(HOUR_AGO, HOUR_AGO))
    store = tmp_path / "digests.json"
    full = context_hash(context)
    cached = FileDigests(store, context)
    assert context_hash(context, cached) == full
    cached.save()
    remembered = json.loads(store.read_text())
    # the files changed an hour ago are remembered; the ones just written may change again within their mtime's tick
    assert sorted(remembered) == ["wheels/big.whl", "wheels/exact.whl", "wheels/same.whl"]
    assert remembered["wheels/exact.whl"][4] == hashlib.sha256(b"x" * 8192).hexdigest()
    assert context_hash(context, FileDigests(store, context)) == full
    (context / "wheels" / "exact.whl").write_bytes(b"y" * 8192)     # a change: a new mtime
    assert context_hash(context, FileDigests(store, context)) == context_hash(context) != full
    store.write_text('{"wheels/big.whl": [1, 2, 3, 4, "not hex"]')
    assert context_hash(context, FileDigests(store, context)) == context_hash(context)
    fresh = FileDigests(store, context / "smoke")     # files just written only: nothing to remember, no store
    assert context_hash(context / "smoke", fresh) == context_hash(context / "smoke")
    fresh.save()
    assert not store.exists()
