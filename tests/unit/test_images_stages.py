"""Images a fleet wants to pull: an image on a CUDA base starts from NVIDIA's plain `base` image and gets CUDA's
libraries and cuDNN once, from PyTorch's nvidia-* wheels; nccl-tests (with its -J JSON output) and nvbandwidth are
built in a devel stage and copied into the image, as HPC Container Maker's multi-stage recipes do; the images whose
suite runs torch.compile carry the C compiler and Python headers Triton builds with. The expected values come from
NVIDIA's and the tools' own sources (named where used); hadolint judges the rendered multi-stage Dockerfiles."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from helpers.images import CUDA_SPEC

from gpuprov.images.lint import lint
from gpuprov.images.render import render
from gpuprov.images.spec import load_spec, load_specs

CUDA_IMAGES = ("cuda-onnxruntime-infer", "cuda-pytorch-train-2.8.0-cu128", "cuda-pytorch-train-2.8.0-cu129")
# NVIDIA's tags (gitlab.com/nvidia/container-images/cuda dist/<X.Y.Z>/ubuntu2404/{base,devel}/Dockerfile): the base
# image installs cuda-cudart and cuda-compat only; devel adds nvcc (cuda-minimal-build) and libnccl-dev.
PLAIN = {"cuda-onnxruntime-infer": "12.8.1", "cuda-pytorch-train-2.8.0-cu128": "12.8.1",
         "cuda-pytorch-train-2.8.0-cu129": "12.9.1"}
# NVIDIA/nccl-tests: tag v2.18.0 is commit dd0bafd1..., the first release whose README documents
# `-J,--output_file <file> Write [JSON] output`; its README builds with `make MPI=... CUDA_HOME=...`.
NCCL_TESTS = "https://github.com/NVIDIA/nccl-tests/archive/dd0bafd17891809734e1bbbd6c2a3a778f3ff63e.tar.gz"
# NVIDIA/nvbandwidth: tag v0.8 is commit 66746a3b...; README: cmake and libboost-program-options-dev; its
# CMakeLists.txt detects the GPU's architecture unless CMAKE_CUDA_ARCHITECTURES is given (a build has no GPU).
NVBANDWIDTH = "https://github.com/NVIDIA/nvbandwidth/archive/66746a3bef61c8c2e12ab34955310da70b9e38cb.tar.gz"
SPEC = CUDA_SPEC   # FLAVOR: where a test puts `, flavor: ...`


@pytest.fixture(scope="module")
def dockerfiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("stages")
    return {image.id: render(image, output=out).folder / "Dockerfile" for image in load_specs()}


def stages(dockerfile: Path) -> list[list[dict]]:
    """The instructions of each stage, as dockerfile-parse reads them."""
    out: list[list[dict]] = []
    for row in DockerfileParser(str(dockerfile)).structure:
        if row["instruction"] == "FROM":
            out.append([])
        if out:
            out[-1].append(row)
    return out


def values(stage: list[dict], instruction: str) -> list[str]:
    return [row["value"] for row in stage if row["instruction"] == instruction]


@pytest.mark.parametrize("image_id", CUDA_IMAGES)
def test_a_cuda_image_starts_from_nvidias_plain_base_and_gets_cuda_and_cudnn_from_the_wheels_once(dockerfiles,
                                                                                                   image_id):
    parsed = DockerfileParser(str(dockerfiles[image_id]))
    cuda = PLAIN[image_id]
    assert parsed.parent_images == [f"nvidia/cuda:{cuda}-devel-ubuntu24.04", f"nvidia/cuda:{cuda}-base-ubuntu24.04"]
    assert parsed.baseimage == f"nvidia/cuda:{cuda}-base-ubuntu24.04"
    assert not any("cudnn" in image for image in parsed.parent_images)    # cuDNN comes with torch, not twice
    image = stages(dockerfiles[image_id])[-1]
    runs = " ".join(values(image, "RUN"))
    # the wheels' library folders are given to the dynamic linker (onnxruntime and nccl-tests load them too)
    assert "/nvidia/*/lib" in runs and "> /etc/ld.so.conf.d/gpuprov-nvidia-wheels.conf" in runs
    assert runs.index("pip install") < runs.index("ldconfig")


@pytest.mark.parametrize("image_id", CUDA_IMAGES)
def test_the_tools_are_built_in_the_devel_stage_at_their_commits_and_copied_into_the_image(dockerfiles, image_id):
    tools, image = stages(dockerfiles[image_id])
    assert values(tools, "FROM") == [f"nvidia/cuda:{PLAIN[image_id]}-devel-ubuntu24.04 AS tools"]
    adds = values(tools, "ADD")
    assert adds == [f"{NCCL_TESTS} /src/nccl-tests.tar.gz", f"{NVBANDWIDTH} /src/nvbandwidth.tar.gz"]
    [build] = [shlex.split(run) for run in values(tools, "RUN") if "make -C" in run]
    make = build[build.index("make"):]
    assert {"MPI=0", "CUDA_HOME=/usr/local/cuda"} <= set(make[:make.index("&&")])
    architectures = next(word for word in build if word.startswith("-DCMAKE_CUDA_ARCHITECTURES="))
    assert architectures == "-DCMAKE_CUDA_ARCHITECTURES=70;75;80;86;89;90;100"   # 12.8 builds Blackwell (100)
    [install] = [run for run in values(tools, "RUN") if "apt-get install" in run]
    assert {word.split("=")[0] for word in shlex.split(install) if "=" in word and not word.startswith("-")} >= {
        "cmake", "libboost-program-options-dev"}
    assert "/src/nccl-tests/build/all_reduce_perf" in build and "/src/nvbandwidth/build/nvbandwidth" in build
    # the image takes the programs only: no compiler, header or source of the devel stage
    assert values(image, "COPY")[0] == "--from=tools /opt/gpuprov-tools/bin/ /usr/local/bin/"
    assert not [run for run in values(image, "RUN") if "nccl-tests" in run or "cmake" in run]


@pytest.mark.parametrize("image_id", CUDA_IMAGES)
def test_images_whose_suite_runs_torch_compile_carry_a_c_compiler_and_pythons_headers(dockerfiles, image_id):
    # Triton compiles its CUDA launcher (a C file including Python.h) with the system's cc at the first compile
    [install] = [run for run in values(stages(dockerfiles[image_id])[-1], "RUN") if "apt-get install" in run]
    pinned = dict(word.split("=", 1) for word in shlex.split(install) if re.fullmatch(r"[a-z0-9][a-z0-9+.-]+=\S+",
                                                                                       word))
    assert {"gcc", "python3-dev", "libpython3-dev"} <= set(pinned)
    assert pinned["python3-dev"] == pinned["python3"]


def test_the_training_image_carries_the_rdma_libraries_nccls_ib_transport_opens(dockerfiles):
    [install] = [run for run in values(stages(dockerfiles["cuda-pytorch-train-2.8.0-cu128"])[-1], "RUN")
                 if "apt-get install" in run]
    names = {word.split("=")[0] for word in shlex.split(install)}
    assert {"libibverbs1", "ibverbs-providers", "librdmacm1"} <= names


def test_hadolint_judges_the_multi_stage_dockerfiles_and_sees_a_copy_from_a_missing_stage(dockerfiles, tmp_path):
    for image_id in CUDA_IMAGES:
        assert [str(f) for f in lint(dockerfiles[image_id]) if f.failing] == []
    broken = tmp_path / "Dockerfile"
    broken.write_text(dockerfiles[CUDA_IMAGES[0]].read_text().replace(" AS tools\n", " AS builder\n"))
    assert "DL3022" in {finding.code for finding in lint(broken)}


def test_other_bases_have_no_tools_stage(dockerfiles):
    for image_id, dockerfile in dockerfiles.items():
        if image_id not in CUDA_IMAGES:
            assert len(stages(dockerfile)) == 1, image_id


@pytest.mark.parametrize(("flavor", "base"), [("", "nvidia/cuda:12.8.1-base-ubuntu24.04"),
                                               (", flavor: runtime", "nvidia/cuda:12.8.1-base-ubuntu24.04"),
                                               (", flavor: devel", "nvidia/cuda:12.8.1-devel-ubuntu24.04")])
def test_the_flavor_picks_nvidias_base_or_devel_image(tmp_path, flavor, base):
    path = tmp_path / "t.yaml"
    path.write_text(SPEC.replace("FLAVOR", flavor))
    [image] = load_spec(path)
    assert (image.base.reference, image.base.tools) == (base, "nvidia/cuda:12.8.1-devel-ubuntu24.04")


def test_a_cuda_before_12_8_builds_nvbandwidth_without_blackwell_on_its_ubuntus_build_packages(tmp_path):
    # CUDA 12.8's release notes add Blackwell (sm_100); nvcc of 12.6 refuses it. Ubuntu 22.04's devel stage takes
    # jammy's build packages (nvbandwidth's README: cmake 3.20 or newer; jammy has 3.22).
    path = tmp_path / "t.yaml"
    path.write_text(SPEC.replace('cuda: "12.8.1"', 'cuda: "12.6.3"').replace('ubuntu: "24.04"FLAVOR', 'ubuntu: "22.04"')
                    .replace("3.12.3-0ubuntu2", "3.10.6-1~22.04.1"))
    [image] = load_spec(path)
    dockerfile = render(image, output=tmp_path / "out").folder / "Dockerfile"
    tools = stages(dockerfile)[0]
    assert values(tools, "FROM") == ["nvidia/cuda:12.6.3-devel-ubuntu22.04 AS tools"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=70;75;80;86;89;90" in shlex.split(" ".join(values(tools, "RUN")))
    assert "cmake=3.22.1-1ubuntu1" in " ".join(values(tools, "RUN"))
    assert [str(f) for f in lint(dockerfile) if f.failing] == []


def test_the_wheels_library_folders_reach_the_linker_list_from_the_venvs_own_site_packages(dockerfiles, tmp_path):
    # the code the image runs, from its Dockerfile, run by a real venv's Python whose site-packages holds the
    # folders pip makes for torch's nvidia-* wheels (nvidia/<name>/lib)
    [run] = [run for run in values(stages(dockerfiles["cuda-onnxruntime-infer"])[-1], "RUN") if "ldconfig" in run]
    words = shlex.split(run)
    code = words[words.index("-c") + 1]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site] = list((venv / "lib").glob("python3*/site-packages"))
    for name in ("cudnn", "cublas", "nccl"):
        (site / "nvidia" / name / "lib").mkdir(parents=True)
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True,
                          timeout=60)
    assert done.stdout.splitlines() == [str(site / "nvidia" / name / "lib") for name in ("cublas", "cudnn", "nccl")]
