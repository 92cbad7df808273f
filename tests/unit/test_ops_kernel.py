"""Kernel headers/dkms for the running kernel; nouveau blacklist with initramfs rebuild."""

from __future__ import annotations

import shlex

import pytest
from test_ops_base import KERNEL, bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.errors import GpuprovError
from gpuprov.ops import kernel


def plan(facts):
    return list(kernel.changes(ctx_for(facts)))


def test_debian_bare_host_gets_headers_of_the_running_kernel_and_a_nouveau_blacklist():
    headers, blacklist = plan(bare_facts())
    words = shlex.split(headers.commands[-1])
    assert words[-3:] == ["--no-install-recommends", f"linux-headers-{KERNEL['debian']}", "dkms"]
    assert "$(" not in headers.commands[-1] and not headers.reboot
    assert blacklist.reboot
    assert "+blacklist nouveau\n+options nouveau modeset=0\n" in blacklist.diff
    assert ("&& { if command -v update-initramfs >/dev/null; then update-initramfs -u; fi || "
            "{ rm -f /etc/modprobe.d/gpuprov-blacklist-nouveau.conf; false; }; }") in blacklist.commands[0]


def test_rhel_uses_kernel_devel_and_dracut():
    headers, blacklist = plan(bare_facts("rhel"))
    assert shlex.split(headers.commands[-1])[-3:] == [f"kernel-devel-{KERNEL['rhel']}", "kernel-headers", "dkms"]
    assert "dracut -f" in blacklist.commands[0]


def test_changed_blacklist_is_restored_when_the_rebuild_fails():
    facts = provisioned_facts("debian", make_stack(), make_repo())
    facts["files"][kernel.NOUVEAU_BLACKLIST] = "blacklist nouveau\n"
    [change] = plan(facts)
    assert "|| { mkdir -p /etc/modprobe.d && printf %s 'blacklist nouveau\n'" in change.commands[0]


def test_in_state_kernel_changes_nothing():
    assert plan(provisioned_facts("debian", make_stack(), make_repo())) == []


def test_unparseable_kernel_release_fails_clearly():
    facts = bare_facts()
    facts["kernel"] = "6.1;reboot"
    with pytest.raises(GpuprovError, match="running kernel") as info:
        plan(facts)
    assert info.value.step == "kernel"
