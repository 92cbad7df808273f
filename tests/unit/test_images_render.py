"""Rendering: every image of every shipped spec and matrix entry gives the Dockerfile lines that matter (FROM, the
versions, the labels, the user), read back by an independent Dockerfile parser (dockerfile-parse); the context
holds what the Dockerfile copies; a bad template is an error naming the template, its line and the variable; the
tasks write the contexts, the list and the bake file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from helpers.images import cuda_spec
from invoke import Context
from invoke.exceptions import Exit

import gpuprov.images
from gpuprov.images.blocks import TemplateError
from gpuprov.images.labels import Provenance, build_labels, provenance
from gpuprov.images.render import render
from gpuprov.images.spec import load_spec, load_specs
from gpuprov.images.tags import image_tags
from gpuprov.lab.images import base_tag
from gpuprov.tasks import images as image_tasks

SPEC = cuda_spec()   # a CUDA train image with its Python family pinned

PROJECT = Path(__file__).resolve().parents[2]
# NVIDIA_REQUIRE_CUDA as NVIDIA writes it, copied from NVIDIA's published Dockerfile of nvidia/cuda:12.8.1-base-
# ubuntu24.04 (and the runtime and cudnn tags on it): https://gitlab.com/nvidia/container-images/cuda
# dist/12.8.1/ubuntu2404/base/Dockerfile, the x86_64 stage (GitHub mirror pranavmishra90/nvidia-container-images-cuda
# at 60a1c892). Forward compatibility on branches 470, 535, 550, 560 and 565, each for twelve brands.
REQUIRE_CUDA_12_8 = (
    "cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=grid,driver>=470,driver<471 "
    "brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 "
    "brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 "
    "brand=nvidiartx,driver>=470,driver<471 brand=vapps,driver>=470,driver<471 "
    "brand=vpc,driver>=470,driver<471 brand=vcs,driver>=470,driver<471 brand=vws,driver>=470,driver<471 "
    "brand=cloudgaming,driver>=470,driver<471 brand=unknown,driver>=535,driver<536 "
    "brand=grid,driver>=535,driver<536 brand=tesla,driver>=535,driver<536 "
    "brand=nvidia,driver>=535,driver<536 brand=quadro,driver>=535,driver<536 "
    "brand=quadrortx,driver>=535,driver<536 brand=nvidiartx,driver>=535,driver<536 "
    "brand=vapps,driver>=535,driver<536 brand=vpc,driver>=535,driver<536 brand=vcs,driver>=535,driver<536 "
    "brand=vws,driver>=535,driver<536 brand=cloudgaming,driver>=535,driver<536 "
    "brand=unknown,driver>=550,driver<551 brand=grid,driver>=550,driver<551 "
    "brand=tesla,driver>=550,driver<551 brand=nvidia,driver>=550,driver<551 "
    "brand=quadro,driver>=550,driver<551 brand=quadrortx,driver>=550,driver<551 "
    "brand=nvidiartx,driver>=550,driver<551 brand=vapps,driver>=550,driver<551 "
    "brand=vpc,driver>=550,driver<551 brand=vcs,driver>=550,driver<551 brand=vws,driver>=550,driver<551 "
    "brand=cloudgaming,driver>=550,driver<551 brand=unknown,driver>=560,driver<561 "
    "brand=grid,driver>=560,driver<561 brand=tesla,driver>=560,driver<561 "
    "brand=nvidia,driver>=560,driver<561 brand=quadro,driver>=560,driver<561 "
    "brand=quadrortx,driver>=560,driver<561 brand=nvidiartx,driver>=560,driver<561 "
    "brand=vapps,driver>=560,driver<561 brand=vpc,driver>=560,driver<561 brand=vcs,driver>=560,driver<561 "
    "brand=vws,driver>=560,driver<561 brand=cloudgaming,driver>=560,driver<561 "
    "brand=unknown,driver>=565,driver<566 brand=grid,driver>=565,driver<566 "
    "brand=tesla,driver>=565,driver<566 brand=nvidia,driver>=565,driver<566 "
    "brand=quadro,driver>=565,driver<566 brand=quadrortx,driver>=565,driver<566 "
    "brand=nvidiartx,driver>=565,driver<566 brand=vapps,driver>=565,driver<566 "
    "brand=vpc,driver>=565,driver<566 brand=vcs,driver>=565,driver<566 brand=vws,driver>=565,driver<566 "
    "brand=cloudgaming,driver>=565,driver<566")
# NGC PyTorch images' own contract (their environment, `env` in nvcr.io/nvidia/pytorch:23.10-py3 and 26.03-py3):
# NVIDIA_REQUIRE_CUDA=cuda>=9.0 (their entrypoint checks the driver), NVIDIA_DRIVER_CAPABILITIES=compute,utility,video
NGC_REQUIRE_CUDA = "cuda>=9.0"
CAPABILITIES = "compute,utility,video"
# The healthcheck of cuda-onnxruntime-infer: an ONNX Runtime session's own providers (get_available_providers()
# lists CUDA wherever onnxruntime-gpu is installed)
SESSION_HEALTHCHECK = (
    "import sys, onnx.helper as h, onnxruntime as ort; x, y = (h.make_tensor_value_info(name, 1, [1]) for name in "
    "'xy'); graph = h.make_graph([h.make_node('Identity', ['x'], ['y'])], 'health', [x], [y]); model = "
    "h.make_model(graph, opset_imports=[h.make_opsetid('', 13)], ir_version=8); session = "
    "ort.InferenceSession(model.SerializeToString(), providers=['CUDAExecutionProvider']); "
    "sys.exit('CUDAExecutionProvider' not in session.get_providers())")
OCI = "org.opencontainers.image."


def stack_labels(title, version, description, purpose, pytorch, cuda=None, cudnn=None, nccl=None, min_driver=None):
    labels = {OCI + "title": title, OCI + "version": version, OCI + "description": description,
              "io.gpuprov.purpose": purpose, "io.gpuprov.pytorch": pytorch}
    optional = {"io.gpuprov.cuda": cuda, "io.gpuprov.cudnn": cudnn, "io.gpuprov.nccl": nccl,
                "io.gpuprov.min-driver": min_driver}
    return labels | {key: value for key, value in optional.items() if value}


TRAIN = "PyTorch from download.pytorch.org on nvidia/cuda for multi-GPU training"
NGC = "NGC PyTorch for multi-GPU training, run as a non-root user with gpuprov's smoke suite"
# What each shipped image must be. Versions: a PyTorch CUDA 12 wheel bundles its CUDA runtime, which runs on any driver
# from 525.60.13 (CUDA release notes and "CUDA Compatibility", minor version compatibility of CUDA 12.x); NGC PyTorch
# 24.05 is CUDA 12.4.1, cuDNN 9.1.0.70, NCCL 2.21.5, PyTorch 2.4.0a0+07cecf4168 and 25.01 CUDA 12.8.0 with PyTorch
# 2.6.0a0+ecf3bae40a (NGC release notes); torch 2.8.0 requires nvidia-nccl-cu12==2.27.3. An image on a CUDA base starts
# from NVIDIA's plain nvidia/cuda:X-base image (cuda-cudart and cuda-compat only, dist/X/ubuntu2404/base/Dockerfile):
# torch's nvidia-*-cu12 wheels bring CUDA's libraries and cuDNN.
EXPECTED = {
    "cuda-onnxruntime-infer": (
        "nvidia/cuda:12.8.1-base-ubuntu24.04",
        stack_labels("cuda-onnxruntime-infer", "2.8.0-cu128-infer", "ONNX Runtime GPU on nvidia/cuda for inference "
                     "servers", "infer", "2.8.0+cu128", "12.8.1", "9", "2.27.3", "525.60.13")),
    "cuda-pytorch-train-2.8.0-cu128": (
        "nvidia/cuda:12.8.1-base-ubuntu24.04",
        stack_labels("cuda-pytorch-train", "2.8.0-cu128-train", TRAIN, "train", "2.8.0+cu128", "12.8.1", "9",
                     "2.27.3", "525.60.13")),
    "cuda-pytorch-train-2.8.0-cu129": (
        "nvidia/cuda:12.9.1-base-ubuntu24.04",
        stack_labels("cuda-pytorch-train", "2.8.0-cu129-train", TRAIN, "train", "2.8.0+cu129", "12.9.1", "9",
                     "2.27.3", "525.60.13")),
    "lab-pytorch-cpu": (
        base_tag(),
        stack_labels("lab-pytorch-cpu", "2.13.0-cpu-train", "the lab's PyTorch CPU image for training jobs and the "
                     "smoke suite", "train", "2.13.0+cpu")),
    "lab-pytorch-cpu-infer": (
        base_tag(),
        stack_labels("lab-pytorch-cpu-infer", "2.13.0-cpu-infer", "the lab's ONNX Runtime CPU image for inference "
                     "servers", "infer", "2.13.0+cpu")),
    "ngc-pytorch-train-2.4.0a0-cu124": (
        "nvcr.io/nvidia/pytorch:24.05-py3",
        stack_labels("ngc-pytorch-train", "2.4.0a0-cu124-train", NGC, "train", "2.4.0a0+07cecf4168", "12.4.1",
                     "9.1.0.70", "2.21.5", "550.54.15")),
    "ngc-pytorch-train-2.6.0a0-cu128": (
        "nvcr.io/nvidia/pytorch:25.01-py3",
        stack_labels("ngc-pytorch-train", "2.6.0a0-cu128-train", NGC, "train", "2.6.0a0+ecf3bae40a", "12.8.0",
                     min_driver="570.86.10")),
}
INSTALLS = {
    "cuda-onnxruntime-infer": ["--index-url https://download.pytorch.org/whl/cu128", "torch==2.8.0+cu128",
                               "nvidia-nccl-cu12==2.27.3", "python3=3.12.3-0ubuntu2", "onnxruntime-gpu==1.22.0",
                               "python3-minimal=3.12.3-0ubuntu2", "libpython3-stdlib=3.12.3-0ubuntu2",
                               "python3-dev=3.12.3-0ubuntu2", "gcc=4:13.2.0-7ubuntu1"],
    "cuda-pytorch-train-2.8.0-cu128": ["--index-url https://download.pytorch.org/whl/cu128", "torch==2.8.0+cu128",
                                       "nvidia-nccl-cu12==2.27.3", "python3-venv=3.12.3-0ubuntu2",
                                       "python3-minimal=3.12.3-0ubuntu2", "libpython3-stdlib=3.12.3-0ubuntu2",
                                       "python3-dev=3.12.3-0ubuntu2", "gcc=4:13.2.0-7ubuntu1",
                                       "libibverbs1=50.0-2build2", "ibverbs-providers=50.0-2build2"],
    "cuda-pytorch-train-2.8.0-cu129": ["--index-url https://download.pytorch.org/whl/cu129", "torch==2.8.0+cu129",
                                       "nvidia-nccl-cu12==2.27.3"],
    "lab-pytorch-cpu": ["--no-index", "torch==2.13.0+cpu"],
    "lab-pytorch-cpu-infer": ["--no-index", "torch==2.13.0+cpu"],
    "ngc-pytorch-train-2.4.0a0-cu124": ["PIP_BREAK_SYSTEM_PACKAGES=1 pip install", "nvidia-ml-py==12.570.86"],
    "ngc-pytorch-train-2.6.0a0-cu128": ["PIP_BREAK_SYSTEM_PACKAGES=1 pip install", "nvidia-ml-py==12.570.86"],
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("images")
    return {image.id: render(image, output=out) for image in load_specs()}


def instructions(dockerfile: Path, name: str) -> list[str]:
    return [row["value"] for row in DockerfileParser(str(dockerfile)).structure if row["instruction"] == name]


def test_every_shipped_image_is_expected(rendered):
    assert sorted(rendered) == sorted(EXPECTED)


@pytest.mark.parametrize("image_id", sorted(EXPECTED))
def test_from_versions_labels_and_user(rendered, image_id):
    base, labels = EXPECTED[image_id]
    dockerfile = rendered[image_id].folder / "Dockerfile"
    parsed = DockerfileParser(str(dockerfile))
    assert parsed.baseimage == base
    assert parsed.labels == labels
    assert instructions(dockerfile, "USER") == ["1000:1000"]
    useradd = [run for run in instructions(dockerfile, "RUN") if "useradd" in run]
    assert len(useradd) == 1 and "--uid 1000 --gid 1000 gpuprov" in useradd[0]
    assert (parsed.envs["NVIDIA_VISIBLE_DEVICES"], parsed.envs["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", CAPABILITIES)
    runs = " ".join(instructions(dockerfile, "RUN"))
    assert all(" ".join(item.split()) in " ".join(runs.split()) for item in INSTALLS[image_id])


def test_the_nvidia_contract_as_nvidias_images_write_it(rendered):
    envs = {key: DockerfileParser(str(item.folder / "Dockerfile")).envs for key, item in rendered.items()}
    assert envs["cuda-pytorch-train-2.8.0-cu128"]["NVIDIA_REQUIRE_CUDA"] == REQUIRE_CUDA_12_8
    assert envs["cuda-onnxruntime-infer"]["NVIDIA_REQUIRE_CUDA"] == REQUIRE_CUDA_12_8
    assert envs["ngc-pytorch-train-2.6.0a0-cu128"]["NVIDIA_REQUIRE_CUDA"] == NGC_REQUIRE_CUDA
    assert envs["ngc-pytorch-train-2.4.0a0-cu124"]["NVIDIA_REQUIRE_CUDA"] == NGC_REQUIRE_CUDA
    assert "NVIDIA_REQUIRE_CUDA" not in envs["lab-pytorch-cpu"]      # a CPU image requires no CUDA
    assert envs["cuda-pytorch-train-2.8.0-cu128"]["NCCL_DEBUG"] == "WARN"
    assert envs["cuda-pytorch-train-2.8.0-cu128"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_the_inference_images_expose_a_port_and_a_healthcheck(rendered):
    dockerfile = rendered["cuda-onnxruntime-infer"].folder / "Dockerfile"
    assert instructions(dockerfile, "EXPOSE") == ["8000"]
    [check] = instructions(dockerfile, "HEALTHCHECK")
    options, _, command = check.partition(" CMD ")
    assert options.split() == ["--interval=30s", "--timeout=10s", "--start-period=30s", "--retries=3"]
    assert json.loads(command) == ["python3", "-c", SESSION_HEALTHCHECK]
    assert instructions(rendered["lab-pytorch-cpu"].folder / "Dockerfile", "HEALTHCHECK") == []


def test_the_context_holds_the_smoke_suite_and_its_entry_point(rendered):
    folder = rendered["cuda-pytorch-train-2.8.0-cu128"].folder
    suite = sorted(path.name for path in (PROJECT / "gpuprov" / "smoke").glob("*.py"))
    assert sorted(path.name for path in (folder / "smoke").iterdir()) == suite
    assert all((folder / "smoke" / name).read_bytes() == (PROJECT / "gpuprov/smoke" / name).read_bytes()
               for name in suite)
    assert os.access(folder / "gpuprov-smoke", os.X_OK)
    assert "exec python3 -m smoke" in (folder / "gpuprov-smoke").read_text()
    copies = [copy for copy in instructions(folder / "Dockerfile", "COPY") if not copy.startswith("--from=")]
    assert copies == ["smoke/ /opt/gpuprov/smoke/", "gpuprov-smoke /usr/local/bin/gpuprov-smoke"]
    assert sorted(path.name for path in folder.iterdir()) == ["Dockerfile", "gpuprov-smoke", "smoke"]


def test_the_lab_images_carry_the_wheels_they_install(rendered):
    folder = rendered["lab-pytorch-cpu"].folder
    wheels = sorted(path.name for path in (folder / "wheels").iterdir())
    [install] = [run for run in instructions(folder / "Dockerfile", "RUN") if "--no-index" in run]
    pins = [word for word in install.split() if "==" in word]
    assert pins[0] == "torch==2.13.0+cpu" and [pin.split("==")[0] for pin in pins] == [
        "torch", "numpy", "onnx", "onnxruntime"]
    for pin in pins:
        name, version = pin.split("==")
        assert any(wheel.startswith(f"{name}-{version}-") for wheel in wheels), (pin, wheels)
    pip_wheel = next(word for word in install.split() if word.endswith(".whl/pip")).split("/")[-2]
    assert pip_wheel in wheels and pip_wheel.startswith("pip-")
    assert instructions(folder / "Dockerfile", "COPY")[0] == "wheels/ /tmp/gpuprov-wheels/"


def test_the_record_beside_the_context(rendered):
    item = rendered["lab-pytorch-cpu"]
    record = json.loads((item.folder.parent / "lab-pytorch-cpu.json").read_text())
    assert record["context_hash"] == item.context_hash and record["context"] == str(item.folder)
    assert record["versions"]["pytorch"] == "2.13.0+cpu" and record["labels"]["io.gpuprov.purpose"] == "train"


def test_the_context_hash_follows_the_content_only(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    [image] = load_spec(path)
    first = render(image, output=tmp_path / "a")
    again = render(image, output=tmp_path / "b")
    assert first.context_hash == again.context_hash and first.context_hash.startswith("sha256:")
    (tmp_path / "a" / "t" / "smoke" / "core.py").write_text("changed")
    path.write_text(SPEC + "env: {NCCL_DEBUG: INFO}\n")
    [changed] = load_spec(path)
    assert render(changed, output=tmp_path / "a").context_hash != first.context_hash
    assert render(image, output=tmp_path / "a").context_hash == first.context_hash   # the stale file is gone


def test_a_digest_pins_the_base_and_a_ca_file_is_trusted(tmp_path):
    digest = "sha256:" + "0123456789abcdef" * 4
    ca = tmp_path / "certs" / "corp.pem"
    ca.parent.mkdir()
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace('ubuntu: "24.04"}', f'ubuntu: "24.04", digest: "{digest}"}}') +
                    "ca_file: certs/corp.pem\n")
    [image] = load_spec(path)
    folder = render(image, output=tmp_path / "out").folder
    parsed = DockerfileParser(str(folder / "Dockerfile"))
    assert parsed.baseimage == f"nvidia/cuda:12.8.1-base-ubuntu24.04@{digest}"
    assert (folder / "extra-ca.crt").read_bytes() == ca.read_bytes()
    assert instructions(folder / "Dockerfile", "COPY")[0] == ("extra-ca.crt /usr/local/share/ca-certificates/"
                                                              "gpuprov-extra-ca.crt")
    assert "update-ca-certificates" in instructions(folder / "Dockerfile", "RUN")
    assert parsed.envs["PIP_CERT"] == "/etc/ssl/certs/ca-certificates.crt"


def test_values_reach_the_dockerfile_as_written(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC + textwrap.dedent("""\
        description: 'a "quoted" $HOME ${X} value'
        env: {A: "x y $HOME \\"q\\"", B: "it's $HOME", C: 1.10}
        command: [python3, -c, "print('$HOME \\\\n')"]
        """))
    [image] = load_spec(path)
    folder = render(image, output=tmp_path / "out").folder
    parsed = DockerfileParser(str(folder / "Dockerfile"))
    assert parsed.envs["A"] == 'x y $HOME "q"' and parsed.envs["C"] == "1.10"
    assert parsed.labels[OCI + "description"] == 'a "quoted" $HOME ${X} value'
    # dockerfile-parse keeps the backslash of an escaped `$`; Docker reads "it's \$HOME" as it's $HOME
    assert "B=\"it's \\$HOME\"" in (folder / "Dockerfile").read_text()
    assert json.loads(instructions(folder / "Dockerfile", "CMD")[0]) == ["python3", "-c", "print('$HOME \\n')"]


def test_an_undefined_template_variable_names_the_template_and_the_variable(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(PROJECT / "gpuprov" / "images" / "templates", templates)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    [image] = load_spec(path)
    good = render(image, output=tmp_path / "out", templates=templates)
    block = templates / "blocks" / "environment.j2"
    block.write_text(block.read_text().replace("ENV ", "ENV GPUS={{ nvidia_gpus }} ", 1))
    with pytest.raises(TemplateError) as info:
        render(image, output=tmp_path / "out", templates=templates)
    assert info.value.exit_code == 2
    assert info.value.errors == [f"{block}:2:1: template: undefined variable: 'nvidia_gpus' is undefined "
                                 "(rendering t)"]
    assert (good.folder / "Dockerfile").read_text() == good.dockerfile    # the last good context stays
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["t", "t.json"]
    block.write_text("{% if %}\n")
    with pytest.raises(TemplateError) as info:
        render(image, output=tmp_path / "out", templates=templates)
    assert info.value.errors == [f"{block}:1:1: template: syntax error: Expected an expression, got 'end of "
                                 "statement block'"]


def test_a_bad_template_is_exit_2_from_images_render(tmp_path, monkeypatch, capsys):
    """The user's ./templates/ (a copy of the shipped ones, one block edited) is the one images.render uses."""
    templates = tmp_path / "templates"
    shutil.copytree(PROJECT / "gpuprov" / "images" / "templates", templates)
    (templates / "blocks" / "labels.j2").write_text("LABEL x={{ image.tag }}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path / "out")
    with pytest.raises(Exit) as info:
        image_tasks.render(Context(), name=["cuda-pytorch-train"])
    assert info.value.code == 2
    assert (f"{Path('templates') / 'blocks' / 'labels.j2'}:1:1: template: undefined variable: 'dict object' has no "
            "attribute 'tag' (rendering cuda-pytorch-train-2.8.0-cu128)") in capsys.readouterr().err


def test_images_render_and_list(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path)
    image_tasks.render(Context(), name=["cuda-pytorch-train,ngc-pytorch-train-2.4.0a0-cu124"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        f"{tmp_path}/cuda-pytorch-train-2.8.0-cu128/Dockerfile",
        f"{tmp_path}/cuda-pytorch-train-2.8.0-cu129/Dockerfile",
        f"{tmp_path}/ngc-pytorch-train-2.4.0a0-cu124/Dockerfile"]
    image_tasks.list_(Context(), name=["lab-pytorch-cpu"], json_=True)
    [row] = json.loads(capsys.readouterr().out)
    assert (row["id"], row["tag"], row["base"]) == ("lab-pytorch-cpu", "2.13.0-cpu-train", base_tag())


def _git(*args: str, cwd: Path = PROJECT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.tool
def test_images_bake_writes_targets_with_tags_and_labels(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path)
    image_tasks.bake(Context(), name=["lab-pytorch-cpu"], registry="127.0.0.1:5000/")
    bake = json.loads((tmp_path / "docker-bake.json").read_text())
    assert bake["group"] == {"default": {"targets": ["lab-pytorch-cpu"]}}
    target = bake["target"]["lab-pytorch-cpu"]
    commit = _git("rev-parse", "HEAD")
    revision = commit[:12] + ("-dirty" if _git("status", "--porcelain") else "")
    assert target["tags"] == ["127.0.0.1:5000/lab-pytorch-cpu:2.13.0-cpu-train",
                              f"127.0.0.1:5000/lab-pytorch-cpu:2.13.0-cpu-train-{revision}"]
    record = json.loads((tmp_path / "lab-pytorch-cpu.json").read_text())
    assert target["context"] == str(tmp_path / "lab-pytorch-cpu") and target["dockerfile"] == "Dockerfile"
    assert target["labels"]["io.gpuprov.context-hash"] == record["context_hash"]
    assert target["labels"][OCI + "revision"].startswith(commit)
    assert "docker buildx bake -f" in capsys.readouterr().out
    with pytest.raises(Exit) as info:
        image_tasks.bake(Context(), registry="http://bad registry")
    assert info.value.code == 2


@pytest.mark.tool
def test_provenance_of_a_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2024-01-02T03:04:05+02:00")
    monkeypatch.setenv("GIT_AUTHOR_DATE", "2024-01-02T03:04:05+02:00")
    _git("init", "-q", cwd=tmp_path)
    (tmp_path / "f").write_text("1")
    _git("add", "f", cwd=tmp_path)
    _git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "c", cwd=tmp_path)
    _git("remote", "add", "origin", "https://user:secret@git.example.com/team/gpuprov.git", cwd=tmp_path)
    commit = _git("rev-parse", "HEAD", cwd=tmp_path)
    assert provenance(tmp_path) == Provenance(commit, "2024-01-02T01:04:05Z", "https://git.example.com/team/gpuprov.git")
    (tmp_path / "f").write_text("2")
    assert provenance(tmp_path).revision == commit + "-dirty"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert provenance(tmp_path).created == "1970-01-01T00:00:00Z"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert provenance(tmp_path / "not-a-checkout") == Provenance(None, None, None)
    assert build_labels("sha256:1", Provenance(None, None, None)) == {"io.gpuprov.context-hash": "sha256:1"}


def test_tags_name_the_registry_the_version_and_the_revision(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    [image] = load_spec(path)
    assert image_tags(image) == ["t:2.8.0-cu128-train"]
    assert image_tags(image, "registry.example.com/team", "0123456789abcdef0123-dirty") == [
        "registry.example.com/team/t:2.8.0-cu128-train",
        "registry.example.com/team/t:2.8.0-cu128-train-0123456789ab-dirty"]
