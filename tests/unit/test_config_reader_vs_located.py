"""Why gpuprov.core.config keeps its own YAML reading rather than gpuprov.inventory.located's: it must judge an
invoke.yaml as Invoke itself will read it (Invoke's vendored pure-Python PyYAML, keys built as YAML types), and
located reads with libyaml, keys as text, unknown tags kept. Invoke's own loading is the outside judge."""

from __future__ import annotations

from pathlib import Path

from invoke import Config

from gpuprov.core.config import file_errors
from gpuprov.inventory.located import Located, compose, decode


def invoke_reads(folder: Path) -> bool:
    config = Config(project_location=str(folder))
    try:
        config.load_project()
    except Exception:  # noqa: BLE001 - whatever Invoke's loader raises is "cannot read"
        return False
    return True


def located_reads(text: str, path: Path) -> bool:
    doc = Located(path)
    node = compose(decode(text.encode()))
    if node is not None:
        doc.construct(node)
    return not doc.problems()


def test_config_refuses_what_invoke_cannot_read_and_located_would_take(tmp_path):
    text = "gpuprov:\n  reports: r\t\n"   # a tab after a plain value: libyaml takes it, Invoke's PyYAML does not
    path = tmp_path / "invoke.yaml"
    path.write_text(text)
    assert not invoke_reads(tmp_path)
    assert file_errors(path) and file_errors(path)[0].startswith(f"{path}:2:")
    assert located_reads(text, path)


def test_a_key_invoke_builds_as_a_boolean_is_named(tmp_path):
    path = tmp_path / "invoke.yaml"
    path.write_text("yes: 1\n")
    assert invoke_reads(tmp_path)   # read, as a section named True
    assert file_errors(path) == [f"{path}:1:1: true: a section's name must be text"]
    assert located_reads("yes: 1\n", path)   # located: the key "yes", nothing to say
