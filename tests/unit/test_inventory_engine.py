"""The `container_engine` host variable: `docker` is accepted at every level; anything else is a located error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuprov.core.errors import InputError
from gpuprov.inventory import InventoryError, load_inventory

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def only_error(path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert isinstance(info.value, InputError) and info.value.exit_code == 2
    [error] = info.value.errors
    return error


def test_docker_is_accepted_and_merges_like_any_variable(tmp_path):
    path = write(tmp_path, """\
        defaults:
          vars: {container_engine: docker}
        groups:
          bare: {}
        hosts:
          a: {address: 10.0.0.1, groups: [bare]}
          b: {address: 10.0.0.2, vars: {site: x}}
        """)
    inventory = load_inventory(path)
    assert inventory.host("a").vars["container_engine"] == "docker"
    assert inventory.host("a").sources["container_engine"] == "defaults"
    assert inventory.host("b").var("container_engine") == "docker"


def test_a_host_without_it_has_no_engine(tmp_path):
    inventory = load_inventory(write(tmp_path, "hosts:\n  h1: {address: 10.0.0.1}\n"))
    assert "container_engine" not in inventory.host("h1").vars


@pytest.mark.parametrize("value, words", [
    ("podman", ("bad container_engine 'podman'", "give docker")),
    ("Docker", ("bad container_engine 'Docker'", "did you mean 'docker'?")),
    ("dokcer", ("did you mean 'docker'?",)),
    ("[docker]", ("bad container_engine ['docker']",)),
    ("true", ("bad container_engine True",)),
    ("''", ("bad container_engine ''",)),
])
def test_other_values_are_refused_with_file_line_and_key(tmp_path, value, words):
    path = write(tmp_path, f"hosts:\n  h1:\n    address: 10.0.0.1\n    vars:\n      container_engine: {value}\n")
    error = only_error(path)
    assert error.startswith(f"{path}:5:"), error
    assert ": hosts.h1.vars.container_engine: " in error, error
    for word in words:
        assert word in error, error


def test_group_level_error_names_the_group(tmp_path):
    path = write(tmp_path, """\
        groups:
          hgx:
            vars:
              container_engine: containerd
        hosts:
          h1: {address: 10.0.0.1, groups: [hgx]}
        """)
    error = only_error(path)
    assert error.startswith(f"{path}:4:") and ": groups.hgx.vars.container_engine: " in error, error


def test_ansible_inventory_vars_are_validated_too(tmp_path):
    path = write(tmp_path, """\
        all:
          hosts:
            gpu1:
              ansible_host: 10.0.0.7
              container_engine: docker
            gpu2:
              ansible_host: 10.0.0.8
              container_engine: rkt
        """)
    error = only_error(path)
    assert error.startswith(f"{path}:8:") and "bad container_engine 'rkt'" in error, error


def test_the_example_inventory_documents_it():
    text = (REPO / "inventories" / "example.yaml").read_text()
    assert "container_engine: docker" in text
    inventory = load_inventory(REPO / "inventories" / "example.yaml")
    assert any(host.vars.get("container_engine") == "docker" for host in inventory.hosts.values())
