"""Images: a matrix of NVIDIA PyTorch images from specs (`*.yaml`) and Jinja templates (`Dockerfile.j2`, `blocks/`).

gpuprov ships its own specs and templates inside the package (gpuprov/images/specs/, gpuprov/images/templates/).
The user's own are found from the working directory, the folder `invoke` or `gpuprov` runs in (beside its
invoke.yaml), and take precedence as a whole: `./images/` when it holds a `*.yaml` replaces the shipped specs,
`./templates/` when it holds `Dockerfile.j2` replaces the shipped templates. What images.* writes goes under the
working directory too: build/images/ (contexts, records) and build/wheelhouse/ (the local bases' wheels).

The modules, one job each:
    model     what one image (one matrix entry of a spec) is: base, versions, packages, user, environment
    fields    the checks of a spec's plain fields (name, apt and pip pins, user, env, ports, healthcheck...)
    versions  the versions that belong together, from the resolver's data and rules (gpuprov.stack)
    matrix    a spec's `matrix:` expanded into entries
    spec      reading specs with the inventory's located YAML: every problem as FILE:LINE:COL: key: message
    blocks    the Jinja environment (StrictUndefined) and what the block templates see
    render    build/images/<id>/: the Dockerfile and its context (smoke suite, CA file, the lab's wheels)
    labels    OCI and io.gpuprov.* labels, the context hash that --changed-only compares
    tags      `<registry>/<name>:<pytorch>-<cuXY|cpu>-<purpose>` and the git revision tag
    lint      hadolint on rendered Dockerfiles, its JSON findings
    bake      docker-bake.json for buildx users
    build     one rendered context built on the engine, step by step (a failed step and its output tail)
    engine    the engine's API on its Unix socket for builds: the context sent by sendfile, no SDK imported
    verify    torch's versions and the labels read back from a built image and compared with its spec
    container a command in a container of a built image on the controller's engine
    suite     images.test: the smoke suite inside a built image
    push      pushes through the SDK (registry login from GPUPROV_REGISTRY_USER/_PASSWORD), the digests pushed
    run       images.run on a host: the driver check, docker pull, docker run with a PyTorch job's flags
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SHIPPED_SPECS = PACKAGE / "specs"
SHIPPED_TEMPLATES = PACKAGE / "templates"
USER_SPECS = Path("images")           # these four are relative to the working directory
USER_TEMPLATES = Path("templates")
OUTPUT = Path("build") / "images"
WHEELHOUSE = Path("build") / "wheelhouse"


def specs_folder() -> Path:
    """The user's `./images/` when it holds a spec (`*.yaml`), else the specs gpuprov ships."""
    return USER_SPECS if any(USER_SPECS.glob("*.yaml")) else SHIPPED_SPECS


def templates_folder() -> Path:
    """The user's `./templates/` when it holds `Dockerfile.j2`, else the templates gpuprov ships."""
    return USER_TEMPLATES if (USER_TEMPLATES / "Dockerfile.j2").is_file() else SHIPPED_TEMPLATES
