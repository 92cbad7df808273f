"""NVIDIA's image contract as NVIDIA writes it, and builds and health checks that hold on real hosts. The judges are
outside gpuprov: NVIDIA's own Dockerfiles (their NVIDIA_REQUIRE_CUDA lines, copied verbatim into
tests/fixtures/nvidia-cuda-images/ and read back by dockerfile-parse), NVIDIA's CUDA compatibility documents, apt
itself (its resolver on an archive whose -updates pocket moved python3-defaults) and apt-cache's view of
python3-defaults, and onnxruntime."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from helpers.images import cuda_spec

from gpuprov.core.errors import GpuprovError
from gpuprov.images.fields import EXACT_DEPENDS
from gpuprov.images.labels import MIN_DRIVER, image_labels
from gpuprov.images.render import render
from gpuprov.images.run import check_driver
from gpuprov.images.spec import SpecError, load_spec, load_specs
from gpuprov.images.verify import expected_versions, version_problems
from gpuprov.images.versions import require_cuda, wheel_min_driver

SPEC = cuda_spec()   # a CUDA train image with its Python family pinned

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-cuda-images" / "NVIDIA_REQUIRE_CUDA"
UBUNTU = "3.12.3-0ubuntu2"            # python3-defaults of Ubuntu 24.04 (noble), its release pocket
UPDATED = "3.12.3-0ubuntu2.1"         # the same family in noble-updates


@pytest.fixture(scope="module")
def nvidia(tmp_path_factory) -> dict[str, str]:
    """{"12.8.1/ubuntu2404": NVIDIA_REQUIRE_CUDA} as dockerfile-parse reads NVIDIA's own ENV lines."""
    folder = tmp_path_factory.mktemp("nvidia")
    out = {}
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        dist, _, instruction = line.partition(" ")
        parser = DockerfileParser(str(folder / "Dockerfile"))
        parser.content = f"FROM scratch\n{instruction}\n"
        out[dist] = parser.envs["NVIDIA_REQUIRE_CUDA"]
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("images")
    return {image.id: (image, render(image, output=out).folder / "Dockerfile") for image in load_specs()}


def errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return [line.replace(str(path), "FILE") for line in info.value.errors]


# ------------------------------------------------------------------------------------------ NVIDIA_REQUIRE_CUDA

def test_nvidia_require_cuda_is_nvidias_string_for_every_image_nvidia_published(nvidia):
    assert len(nvidia) == 21
    for dist, value in nvidia.items():
        assert require_cuda("cuda", dist.split("/")[0]) == value, dist


def test_the_shipped_cuda_images_carry_nvidias_string_of_their_base(rendered, nvidia):
    checked = []
    for image, dockerfile in rendered.values():
        if image.base.kind != "cuda":
            continue
        ubuntu = re.search(r"ubuntu([0-9.]+)$", image.base.image).group(1).replace(".", "")
        parsed = DockerfileParser(str(dockerfile))
        assert parsed.envs["NVIDIA_REQUIRE_CUDA"] == nvidia[f"{image.versions.cuda}/ubuntu{ubuntu}"], image.id
        checked.append(image.versions.cuda)
    assert sorted(checked) == ["12.8.1", "12.8.1", "12.9.1"]


def test_the_video_capability_is_kept_as_nvidias_pytorch_container_asks_for_it(rendered):
    # nvcr.io/nvidia/pytorch images (23.10-py3 .. 26.03-py3) run with NVIDIA_DRIVER_CAPABILITIES=compute,utility,video
    for image, dockerfile in rendered.values():
        assert DockerfileParser(str(dockerfile)).envs["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility,video", image.id


def test_a_cuda_release_whose_contract_is_not_recorded_is_refused(tmp_path):
    assert errors(tmp_path, SPEC.replace('"12.8.1"', '"13.2.0"')) == [
        "FILE:4:14: base.cuda: gpuprov's data does not record the NVIDIA_REQUIRE_CUDA of nvidia/cuda:13.2.0 images "
        "(gpuprov/data/cuda.yaml image_contract): pick another CUDA, or add it from "
        "dist/13.2.0/ubuntu2404/base/Dockerfile of NVIDIA's container-images/cuda"]


# ------------------------------------------------------------------------------------------ io.gpuprov.min-driver

def test_a_cuda_wheel_image_runs_on_every_driver_of_cuda_12s_minor_version_compatibility(rendered):
    # CUDA Toolkit release notes and "CUDA Compatibility", minor version compatibility: CUDA 12.x applications run on
    # drivers >= 525.60.13; PyTorch's cu128 and cu129 wheels bundle their CUDA 12 runtime
    r550 = {"loaded_driver_version": "550.163.01", "nvidia_smi": {"driver_version": "550.163.01", "gpus": [{}]}}
    r520 = {"loaded_driver_version": "520.61.05", "nvidia_smi": {"driver_version": "520.61.05", "gpus": [{}]}}
    for image_id in ("cuda-pytorch-train-2.8.0-cu128", "cuda-pytorch-train-2.8.0-cu129", "cuda-onnxruntime-infer"):
        image, dockerfile = rendered[image_id]
        label = DockerfileParser(str(dockerfile)).labels[MIN_DRIVER]
        assert label == "525.60.13" == image_labels(image)[MIN_DRIVER]
        assert check_driver("gpu01", image_id, r550, label, False) is None
        with pytest.raises(GpuprovError, match="older than 525.60.13"):
            check_driver("gpu01", image_id, r520, label, False)
    # "CUDA Compatibility", Table 1 (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html):
    # CUDA 13.x >= 580, CUDA 11.x >= 450 (release notes: 450.80.02)
    assert (wheel_min_driver("cu130"), wheel_min_driver("cu118")) == ("580", "450.80.02")


# ------------------------------------------------------------------------------------------ verification

def test_torchs_cudnn_matches_the_release_notes_cudnn_on_their_common_precision():
    # NGC PyTorch 24.05 release notes: cuDNN 9.1.0.70; torch.backends.cudnn.version() there is 90100, "9.1.0"
    image = {i.id: i for i in load_specs()}["ngc-pytorch-train-2.4.0a0-cu124"]
    reported = {"torch": "2.4.0a0+07cecf4168", "cuda": "12.4", "cudnn": "9.1.0", "nccl": "2.21.5"}
    assert version_problems(expected_versions(image.versions), reported) == []
    assert version_problems(expected_versions(image.versions), reported | {"cudnn": "9.0.0"}) == [
        "cudnn: the spec has 9.1.0.70, the image reports 9.0.0"]
    assert version_problems(expected_versions(image.versions), reported | {"cuda": "12.40"}) == [
        "cuda: the spec has 12.4, the image reports 12.40"]
    assert version_problems(expected_versions(image.versions), reported | {"cuda": "12"}) == [
        "cuda: the spec has 12.4, the image reports 12"]   # fewer components than major.minor prove nothing


# ------------------------------------------------------------------------------------------ apt pins

def apt_cache_exact_depends(package: str) -> tuple[str, ...] | None:
    """The packages `package` depends on at exactly its own version, as apt-cache shows this machine's archive."""
    done = subprocess.run(["apt-cache", "show", package], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or not done.stdout.strip():
        return None
    record = done.stdout.split("\n\n")[0]
    fields = dict(re.findall(r"^(Depends|Pre-Depends): (.*)$", record, re.MULTILINE))
    relations = ", ".join(fields.get(key, "") for key in ("Pre-Depends", "Depends"))
    return tuple(name for name, op in re.findall(r"([a-z0-9][a-z0-9+.-]+)(?::any)? \((=) [^)]+\)", relations))


@pytest.mark.tool
@pytest.mark.skipif(shutil.which("apt-cache") is None, reason="apt-cache (Debian or Ubuntu) is the judge")
def test_the_exact_version_families_are_what_apt_cache_shows():
    shown = {package: apt_cache_exact_depends(package) for package in EXACT_DEPENDS}
    known = {package: tuple(sorted(names)) for package, names in shown.items() if names is not None}
    assert "python3" in known and "python3-venv" in known
    assert known == {package: tuple(sorted(EXACT_DEPENDS[package])) for package in known}


def test_a_spec_that_pins_part_of_a_family_is_refused(tmp_path):
    text = SPEC.replace('python3-minimal: "3.12.3-0ubuntu2", libpython3-stdlib: "3.12.3-0ubuntu2",\n      ', "")
    assert errors(tmp_path, text) == [
        "FILE:6:7: apt.python3: python3 3.12.3-0ubuntu2 depends on python3-minimal and libpython3-stdlib at exactly "
        "its version: pin python3-minimal and libpython3-stdlib to 3.12.3-0ubuntu2 too (else apt takes a newer one "
        "from the release's updates, which this pin refuses, and the build breaks)",
        "FILE:6:35: apt.python3-venv: python3-venv 3.12.3-0ubuntu2 depends on python3, python3-minimal and "
        "libpython3-stdlib at exactly its version: pin python3-minimal and libpython3-stdlib to 3.12.3-0ubuntu2 too "
        "(else apt takes a newer one from the release's updates, which this pin refuses, and the build breaks)"]


def _packages(version: str, interpreter: str) -> str:
    """A Packages index of python3-defaults at `version` and python3.12 at `interpreter`, with the relations of
    Ubuntu 24.04's records (apt-cache show python3 python3-minimal libpython3-stdlib python3-venv on noble)."""
    def record(package, ver, **relations):
        lines = [f"Package: {package}", f"Version: {ver}", "Architecture: amd64", "Maintainer: t <t@example.org>"]
        lines += [f"{key.replace('_', '-').title()}: {value}" for key, value in relations.items()]
        return "\n".join([*lines, f"Filename: pool/{package}_{ver}_amd64.deb", "Size: 1", "Description: t"]) + "\n"
    floor = "(>= 3.12.3-1~)"
    family = [record("python3", version, pre_depends=f"python3-minimal (= {version})",
                     depends=f"python3.12 {floor}, libpython3-stdlib (= {version})"),
              record("python3-minimal", version, pre_depends=f"python3.12-minimal {floor}"),
              record("libpython3-stdlib", version, depends=f"libpython3.12-stdlib {floor}"),
              record("python3-venv", version, depends=f"python3.12-venv {floor}, python3 (= {version})")]
    return "\n".join(family + [record(package, interpreter) for package in
                               ("python3.12", "python3.12-minimal", "libpython3.12-stdlib", "python3.12-venv")])


def apt_simulate(folder: Path, words: list[str]) -> subprocess.CompletedProcess:
    """`apt-get -s install WORDS` against an archive of a release pocket and an -updates pocket that moved
    python3-defaults (an empty dpkg status, nothing of this machine's apt configuration)."""
    for pocket, version, interpreter in (("release", UBUNTU, "3.12.3-1"), ("updates", UPDATED, "3.12.3-1ubuntu0.1")):
        (folder / pocket).mkdir(parents=True)
        (folder / pocket / "Packages").write_text(_packages(version, interpreter))
    for sub in ("state/lists/partial", "cache/archives/partial", "parts"):
        (folder / sub).mkdir(parents=True)
    (folder / "state" / "status").write_text("")
    (folder / "sources.list").write_text(f"deb [trusted=yes] file:{folder / 'release'} ./\n"
                                         f"deb [trusted=yes] file:{folder / 'updates'} ./\n")
    options = [f"-oDir::State={folder / 'state'}", f"-oDir::State::status={folder / 'state' / 'status'}",
               f"-oDir::Cache={folder / 'cache'}", f"-oDir::Etc::SourceList={folder / 'sources.list'}",
               f"-oDir::Etc::SourceParts={folder / 'parts'}", f"-oDir::Etc::Parts={folder / 'parts'}",
               f"-oDir::Etc::PreferencesParts={folder / 'parts'}", "-oDir::Etc::Preferences=/dev/null",
               "-oAPT::Architecture=amd64", "-oDebug::NoLocking=1"]
    subprocess.run(["apt-get", *options, "update"], capture_output=True, text=True, timeout=120, check=True)
    return subprocess.run(["apt-get", *options, "-s", "install", *words], capture_output=True, text=True, timeout=120)


def apt_words(dockerfile: Path, names: tuple[str, ...]) -> list[str]:
    """The package=version words of `names` in the apt block's install command (the image's own stage, the last
    one), as sh splits them."""
    run = [row["value"] for row in DockerfileParser(str(dockerfile)).structure
           if row["instruction"] == "RUN" and "apt-get install" in row["value"]][-1]
    return [word for word in shlex.split(run) if re.fullmatch(r"[a-z0-9][a-z0-9+.-]+=[^=]+", word)
            and word.split("=")[0] in names]


@pytest.mark.tool
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt-get (Debian or Ubuntu) is the judge")
def test_the_rendered_apt_pins_install_after_the_release_moved_python3_in_its_updates(rendered, tmp_path):
    family = ("python3", "python3-minimal", "libpython3-stdlib", "python3-venv")
    words = apt_words(rendered["cuda-pytorch-train-2.8.0-cu128"][1], family)
    assert sorted(words) == sorted(f"{name}={UBUNTU}" for name in family)
    done = apt_simulate(tmp_path / "family", words)
    assert done.returncode == 0, done.stdout + done.stderr
    installs = dict(re.findall(r"^Inst (\S+) \((\S+) ", done.stdout, re.MULTILINE))
    assert {name: installs[name] for name in ("python3", "python3-minimal", "python3-venv")} == {
        "python3": UBUNTU, "python3-minimal": UBUNTU, "python3-venv": UBUNTU}
    assert installs["python3.12"] == "3.12.3-1ubuntu0.1"          # the interpreter's own updates still come in
    # what the specs pinned before: apt refuses, as it does on noble once noble-updates moves python3-minimal
    before = apt_simulate(tmp_path / "before", [f"python3={UBUNTU}", f"python3-venv={UBUNTU}"])
    assert before.returncode != 0
    assert f"python3-minimal (= {UBUNTU}) but {UPDATED} is to be installed" in before.stdout


# ------------------------------------------------------------------------------------------ healthcheck

def test_the_onnxruntime_healthcheck_fails_where_a_session_cannot_use_cuda(rendered, tmp_path):
    # onnxruntime-gpu lists CUDAExecutionProvider in get_available_providers() on any host, GPU or not: this
    # controller's onnxruntime is made to list it the same way, while its sessions, as on a GPU-less host, run on
    # the CPU. The image's healthcheck must say unhealthy; the one that read the available providers said healthy.
    image, dockerfile = rendered["cuda-onnxruntime-infer"]
    [line] = [row["value"] for row in DockerfileParser(str(dockerfile)).structure
              if row["instruction"] == "HEALTHCHECK"]
    argv = json.loads(line.partition(" CMD ")[2])
    assert argv[:2] == ["python3", "-c"] and list(image.healthcheck.test) == argv
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    listed = ("import onnxruntime; onnxruntime.get_available_providers = lambda: ['CUDAExecutionProvider', "
              "'CPUExecutionProvider']; ")
    old = "import sys, onnxruntime; sys.exit('CUDAExecutionProvider' not in onnxruntime.get_available_providers())"
    judged = {name: subprocess.run([sys.executable, "-c", listed + code], capture_output=True, text=True, timeout=120,
                                   cwd=tmp_path).returncode for name, code in (("session", argv[2]), ("listed", old))}
    assert judged == {"session": 1, "listed": 0}
