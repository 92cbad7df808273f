"""The Jinja environment of the templates (StrictUndefined: a missing variable is an error naming the template
and the variable, never an empty string) and the variables the block templates see.

Values are written into the Dockerfile through filters: `quoted` (an ENV or LABEL value in single quotes, where
nothing expands; in double quotes with `"` and `$` escaped when it holds a single quote), `sh` (one shell word for
RUN) and `json` (an exec-form list for CMD and HEALTHCHECK). Spec values reach here checked: no control
characters and no backslashes (Docker and Dockerfile tools such as hadolint read a backslash in a quoted value
differently), names and versions matched.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import traceback
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from gpuprov.core.errors import InputError, literal
from gpuprov.images import PACKAGE
from gpuprov.images.labels import image_labels
from gpuprov.images.model import Image
from gpuprov.images.versions import driver_capabilities, require_cuda
from gpuprov.inventory.diagnostics import problem_line
from gpuprov.stack.data import minor_of, table, vkey
from gpuprov.validation import LAYOUT
from gpuprov.validation.suite_config import TORCH_INDEX

DOCKERFILE = "Dockerfile.j2"
WORKDIR = "/workspace"
SMOKE_ENTRY = "/usr/local/bin/gpuprov-smoke"
WHEELS_IN_BUILD = "/tmp/gpuprov-wheels"
TOOLS_STAGE = "tools"
TOOLS_BUILT = "/opt/gpuprov-tools/bin"     # in the tools stage
TOOLS_BIN = "/usr/local/bin"                # in the image: on PATH, where the suite looks for them
WHEEL_LIBRARIES = "/etc/ld.so.conf.d/gpuprov-nvidia-wheels.conf"
ARCHIVE = "{source}/archive/{commit}.tar.gz"   # GitHub's archive of one commit
# The NVIDIA container contract: every GPU the runtime is given (what the job needs of the driver and which
# drivers fit come from NVIDIA's own images, gpuprov/data/*.yaml image_contract).
NVIDIA_VISIBLE_DEVICES = "all"


@dataclass(frozen=True)
class ContextFiles:
    """What render put into the context besides the Dockerfile, as the templates name it."""

    smoke: str = "smoke/"
    script: str = "gpuprov-smoke"
    ca_file: str | None = None
    wheels: str | None = None                 # the wheel folder (local bases)
    pip_wheel: str | None = None              # pip's own wheel in it
    requirements: tuple[str, ...] = ()        # pinned to the wheels' versions


class TemplateError(InputError):
    """A template that cannot be rendered: where (template, line) and why."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors), step="images.render",
                         hint="fix the template it names, then run: invoke images.render")


def environment(templates: Path) -> jinja2.Environment:
    """Jinja's sandbox: the templates may be the user's own (./templates/), data that reaches no Python object's
    internals."""
    env = SandboxedEnvironment(loader=jinja2.FileSystemLoader(str(templates)), undefined=jinja2.StrictUndefined,
                               autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(quoted=quoted, sh=shlex.quote, json=lambda value: json.dumps(list(value)))
    return env


def render_dockerfile(image: Image, files: ContextFiles, templates: Path) -> str:
    """The Dockerfile text; TemplateError naming the template, its line and the problem."""
    env = environment(templates)
    try:
        return env.get_template(DOCKERFILE).render(variables(image, files))
    except jinja2.TemplateSyntaxError as exc:
        where = Path(exc.filename or templates / (exc.name or DOCKERFILE))
        raise TemplateError([problem_line(where, exc.lineno or 1, 1, "template", f"syntax error: {exc.message}")]) \
            from None
    except jinja2.TemplateNotFound as exc:
        raise TemplateError([problem_line(templates / DOCKERFILE, 1, 1, "template",
                                          f"template {exc.name!r} not found in {literal(str(templates))}")]) from None
    except jinja2.UndefinedError as exc:
        where, line = _template_frame(exc, templates)
        raise TemplateError([problem_line(where, line, 1, "template",
                                          f"undefined variable: {exc.message} (rendering {image.id})")]) from None
    except SecurityError as exc:
        where, line = _template_frame(exc, templates)
        raise TemplateError([problem_line(where, line, 1, "template",
                                          f"refused by Jinja's sandbox: {exc} (rendering {image.id})")]) from None


def _template_frame(exc: BaseException, templates: Path) -> tuple[Path, int]:
    """The innermost template file and line in the traceback (Jinja maps its frames to template lines)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.endswith(".j2"):
            return Path(frame.filename), frame.lineno or 1
    return templates / DOCKERFILE, 1


def quoted(value: object) -> str:
    """One ENV or LABEL value, read by Docker as written (no variable expands in it)."""
    text = str(value)
    if "'" not in text:
        return f"'{text}'"
    return '"' + text.replace('"', '\\"').replace("$", "\\$") + '"'


def variables(image: Image, files: ContextFiles) -> dict:
    """Everything the templates see."""
    versions = image.versions
    return {
        "image": {"id": image.id, "name": image.name, "spec": _shown_path(image.file)},
        "base": {"kind": image.base.kind, "reference": image.base.reference, "digest": image.base.digest},
        "versions": dataclasses.asdict(versions),
        "ca_file": files.ca_file,
        "apt": [{"name": name, "version": version} for name, version in image.apt],
        "pytorch": _pytorch(image, files),
        "tools": _tools(image),
        "pip": _pip(image),
        "user": dataclasses.asdict(image.user),
        "workdir": WORKDIR,
        "environment": [{"name": name, "value": value} for name, value in _environment(image)],
        "labels": [{"name": name, "value": value} for name, value in image_labels(image).items()],
        "smoke": {"context": files.smoke, "folder": LAYOUT.smoke, "script": files.script, "entry": SMOKE_ENTRY},
        "ports": list(image.ports),
        "healthcheck": dataclasses.asdict(image.healthcheck) if image.healthcheck else None,
        "command": list(image.command) if image.command else None,
    }


def _pytorch(image: Image, files: ContextFiles) -> dict:
    versions = image.versions
    if image.base.kind == "cuda":
        nccl = f"nvidia-nccl-cu{versions.cuda.split('.')[0]}=={versions.nccl}"
        return {"install": "index", "venv": LAYOUT.venv, "index": TORCH_INDEX.format(wheel=versions.wheel),
                "requirements": [f"torch=={versions.pytorch}", nccl], "libraries": WHEEL_LIBRARIES}
    if image.base.kind == "local":
        return {"install": "wheels", "venv": LAYOUT.venv, "context": files.wheels, "wheels": WHEELS_IN_BUILD,
                "pip_wheel": files.pip_wheel, "requirements": list(files.requirements)}
    return {"install": "base"}


def _tools(image: Image) -> dict | None:
    """The tools stage of an image on a CUDA base (gpuprov/data/cuda.yaml image_tools): nccl-tests (with its -J
    JSON output) and nvbandwidth built at their tags' commits in NVIDIA's devel image, with the devel stage's
    pinned build packages; None for other bases."""
    if image.base.kind != "cuda" or not image.base.tools:
        return None
    data = table("cuda")["image_tools"]
    cuda = minor_of(image.versions.cuda)
    architectures = data["nvbandwidth"]["cuda_architectures"]
    floor = max((key for key in architectures if vkey(key) <= vkey(cuda)), key=vkey)
    sources = {name: {"tag": data[name]["tag"], "commit": data[name]["commit"],
                      "archive": ARCHIVE.format(source=data[name]["source"], commit=data[name]["commit"])}
               for name in ("nccl_tests", "nvbandwidth")}
    return {"image": image.base.tools, "stage": TOOLS_STAGE, "built": TOOLS_BUILT, "bin": TOOLS_BIN,
            "apt": [{"name": name, "version": version} for name, version in data["apt"][image.base.ubuntu].items()],
            "nccl_tests": {**sources["nccl_tests"], "binaries": list(data["nccl_tests"]["binaries"])},
            "nvbandwidth": {**sources["nvbandwidth"], "architectures": architectures[floor]}}


def _pip(image: Image) -> dict:
    """Extra pip packages: into the venv (cuda bases), or the NGC image's system Python, which may carry
    Debian's externally-managed marker."""
    command = f"{LAYOUT.venv}/bin/pip" if image.base.kind == "cuda" else "PIP_BREAK_SYSTEM_PACKAGES=1 pip"
    return {"command": command, "packages": [{"name": name, "version": version} for name, version in image.pip]}


def _environment(image: Image) -> list[tuple[str, str]]:
    """The NVIDIA contract as NVIDIA's images write it (NVIDIA_REQUIRE_CUDA only for an image with CUDA), then the
    spec's settings."""
    contract = [("NVIDIA_VISIBLE_DEVICES", NVIDIA_VISIBLE_DEVICES),
                ("NVIDIA_DRIVER_CAPABILITIES", driver_capabilities())]
    required = require_cuda(image.base.kind, image.versions.cuda)
    if required:
        contract.append(("NVIDIA_REQUIRE_CUDA", required))
    return contract + list(image.env)


def _shown_path(path: Path) -> str:
    """A shipped spec as gpuprov/images/specs/NAME (the same on every install), the user's relative to the working
    directory."""
    path = Path(path).resolve()
    root = PACKAGE.parents[1] if path.is_relative_to(PACKAGE) else Path.cwd().resolve()   # gpuprov's parent
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else literal(str(path))
