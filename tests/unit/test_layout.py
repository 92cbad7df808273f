"""The package's layout: the lab is imported by nothing but the lab tasks (and the tests); no module finds its data
by climbing out of the package (an installed wheel has no checkout around it); the user's own image specs and
templates are found from the working directory and take precedence over the shipped ones."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from invoke import Context

import gpuprov.images
from gpuprov.images import specs_folder, templates_folder
from gpuprov.images.blocks import TemplateError
from gpuprov.images.render import render
from gpuprov.images.spec import SpecError, load_specs
from gpuprov.tasks import images as image_tasks
from gpuprov.tasks import monitoring as monitoring_tasks

PROJECT = Path(__file__).resolve().parents[2]
PACKAGE = PROJECT / "gpuprov"
LAB_CODE = ("gpuprov/lab/", "gpuprov/tasks/lab.py")   # what may import the lab (and tests/)
SPEC = """\
name: mine
purpose: train
gpus: [H100-SXM]
base: {ngc: 25.01-py3}
user: {name: gpuprov, uid: 1000}
"""


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def lab_imports(path: Path) -> list[str]:
    """`LINE: module` of every import of gpuprov.lab in a module (import, from-import, importlib by name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module.startswith("gpuprov.lab") else [
                f"{node.module}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            names = [node.args[0].value]
        found += [f"{node.lineno}: {name}" for name in names
                  if name == "gpuprov.lab" or name.startswith("gpuprov.lab.")]
    return found


def test_only_the_lab_tasks_import_the_lab():
    """An AST scan of every module outside the lab (gpuprov/lab/, gpuprov/tasks/lab.py)."""
    scanned, offenders = 0, {}
    for path in modules():
        name = path.relative_to(PROJECT).as_posix()
        if name.startswith(LAB_CODE):
            continue
        scanned += 1
        found = lab_imports(path)
        if found:
            offenders[name] = found
    assert scanned > 150 and offenders == {}


CAPABILITIES = ("provision", "harden", "monitoring", "validation", "images", "rollout")
BELOW_CAPABILITIES = ("core", "facts", "inventory", "stack", "smoke", "catalog")
CORE_MAY_IMPORT = ("core", "facts", "inventory")
# The declared edges between capabilities, each for a reason that is the product's, not the code's convenience.
ALLOWED_EDGES = {
    ("images", "validation"): "images carry and test the validation suite: its layout, wheel set and document",
    ("harden", "monitoring"): "the firewall opens the exporters' ports from the monitoring network",
    ("rollout", "provision"): "a rollout upgrades each drained host with provision",
    ("rollout", "validation"): "a rollout validates each upgraded host before it is resumed, and places its "
                               "textfile as validate does",
}


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, second part of the module name) of every gpuprov import in a module: gpuprov.core.x -> core."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [(node.lineno, name.split(".")[1]) for name in names
                  if name.startswith("gpuprov.") and name.count(".") >= 1]
    return found


def layer_problems() -> list[str]:
    """Imports across the layers of docs/design.md: the core imports no capability (nor the shared domain above
    it), the shared layers import no capability, and a capability imports another only along a declared edge."""
    problems = []
    for path in modules():
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for line, other in imported_packages(path):
            if own == "core" and other not in CORE_MAY_IMPORT:
                problems.append(f"{path.relative_to(PROJECT)}:{line}: the core imports gpuprov.{other}")
            elif other in CAPABILITIES and other != own and (own in BELOW_CAPABILITIES or (
                    own in CAPABILITIES and (own, other) not in ALLOWED_EDGES)):
                problems.append(f"{path.relative_to(PROJECT)}:{line}: {own} imports the capability {other}")
    return problems


def test_the_layers_import_downward_only():
    assert layer_problems() == []


def test_the_inventory_reaches_capabilities_only_for_their_declared_variables():
    """The variable registry imports each capability's variables module (by name) and nothing else of it."""
    from gpuprov.inventory.variables import CAPABILITIES as DECLARING

    assert sorted(DECLARING) == sorted(f"gpuprov.{name}.variables" for name in CAPABILITIES)
    for path in sorted((PACKAGE / "inventory").glob("*.py")):
        for line, other in imported_packages(path):
            assert other not in CAPABILITIES, f"{path.relative_to(PROJECT)}:{line}: imports gpuprov.{other}"


def test_the_layer_scan_sees_a_capability_reaching_into_another(tmp_path, monkeypatch):
    fake = tmp_path / "gpuprov"
    for name, text in {"core/x.py": "from gpuprov.provision.run import ProvisionJob\n",
                       "harden/y.py": "import gpuprov.validation.host\n",
                       "images/z.py": "from gpuprov.validation import LAYOUT\n",
                       "stack/w.py": "from gpuprov.images.tags import repository\n"}.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    monkeypatch.setattr(sys.modules[__name__], "PROJECT", tmp_path)
    assert layer_problems() == ["gpuprov/core/x.py:1: the core imports gpuprov.provision",
                                "gpuprov/harden/y.py:1: harden imports the capability validation",
                                "gpuprov/stack/w.py:1: stack imports the capability images"]


def test_the_scan_finds_each_way_of_importing_the_lab(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import gpuprov.lab\nfrom gpuprov.lab.images import base_tag\nfrom gpuprov import lab\n"
                    "import importlib\nimportlib.import_module('gpuprov.lab.labels')\nimport gpuprov.labels\n")
    assert lab_imports(path) == ["1: gpuprov.lab", "2: gpuprov.lab.images", "3: gpuprov.lab",
                                 "5: gpuprov.lab.labels"]


def test_listing_and_rendering_the_shipped_images_loads_no_lab_module(tmp_path):
    """The lab's own specs included: their base names its tag, nothing asks the lab for it."""
    code = textwrap.dedent(f"""\
        import sys
        from gpuprov.images.render import render
        from gpuprov.images.spec import load_specs
        images = load_specs()
        for image in images:
            if image.base.kind != "local":
                render(image, output={str(tmp_path / "out")!r})
        print(len(images), sorted(name for name in sys.modules if name.startswith("gpuprov.lab")))
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "PYTHONPATH": str(PROJECT)})   # this tree's gpuprov
    assert done.returncode == 0, done.stderr
    count, loaded = done.stdout.split(" ", 1)
    assert int(count) >= 5 and loaded.strip() == "[]"


def test_the_lab_specs_name_the_base_the_lab_builds():
    """Each shipped spec on the lab's base names the tag the lab gives it (its recipe hash): the judge is the lab's
    own base_tag, read here from the YAML, not through the spec reader."""
    from gpuprov.lab.images import base_tag
    from gpuprov.lab.labels import BASE_REPO

    bases = {}
    for path in sorted((PACKAGE / "images" / "specs").glob("*.yaml")):
        base = yaml.safe_load(path.read_text()).get("base") or {}   # a matrix may give it
        if str(base.get("local", "")).startswith(BASE_REPO):
            bases[path.name] = base["local"]
    assert bases == {"lab-pytorch-cpu-infer.yaml": base_tag(), "lab-pytorch-cpu.yaml": base_tag()}, \
        f"write base.local: {base_tag()} in the lab's specs (gpuprov/images/specs/lab-*.yaml)"


def climb(node: ast.AST) -> int | None:
    """How many folders an expression climbs from the module's own file (Path(__file__).parent: 1,
    .parents[2]: 3, os.path.dirname(__file__): 1); None for an expression not built on __file__."""
    if isinstance(node, ast.Name):
        return 0 if node.id == "__file__" else None
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        below = climb(node.value)
        return None if below is None else below + 1
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
        below = climb(node.value.value)
        return None if below is None else below + node.slice.value + 1
    if isinstance(node, ast.Call):
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        if name in ("resolve", "absolute") and isinstance(node.func, ast.Attribute):
            return climb(node.func.value)
        if name in ("Path", "abspath", "realpath") and len(node.args) == 1:
            return climb(node.args[0])
        if name == "dirname" and len(node.args) == 1:
            below = climb(node.args[0])
            return None if below is None else below + 1
    return None


def out_of_package(path: Path) -> list[str]:
    """`LINE: climbs N` of every path built on __file__ that leaves the gpuprov package."""
    rel = path.relative_to(PROJECT) if path.is_relative_to(PROJECT) else Path("gpuprov", path.name)
    allowed = len(rel.parts) - 1           # gpuprov/images/x.py: 2 folders up is gpuprov/
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        levels = climb(node)
        if levels is not None and levels > allowed:
            found.append(f"{node.lineno}: climbs {levels}")
    return found


def test_no_module_finds_its_data_outside_the_package():
    offenders = {path.relative_to(PROJECT).as_posix(): out_of_package(path) for path in modules()}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_climb_scan_sees_a_checkout_lookup(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom pathlib import Path\nA = Path(__file__).resolve().parents[2]\n"
                    "B = Path(__file__).parent.parent\n"
                    "C = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"
                    "D = Path(__file__).resolve().parents[0]\n")
    assert out_of_package(path) == ["3: climbs 3", "4: climbs 2", "5: climbs 2"]   # as gpuprov/m.py: 1 allowed


# ---------------------------------------------------------------------------- the user's specs and templates

def test_the_shipped_specs_and_templates_are_used_without_the_users_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()                       # a folder of something else: not a spec folder
    (tmp_path / "images" / "logo.png").write_bytes(b"\x89PNG")
    (tmp_path / "templates").mkdir()                    # an Ansible project's templates: no Dockerfile.j2
    (tmp_path / "templates" / "motd.j2").write_text("hi\n")
    assert specs_folder() == PACKAGE / "images" / "specs"
    assert templates_folder() == PACKAGE / "images" / "templates"
    shipped = {path.stem for path in (PACKAGE / "images" / "specs").glob("*.yaml")}
    assert {image.name for image in load_specs()} == shipped


def test_the_users_specs_replace_the_shipped_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "mine.yaml").write_text(SPEC)
    image_tasks.list_(Context(), json_=True)
    rows = json.loads(capsys.readouterr().out)
    assert [(row["id"], row["spec"]) for row in rows] == [("mine", "images/mine.yaml")]
    (tmp_path / "images" / "mine.yaml").write_text(SPEC.replace("purpose: train", "purpose: trian"))
    with pytest.raises(SpecError) as info:
        load_specs()
    assert info.value.exit_code == 2 and "images/mine.yaml:2:10: purpose:" in str(info.value)


def test_the_users_templates_replace_the_shipped_ones(tmp_path, monkeypatch):
    shutil.copytree(PACKAGE / "images" / "templates", tmp_path / "templates")
    block = tmp_path / "templates" / "blocks" / "environment.j2"
    block.write_text(block.read_text() + "ENV MINE=1\n")
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "mine.yaml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpuprov.images, "OUTPUT", tmp_path / "out")
    [image] = load_specs()
    rendered = render(image)
    assert rendered.folder == tmp_path / "out" / "mine"
    assert "ENV MINE=1" in rendered.dockerfile.splitlines()
    # the spec is named as the user sees it, relative to the working directory
    assert "# mine: rendered by `invoke images.render` from images/mine.yaml;" in rendered.dockerfile


def test_a_shipped_spec_is_named_the_same_on_every_install(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    [image] = [image for image in load_specs() if image.id == "ngc-pytorch-train-2.4.0a0-cu124"]
    rendered = render(image, output=tmp_path / "out")
    assert "from gpuprov/images/specs/ngc-pytorch-train.yaml;" in rendered.dockerfile


def test_the_dashboard_is_written_under_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monitoring_tasks.dashboard(Context())
    written = tmp_path / "build" / "monitoring" / "gpu-fleet.json"
    assert capsys.readouterr().out == "dashboard: build/monitoring/gpu-fleet.json\n"
    assert written.read_text() == (PACKAGE / "monitoring" / "grafana" / "gpu-fleet.json").read_text()


def test_the_users_templates_cannot_reach_python(tmp_path, monkeypatch):
    """The user's templates are data: Jinja's sandbox refuses a template that climbs to Python's internals (with
    the plain Environment this one runs `id` through os.popen)."""
    shutil.copytree(PACKAGE / "images" / "templates", tmp_path / "templates")
    block = tmp_path / "templates" / "blocks" / "labels.j2"
    block.write_text("{{ ''.__class__.__mro__[1].__subclasses__() | map(attribute='__name__') | join(',') }}\n"
                     "{{ cycler.__init__.__globals__.os.popen('id').read() }}\n")
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "mine.yaml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    [image] = load_specs()
    with pytest.raises(TemplateError) as info:
        render(image, output=tmp_path / "out")
    assert info.value.exit_code == 2
    assert info.value.errors == [f"{Path('templates/blocks/labels.j2')}:1:1: template: refused by Jinja's sandbox: "
                                 "access to attribute '__class__' of 'str' object is unsafe. (rendering mine)"]
    assert not (tmp_path / "out" / "mine").exists()
