"""Lab engine and image pieces that need no engine: refusal messages, content-addressed tags."""

from __future__ import annotations

import pytest

from gpuprov.core.errors import GpuprovError
from gpuprov.lab import engine, images


def test_no_engine_and_not_root_on_debian_is_refused_with_what_to_run(monkeypatch):
    monkeypatch.setattr(engine, "_client", lambda: None)
    monkeypatch.setattr(engine, "_is_debian", lambda: True)
    monkeypatch.setattr(engine.os, "geteuid", lambda: 1000)
    started = []
    monkeypatch.setattr(engine, "_start_dockerd", started.append)
    with pytest.raises(GpuprovError) as err:
        engine.ensure_engine(lambda line: None)
    assert err.value.exit_code == 1 and err.value.step == "lab engine"
    assert "apt-get install -y docker.io debootstrap" in err.value.hint and "dockerd" in err.value.hint
    assert started == []


def test_no_engine_on_another_os_is_refused_even_as_root(monkeypatch):
    monkeypatch.setattr(engine, "_client", lambda: None)
    monkeypatch.setattr(engine, "_is_debian", lambda: False)
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(engine, "install_tools", lambda progress: pytest.fail("must not install"))
    with pytest.raises(GpuprovError, match="not Debian as root"):
        engine.ensure_engine(lambda line: None)


def test_a_running_engine_is_used_as_it_is(monkeypatch):
    sentinel = object()
    monkeypatch.setattr(engine, "_client", lambda: sentinel)
    monkeypatch.setattr(engine, "install_tools", lambda progress: pytest.fail("must not install"))
    assert engine.ensure_engine(lambda line: None) is sentinel


def test_host_tag_follows_the_content():
    base = images.base_tag()
    one = images.host_tag(images.host_context(base, "ssh-ed25519 AAAAone lab"))
    assert one == images.host_tag(images.host_context(base, "ssh-ed25519 AAAAone lab"))
    assert one != images.host_tag(images.host_context(base, "ssh-ed25519 AAAAtwo lab"))
    assert one != images.host_tag(images.host_context(base + "x", "ssh-ed25519 AAAAone lab"))
    assert one.startswith("gpuprov-lab/host:")


def test_host_context_holds_the_dockerfile_and_the_lspci_stand_in():
    context = images.host_context("gpuprov-lab/debian12-base:abc", "ssh-ed25519 AAAA lab")
    dockerfile = context["Dockerfile"].decode()
    assert dockerfile.splitlines()[1] == "FROM gpuprov-lab/debian12-base:abc"
    assert "STOPSIGNAL SIGRTMIN+3" in dockerfile and 'CMD ["/sbin/init"]' in dockerfile
    assert context["lspci"].startswith(b"#!/usr/bin/python3\n")
    assert context["authorized_keys"] == b"ssh-ed25519 AAAA lab\n"


def test_the_container_of_a_host_name_or_container(monkeypatch):
    import sys
    from types import SimpleNamespace

    from gpuprov.lab.state import LabHost

    asked = []
    client = SimpleNamespace(containers=SimpleNamespace(get=lambda ident: asked.append(ident) or f"container {ident}"))
    monkeypatch.setitem(sys.modules, "docker", SimpleNamespace(from_env=lambda: client))
    container = SimpleNamespace(exec_run=lambda argv: None)
    assert engine.container_of(container) is container and asked == []
    assert engine.container_of("gpuprov-lab-h100") == "container gpuprov-lab-h100"
    host = LabHost("gpu01", "h100", 2222, None, "c0ffee", {})
    assert engine.container_of(host) == "container c0ffee"  # its container id, not its name
    assert asked == ["gpuprov-lab-h100", "c0ffee"]


def test_a_lab_container_is_found_by_name_and_label(monkeypatch):
    import sys
    from types import SimpleNamespace

    class NotFound(Exception):
        pass

    monkeypatch.setitem(sys.modules, "docker", SimpleNamespace(errors=SimpleNamespace(NotFound=NotFound)))
    monkeypatch.setitem(sys.modules, "docker.errors", SimpleNamespace(NotFound=NotFound))
    lab = SimpleNamespace(labels={"gpuprov.lab": "1"})
    stranger = SimpleNamespace(labels={"com.example": "x"})
    found = {"gpuprov-lab-mirror": lab, "gpuprov-lab-registry": stranger}

    def get(name):
        if name not in found:
            raise NotFound(name)
        return found[name]

    client = SimpleNamespace(containers=SimpleNamespace(get=get))
    assert engine.find_lab_container(client, "gpuprov-lab-mirror", "lab mirror") is lab
    assert engine.find_lab_container(client, "gpuprov-lab-gone", "lab mirror") is None
    with pytest.raises(GpuprovError) as err:
        engine.find_lab_container(client, "gpuprov-lab-registry", "lab registry")
    assert str(err.value).startswith("lab registry: a container named gpuprov-lab-registry exists but is not the lab's")
    assert err.value.step == "lab registry" and "docker rm -f gpuprov-lab-registry" in err.value.hint
