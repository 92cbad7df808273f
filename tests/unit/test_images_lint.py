"""hadolint (from PyPI) is the outside judge of every rendered Dockerfile: no finding at error or warning level,
and a rule is ignored only by a justified `# hadolint ignore=` comment in a block template. The wrapper reads
hadolint's JSON findings with their line, rule and the block the line came from; `images.lint` fails on them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

import gpuprov.images
from gpuprov.images.lint import Finding, lint
from gpuprov.images.render import render
from gpuprov.images.spec import load_specs
from gpuprov.tasks import images as image_tasks

PROJECT = Path(__file__).resolve().parents[2]
IGNORE = re.compile(r"#\s*hadolint\s+ignore=")


@pytest.fixture(scope="module")
def dockerfiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("images")
    return {image.id: render(image, output=out).folder / "Dockerfile" for image in load_specs()}


def test_hadolint_finds_nothing_to_fail_in_any_rendered_dockerfile(dockerfiles):
    assert len(dockerfiles) == 7
    failing = {image_id: [str(f) for f in lint(path) if f.failing] for image_id, path in dockerfiles.items()}
    assert failing == {image_id: [] for image_id in dockerfiles}


def test_every_hadolint_ignore_in_the_blocks_is_justified():
    """An ignore comment names its rules, and the comment line above it says why."""
    for block in sorted((PROJECT / "gpuprov" / "images" / "templates").rglob("*.j2")):
        lines = block.read_text().splitlines()
        for number, line in enumerate(lines):
            if IGNORE.search(line):
                assert re.fullmatch(r"# hadolint ignore=DL[0-9]{4}(,DL[0-9]{4})*", line.strip()), (block, line)
                above = lines[number - 1].strip() if number else ""
                assert above.startswith("#") and len(above) > 20 and not IGNORE.search(above), (block, number + 1)


def test_findings_name_the_line_the_rule_and_the_block(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("# block: base (cuda)\nFROM ubuntu\n\n# block: apt\nRUN apt-get update && apt-get install -y "
                          "curl\nUSER root\n")
    findings = lint(dockerfile)
    by_code = {finding.code: finding for finding in findings}
    assert by_code["DL3006"] == Finding(dockerfile, 2, "DL3006", "warning", "Always tag the version of an image "
                                        "explicitly", "base")
    assert (by_code["DL3008"].line, by_code["DL3008"].level, by_code["DL3008"].block) == (5, "warning", "apt")
    assert by_code["DL3002"].failing and by_code["DL3002"].line == 6
    assert str(by_code["DL3015"]).startswith(f"{dockerfile}:5: DL3015 info: Avoid additional packages")
    assert not by_code["DL3015"].failing


def test_images_lint_passes_on_the_shipped_specs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path)
    image_tasks.lint(Context(), name=["cuda-pytorch-train", "ngc-pytorch-train"])
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "hadolint: 4 Dockerfiles, 0 findings, 0 at error or warning level")


def test_images_lint_fails_on_a_block_hadolint_refuses(tmp_path, monkeypatch, capsys):
    templates = tmp_path / "templates"
    shutil.copytree(PROJECT / "gpuprov" / "images" / "templates", templates)
    block = templates / "blocks" / "apt.j2"
    block.write_text(block.read_text().replace("--no-install-recommends \\\n", "--no-install-recommends curl \\\n"))
    monkeypatch.chdir(tmp_path)                     # the user's ./templates/ replace the shipped ones
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path / "out")
    with pytest.raises(Exit) as info:
        image_tasks.lint(Context(), name=["cuda-onnxruntime-infer"])
    assert info.value.code == 1
    out = capsys.readouterr()
    dockerfile = (tmp_path / "out" / "cuda-onnxruntime-infer" / "Dockerfile").read_text().splitlines()
    line = dockerfile.index("    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl \\")
    assert dockerfile[line - 1] == "RUN apt-get update \\"     # hadolint names the line the RUN starts on
    assert (f"{tmp_path}/out/cuda-onnxruntime-infer/Dockerfile:{line}: DL3008 warning: Pin versions in apt get "
            "install. Instead of `apt-get install <package>` use `apt-get install <package>=<version>` "
            "(block apt)") in out.out
    assert "hadolint found 1 problems at error or warning level" in out.err
