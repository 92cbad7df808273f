"""inotify limits for N systemd hosts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.core.errors import GpuprovError
from gpuprov.lab import inotify


def test_default_limits_are_raised_for_32_hosts():
    assert inotify.inotify_targets(32, 128, 8192) == (64 * 32 + 128, 8192 * 32 + 65536)


def test_high_limits_are_kept():
    assert inotify.inotify_targets(3, 100000, 10**7) == (100000, 10**7)


@given(st.integers(1, 500), st.integers(1, 10**6), st.integers(1, 10**8))
def test_targets_never_lower_and_grow_with_hosts(hosts, instances, watches):
    want_i, want_w = inotify.inotify_targets(hosts, instances, watches)
    assert want_i >= instances and want_w >= watches
    assert want_i >= 64 * hosts and want_w >= 8192 * hosts


def _proc(tmp_path, instances, watches):
    (tmp_path / "max_user_instances").write_text(f"{instances}\n")
    (tmp_path / "max_user_watches").write_text(f"{watches}\n")
    return tmp_path


def test_root_raises_the_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(inotify.os, "geteuid", lambda: 0)
    proc = _proc(tmp_path, 128, 8192)
    lines = []
    inotify.ensure_inotify(32, lines.append, proc=proc)
    assert (proc / "max_user_instances").read_text().strip() == str(64 * 32 + 128)
    assert lines and "128 ->" in lines[0]


def test_non_root_is_refused_with_the_exact_command(tmp_path, monkeypatch):
    monkeypatch.setattr(inotify.os, "geteuid", lambda: 1000)
    proc = _proc(tmp_path, 128, 8192)
    with pytest.raises(GpuprovError) as err:
        inotify.ensure_inotify(32, proc=proc)
    assert err.value.hint == ("run: sudo sysctl -w fs.inotify.max_user_instances=2176 "
                              "fs.inotify.max_user_watches=327680")
    assert (proc / "max_user_instances").read_text().strip() == "128"


def test_enough_already_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(inotify.os, "geteuid", lambda: 1000)
    proc = _proc(tmp_path, 10**5, 10**7)
    inotify.ensure_inotify(32, proc=proc)
