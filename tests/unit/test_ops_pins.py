"""Pins and holds: apt preferences + apt-mark hold + unattended-upgrades blacklist; dnf versionlock."""

from __future__ import annotations

import shlex

from test_ops_base import all_packages, bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.ops import pins
from gpuprov.ops.base import VERSIONLOCK_LIST


def plan(facts, stack=None):
    return list(pins.changes(ctx_for(facts, stack or make_stack(facts["os"]["family"]))))


def test_debian_bare_host_gets_exact_pins_holds_and_an_unattended_blacklist():
    stack = make_stack(nvswitch=True)
    prefs, unattended, hold = plan(bare_facts(), stack)
    assert prefs.summary.startswith(f"create {pins.APT_PREFERENCES}")
    assert ("+Package: nvidia-open-570\n+Pin: version 570.148.08-1ubuntu1\n+Pin-Priority: 1001\n"
            in prefs.diff)
    assert "+Package: datacenter-gpu-manager-4-core\n+Pin: version 1:4.2.3-1\n" in prefs.diff
    for entry in ('"nvidia-";', '"libnvidia-";', '"cuda-";', '"libnccl";', '"datacenter-gpu-manager";'):
        assert entry in unattended.diff
    assert "Unattended-Upgrade::Package-Blacklist {" in unattended.diff
    words = shlex.split(hold.commands[-1])
    assert words[words.index("hold") + 1:] == sorted(all_packages(stack))


def test_already_held_packages_are_not_held_again_but_moved_ones_are():
    stack = make_stack()
    facts = provisioned_facts("debian", stack, make_repo())
    assert plan(facts, stack) == []
    facts["packages"]["libnccl2"] = "2.21.5-1+cuda12.4"   # held, but the nccl op unholds it to upgrade
    [hold] = plan(facts, stack)
    assert shlex.split(hold.commands[-1])[-2:] == ["hold", "libnccl2"]


def test_rhel_installs_the_versionlock_plugin_then_locks_exact_versions():
    stack = make_stack("rhel")
    [lock] = plan(bare_facts("rhel"), stack)
    assert shlex.split(lock.commands[0])[-1] == "python3-dnf-plugin-versionlock"
    words = shlex.split(lock.commands[-1])
    assert words[:4] == ["dnf", "-y", "versionlock", "add"]
    assert "nvidia-driver-570.148.08-1.el9" in words and "libnccl-2.26.5-1+cuda12.9" in words


def test_rhel_lock_at_another_version_is_replaced():
    stack = make_stack("rhel")
    facts = provisioned_facts("rhel", stack, make_repo())
    assert plan(facts, stack) == []
    facts["files"][VERSIONLOCK_LIST] = facts["files"][VERSIONLOCK_LIST].replace(
        "libnccl-0:2.26.5-1+cuda12.9.*", "libnccl-0:2.21.5-1+cuda12.4.*")
    [lock] = plan(facts, stack)
    assert [shlex.split(c) for c in lock.commands] == [
        ["dnf", "-y", "versionlock", "delete", "libnccl"],
        ["dnf", "-y", "versionlock", "add", "libnccl-2.26.5-1+cuda12.9"]]
