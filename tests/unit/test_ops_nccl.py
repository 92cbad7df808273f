"""NCCL runtime and dev packages at the exact version."""

from __future__ import annotations

import shlex

from helpers.ops import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.provision.ops import nccl


def test_apt_and_dnf_install_runtime_and_dev_at_the_exact_version():
    [deb] = nccl.changes(ctx_for(bare_facts()))
    assert shlex.split(deb.commands[-1])[-2:] == ["libnccl2=2.26.5-1+cuda12.9", "libnccl-dev=2.26.5-1+cuda12.9"]
    [rpm] = nccl.changes(ctx_for(bare_facts("rhel")))
    assert shlex.split(rpm.commands[-1])[-2:] == ["libnccl-2.26.5-1+cuda12.9", "libnccl-devel-2.26.5-1+cuda12.9"]


def test_only_the_package_off_version_is_reinstalled():
    stack = make_stack()
    facts = provisioned_facts("debian", stack, make_repo())
    facts["packages"]["libnccl-dev"] = "2.27.3-1+cuda12.9"
    [change] = nccl.changes(ctx_for(facts, stack))
    assert shlex.split(change.commands[-1])[-1] == "libnccl-dev=2.26.5-1+cuda12.9"
    assert "installed: 2.27.3-1+cuda12.9" in change.summary


def test_in_state_nccl_changes_nothing():
    stack = make_stack()
    assert list(nccl.changes(ctx_for(provisioned_facts("debian", stack, make_repo()), stack))) == []
