"""images.build through the engine's API on its Unix socket and through the Docker SDK, on this machine's engine
(started as gpuprov.lab.engine does when none answers): real builds of a tiny image made of this machine's own
/bin/sh and the libraries it loads.

What the engine did is judged by the engine itself (`docker inspect`, `docker history`) and by the texts of
moby's classic builder and runc, never by gpuprov's own reading of the stream."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.images.build import (
    BuildStepError,
    StepStream,
    bake,
    bake_command,
    build_engine,
    build_image,
    buildx_available,
    in_parallel,
    require_buildx,
)
from gpuprov.images.container import run_in_image
from gpuprov.images.engine import SocketEngine, socket_path
from gpuprov.images.labels import CONTEXT_HASH, context_hash
from gpuprov.images.push import push_image, registry_auth
from gpuprov.images.suite import run_image_suite
from gpuprov.images.verify import expected_versions, label_problems, version_problems

REPOSITORY = "gpuprov-test/images-build"


def _closure(program: str) -> list[str]:
    """`program` and the shared libraries `ldd` says it loads (paths as the loader asks for them)."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    paths = [program]
    for line in out.splitlines():
        words = line.split()
        path = words[2] if len(words) >= 3 and words[1] == "=>" else words[0]
        if path.startswith("/"):
            paths.append(path)
    return paths


@pytest.fixture(scope="session")
def engine():
    from gpuprov.lab.engine import ensure_engine

    return ensure_engine(lambda line: None)


@pytest.fixture(scope="session")
def sh_image(engine) -> str:
    """An image of this machine's /bin/sh (dash) and its libraries only: enough for RUN steps."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in _closure(os.path.realpath("/bin/sh")):
            info = tar.gettarinfo(os.path.realpath(path), arcname=path.lstrip("/"))
            info.mtime = info.uid = info.gid = 0
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, os.path.realpath("/bin/sh")
        tar.addfile(link)
        tmp = tarfile.TarInfo("tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
    data = buffer.getvalue()
    tag = f"gpuprov-test/sh:{hashlib.sha256(data).hexdigest()[:12]}"
    engine.api.import_image_from_data(data, repository=tag.split(":")[0], tag=tag.split(":")[1])
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.fixture(params=["socket", "sdk"])
def api(request, engine):
    """What builds: the engine's API on its Unix socket (gpuprov.images.engine, as images.build uses it where the
    engine listens on one), and the SDK's APIClient (any other DOCKER_HOST)."""
    if request.param == "sdk":
        return engine.api
    path = socket_path()
    if path is None:
        pytest.skip("DOCKER_HOST names no Unix socket")
    return SocketEngine(path)


@pytest.fixture
def context(tmp_path, sh_image) -> Path:
    folder = tmp_path / "ctx"
    folder.mkdir()
    (folder / "hello.txt").write_text("hello\n")
    (folder / "Dockerfile").write_text(f"FROM {sh_image}\nCOPY hello.txt /hello.txt\nRUN echo built > /built\n"
                                       "LABEL org.opencontainers.image.title=tiny\n")
    return folder


@pytest.fixture
def tags(request):
    """Tags unique to the test and its parameters (and this process); every image they name is removed
    afterwards."""
    unique = hashlib.sha256(f"{request.node.nodeid} {os.getpid()}".encode()).hexdigest()[:8]
    names = [f"{REPOSITORY}:{request.node.name[:50].replace('[', '-').replace(']', '')}-{unique}-{n}"
             for n in ("a", "b")]
    yield names
    subprocess.run(["docker", "rmi", "-f", *names], capture_output=True, check=False)


def inspect(reference: str) -> dict:
    """`docker inspect` of an image, as the docker CLI reports it."""
    proc = subprocess.run(["docker", "image", "inspect", reference], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)[0]


@pytest.mark.docker
def test_a_build_reports_each_step_as_it_starts_and_ends_and_labels_the_image(api, context, tags):
    events = []
    built = build_image(api, "tiny", context, tags, labels={"io.gpuprov.purpose": "train"},
                        on_event=lambda kind, step: events.append((kind, step.number, step.instruction)))
    dockerfile = context.joinpath("Dockerfile").read_text().splitlines()
    # the engine adds one LABEL step per build-time label, after the Dockerfile's own steps
    started = [(number, text) for kind, number, text in events if kind == "start"]
    assert [text for _, text in started][:4] == dockerfile
    assert [number for number, _ in started] == list(range(1, len(started) + 1))
    assert [kind for kind, _, _ in events] == ["start", "end"] * len(started)
    image = inspect(tags[0])
    assert image["Id"] == built.image_id == inspect(tags[1])["Id"]
    labels = image["Config"]["Labels"]
    assert labels["org.opencontainers.image.title"] == "tiny" and labels["io.gpuprov.purpose"] == "train"
    assert labels[CONTEXT_HASH] == built.context_hash
    assert sorted(image["RepoTags"]) == sorted(tags)


@pytest.mark.docker
def test_a_rebuild_without_a_change_is_all_cache_hits_and_no_cache_runs_every_step(api, context, tags):
    first = build_image(api, "tiny", context, tags)
    again = build_image(api, "tiny", context, tags)
    assert again.image_id == first.image_id == inspect(tags[0])["Id"]
    assert again.cache_hits == again.work_steps == len(again.steps) - 1 and not again.steps[0].cached
    fresh = build_image(api, "tiny", context, tags, no_cache=True)
    assert fresh.cache_hits == 0 and fresh.image_id != first.image_id
    assert inspect(tags[0])["Id"] == fresh.image_id


@pytest.mark.docker
def test_changed_only_builds_nothing_without_a_change_and_rebuilds_after_one(api, context, tags):
    first = build_image(api, "tiny", context, tags[:1])
    skipped = build_image(api, "tiny", context, tags, changed_only=True)
    assert skipped.skipped and skipped.steps == [] and skipped.image_id == first.image_id
    assert inspect(tags[1])["Id"] == first.image_id   # the unchanged image gets the tags it lacked
    (context / "hello.txt").write_text("hello again\n")
    rebuilt = build_image(api, "tiny", context, tags, changed_only=True)
    assert not rebuilt.skipped and rebuilt.image_id != first.image_id
    # the engine reused the layers before the changed COPY, and ran the rest
    assert [step.cached for step in rebuilt.steps[1:4]] == [False, False, False]
    labels = inspect(tags[0])["Config"]["Labels"]
    assert labels[CONTEXT_HASH] == rebuilt.context_hash != first.context_hash


@pytest.mark.docker
def test_the_context_hash_follows_names_contents_and_the_executable_bit(context):
    before = context_hash(context)
    assert context_hash(context) == before
    script = context / "hello.txt"
    script.chmod(0o755)
    executable = context_hash(context)
    script.chmod(0o644)
    assert executable != before and context_hash(context) == before
    script.rename(context / "hi.txt")
    assert context_hash(context) != before


@pytest.mark.docker
def test_a_failed_step_names_the_step_the_engines_message_and_the_output_tail(api, context, tags):
    dockerfile = context / "Dockerfile"
    lines = [f"line {n}" for n in range(40)]
    shell = "; ".join(f"echo {line}" for line in lines) + "; exit 3"
    run = f"RUN {shell}"
    dockerfile.write_text(dockerfile.read_text().replace("RUN echo built > /built", run))
    with pytest.raises(BuildStepError) as caught:
        build_image(api, "tiny", context, tags)
    error = caught.value
    # moby's classic builder: "The command '%s' returned a non-zero code: %d"
    assert error.message == f"step 3/5 failed: The command '/bin/sh -c {shell}' returned a non-zero code: 3"
    assert error.command == run and error.step == "build tiny"
    assert error.output.splitlines() == lines[-25:]
    shown = str(error).splitlines()
    assert shown[-16:-1] == [f"    {line}" for line in lines[-15:]]


@pytest.mark.docker
def test_a_step_the_runtime_cannot_start_is_named_with_the_runtimes_message(api, tmp_path, tags):
    (tmp_path / "Dockerfile").write_text("FROM scratch\nRUN true\n")
    with pytest.raises(BuildStepError) as caught:
        build_image(api, "scratch", tmp_path, tags)
    assert caught.value.message.startswith("step 2/3 failed: ")
    assert 'exec: "/bin/sh": stat /bin/sh: no such file or directory' in caught.value.message  # runc's words


@pytest.mark.docker
def test_a_dockerfile_the_engine_cannot_parse_is_refused_with_the_parsers_message(api, tmp_path, tags):
    (tmp_path / "Dockerfile").write_text("FROM scratch\nBOGUS x\n")
    with pytest.raises(GpuprovError) as caught:
        build_image(api, "bogus", tmp_path, tags)
    # moby's Dockerfile parser
    assert caught.value.message == ("the engine refused the build of bogus: dockerfile parse error line 2: unknown "
                                    "instruction: BOGUS")


def test_the_next_image_is_made_while_one_builds_and_its_error_waits_for_the_running_build():
    events = []

    def rendered():
        for number in range(3):
            events.append(f"made {number}")
            if number == 2:
                raise InputError("image 2 cannot be rendered")
            yield number

    def build(number):
        events.append(f"start {number}")
        time.sleep(0.3)
        events.append(f"end {number}")
        return number

    with pytest.raises(InputError):
        in_parallel(build, rendered(), 1)
    # made while the one before it built; one at a time; the failed one raised once the running build ended
    assert events.index("made 1") < events.index("end 0") < events.index("start 1")
    assert events.index("made 2") < events.index("end 1") == len(events) - 1
    assert in_parallel(build, iter(range(2)), 2) == [0, 1]


def test_buildx_is_refused_where_it_is_not_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no docker, so no buildx plugin either
    assert not buildx_available()
    with pytest.raises(InputError) as caught:
        require_buildx()
    assert caught.value.message == "--builder buildx needs the docker buildx plugin, which is not installed here"


# ---------------------------------------------------------------------------------------------- in the image

@pytest.mark.docker
def test_an_image_without_the_suite_fails_to_run_with_the_runtimes_words(engine, sh_image):
    with pytest.raises(GpuprovError) as caught:
        run_image_suite(engine, sh_image, {}, gpus=False)
    assert caught.value.message.startswith(f"the container of {sh_image} failed to run: ")
    # runc's words for a missing program
    assert 'exec: "/usr/local/bin/gpuprov-smoke": stat /usr/local/bin/gpuprov-smoke: no such file or directory' \
        in caught.value.message
    assert subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={sh_image}"], capture_output=True,
                          text=True, check=True).stdout == ""   # the container is removed


@pytest.mark.docker
def test_what_a_command_prints_comes_back_and_inputs_arrive_in_tmp(engine, sh_image):
    ran = run_in_image(engine, sh_image, ["/bin/sh", "-c", "read line < /tmp/gpuprov/in.txt; echo \"$line\"; "
                                                           "echo err >&2; exit 3"],
                       inputs={"in.txt": b"hello from the controller\n"})
    assert (ran.rc, ran.stdout, ran.stderr) == (3, "hello from the controller\n", "err\n")


@pytest.mark.docker
def test_the_build_engine_runs_containers_through_the_sdk_made_when_first_needed(engine, sh_image):
    built = build_engine()
    assert built._sdk is None or socket_path() is None      # on a Unix socket, no SDK client until a container
    ran = run_in_image(built, sh_image, ["/bin/sh", "-c", "echo from the sdk"])
    assert (ran.rc, ran.stdout) == (0, "from the sdk\n") and built._sdk is not None


@pytest.mark.parametrize(("expected", "found", "problems"), [
    ({"torch": "2.13.0+cpu", "cuda": None, "cudnn": None, "nccl": None},
     {"torch": "2.13.0+cpu", "cuda": None, "cudnn": None, "nccl": None}, []),
    ({"torch": "2.8.0+cu128", "cuda": "12.8", "cudnn": "9", "nccl": "2.27.3"},
     {"torch": "2.8.0+cu128", "cuda": "12.8", "cudnn": "9.10.2", "nccl": "2.27.3"}, []),
    ({"torch": "2.8.0+cu128", "cuda": "12.8", "nccl": "2.27.3"},
     {"torch": "2.8.0+cu129", "cuda": "12.9", "cudnn": "9.10.2", "nccl": "2.26.5"},
     ["torch: the spec has 2.8.0+cu128, the image reports 2.8.0+cu129",
      "cuda: the spec has 12.8, the image reports 12.9", "nccl: the spec has 2.27.3, the image reports 2.26.5"]),
    ({"torch": "2.13.0+cpu", "cuda": None}, {"torch": "2.13.0+cu130", "cuda": "13.0"},
     ["torch: the spec has 2.13.0+cpu, the image reports 2.13.0+cu130", "cuda: the spec has none, the image reports "
                                                                          "13.0"]),
    ({"cudnn": "9"}, {"cudnn": None}, ["cudnn: the spec has 9, the image reports none"]),
])
def test_version_problems_name_each_difference(expected, found, problems):
    assert version_problems(expected, found) == problems


def test_label_problems_name_missing_and_other_values():
    assert label_problems({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "9"}) == [
        "label b: the spec has '2', the image has '9'", "label c: the spec has '3', the image lacks it"]


def test_expected_versions_of_the_specs_images():
    from gpuprov.images.model import Versions

    cpu = Versions(pytorch="2.13.0+cpu", wheel="cpu")
    assert expected_versions(cpu) == {"torch": "2.13.0+cpu", "cuda": None, "cudnn": None, "nccl": None}
    ngc = Versions(pytorch="2.6.0a0+ecf3bae40a", wheel="cu128", cuda="12.8.0", min_driver="570.86.10")
    assert expected_versions(ngc) == {"torch": "2.6.0a0+ecf3bae40a", "cuda": "12.8"}   # cuDNN, NCCL unrecorded


# ---------------------------------------------------------------------------------------------- push

def test_registry_credentials_come_from_both_variables_or_neither():
    assert registry_auth({}) is None
    assert registry_auth({"GPUPROV_REGISTRY_USER": "ci", "GPUPROV_REGISTRY_PASSWORD": "s3cret"}) == {
        "username": "ci", "password": "s3cret"}
    with pytest.raises(InputError) as caught:
        registry_auth({"GPUPROV_REGISTRY_USER": "ci"})
    assert caught.value.message == ("set both GPUPROV_REGISTRY_USER and GPUPROV_REGISTRY_PASSWORD, or neither (then "
                                    "`docker login` applies)")


@pytest.mark.docker
def test_a_refused_push_names_the_reference_and_never_the_password(engine, context, tags):
    build_image(engine.api, "tiny", context, tags)
    reference = "127.0.0.1:9/gpuprov-test/tiny:1"   # nothing listens on port 9 (discard)
    engine.api.tag(tags[0], "127.0.0.1:9/gpuprov-test/tiny", "1")
    try:
        with pytest.raises(GpuprovError) as caught:
            push_image(engine.api, reference, auth={"username": "ci", "password": "p@ss-s3cret"})
    finally:
        engine.api.remove_image(reference)
    error = caught.value
    assert error.message.startswith(f"push of {reference} failed: ") and "connection refused" in error.message
    assert "p@ss-s3cret" not in str(error) and "p@ss-s3cret" not in json.dumps(error.to_dict())


# ---------------------------------------------------------------------------------------------- the tasks

@pytest.fixture
def task_ctx(tmp_path):
    from invoke import Config, Context

    return Context(Config(overrides={"gpuprov": {"reports": str(tmp_path / "reports")}}))


@pytest.mark.parametrize(("task", "kwargs", "message"), [
    ("build", {"builder": "kaniko"}, "error: images.build: --builder must be sdk or buildx, not 'kaniko'"),
    ("build", {"push": True}, "error: images.build: --push needs --registry: the registry to push to, such as "
                              "127.0.0.1:5000"),
    ("build", {"registry": "127.0.0.1:5000/", "name": ["nope"]},
     "error: images: --name: no image or spec named 'nope'; there are: "),
    ("push", {"name": ["lab-pytorch-cpu"]},
     "error: images.push: --registry is required: the registry to push to, such as 127.0.0.1:5000"),
    ("push", {"registry": "Registry With Spaces"},
     "error: images: --registry must be a registry host with an optional port and path, such as 127.0.0.1:5000 or "
     "registry.example.com/team, not 'Registry With Spaces'"),
])
def test_bad_input_is_exit_2_with_nothing_written(task_ctx, tmp_path, capsys, task, kwargs, message):
    from invoke.exceptions import Exit

    from gpuprov.tasks import images as image_tasks

    with pytest.raises(Exit) as caught:
        getattr(image_tasks, task)(task_ctx, **kwargs)
    assert caught.value.code == 2 and capsys.readouterr().err.splitlines()[0].startswith(message)
    assert not (tmp_path / "reports").exists()


@pytest.mark.docker
def test_testing_an_image_that_is_not_built_fails_that_image_with_a_report(task_ctx, tmp_path, capsys):
    from invoke.exceptions import Exit

    from gpuprov.tasks import images as image_tasks

    # its base, nvidia/cuda, comes from a registry this project's machines cannot reach: it is never built here
    if subprocess.run(["docker", "image", "inspect", "cuda-onnxruntime-infer:2.8.0-cu128-infer"],
                      capture_output=True).returncode == 0:
        pytest.skip("cuda-onnxruntime-infer is built on this machine")
    with pytest.raises(Exit) as caught:
        image_tasks.test(task_ctx, name=["cuda-onnxruntime-infer"], json_=True)
    document = json.loads(capsys.readouterr().out)
    assert caught.value.code == 1
    [entry] = document["images"]
    assert entry["result"] == "failed" and entry["error"]["error"].startswith(
        "cannot create a container of cuda-onnxruntime-infer:2.8.0-cu128-infer: No such image: ")
    assert json.loads(Path(document["report"]).read_text())["images"][0]["result"] == "failed"


def test_bake_streams_each_line_and_fails_with_the_tail():
    lines: list[str] = []
    script = "for n in $(seq 1 30); do echo line $n; done; echo oops >&2; exit 4"
    with pytest.raises(GpuprovError) as caught:
        bake(["sh", "-c", script], lines.append)
    assert lines == [f"line {n}" for n in range(1, 31)] + ["oops"]
    assert caught.value.message == "docker buildx bake failed with exit code 4"
    assert caught.value.output.splitlines() == lines[-25:]
    bake(["sh", "-c", "echo done"], lines.append)
    assert lines[-1] == "done"


def test_the_bake_command_names_the_file_the_targets_and_plain_progress(tmp_path):
    assert bake_command(tmp_path / "docker-bake.json", ["lab-pytorch-cpu"], no_cache=True, push=True) == [
        "docker", "buildx", "bake", "--file", str(tmp_path / "docker-bake.json"), "--progress", "plain",
        "--no-cache", "--push", "lab-pytorch-cpu"]


def test_a_pulled_bases_layers_are_reported_once_per_state():
    # the engine's JSON messages while a FROM pulls (moby's jsonmessage: status, id, progressDetail)
    events = []
    stream = StepStream("ngc", lambda kind, step: events.append((kind, step.lines[-1] if step.lines else None)))
    stream.feed({"stream": "Step 1/2 : FROM nvcr.io/nvidia/pytorch:25.01-py3\n"})
    for item in ({"status": "Pulling from nvidia/pytorch", "id": "25.01-py3"},
                 {"status": "Pulling fs layer", "id": "6414378b6477"},
                 {"status": "Downloading", "id": "6414378b6477", "progressDetail": {"current": 1, "total": 9}},
                 {"status": "Downloading", "id": "6414378b6477", "progressDetail": {"current": 5, "total": 9}},
                 {"status": "Pull complete", "id": "6414378b6477"},
                 {"status": "Digest: sha256:" + "1" * 64}):
        stream.feed(item)
    assert events == [("start", None), ("status", "25.01-py3: Pulling from nvidia/pytorch"),
                      ("status", "6414378b6477: Pulling fs layer"), ("status", "6414378b6477: Downloading"),
                      ("status", "6414378b6477: Pull complete"), ("status", "Digest: sha256:" + "1" * 64)]
