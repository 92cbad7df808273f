"""Lab engine and image pieces that need no engine: refusal messages, content-addressed tags."""

from __future__ import annotations

import pytest

from gpuprov.errors import GpuprovError
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
