"""CUDA toolkit at the exact version; forward-compat package only when the stack asks for it."""

from __future__ import annotations

import shlex

import pytest
from test_ops_base import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.errors import GpuprovError
from gpuprov.ops import cuda


def plan(facts, stack):
    return list(cuda.changes(ctx_for(facts, stack)))


@pytest.mark.parametrize("family,spec", [("debian", "cuda-toolkit-12-8=12.8.1-1"),
                                         ("rhel", "cuda-toolkit-12-8-12.8.1-1")])
def test_bare_host_installs_the_toolkit(family, spec):
    [change] = plan(bare_facts(family), make_stack(family))
    assert shlex.split(change.commands[-1])[-1] == spec and not change.reboot


def test_forward_compat_installs_the_compat_package():
    [change] = plan(bare_facts(), make_stack(forward_compat=True))
    assert "cuda-compat-12-8=570.124.06-1ubuntu1" in shlex.split(change.commands[-1])


def test_forward_compat_without_a_compat_package_in_the_stack_fails():
    stack = make_stack(forward_compat=True)
    stack["cuda"]["packages"] = stack["cuda"]["packages"][:1]
    with pytest.raises(GpuprovError, match="lists no cuda-compat-12-8"):
        plan(bare_facts(), stack)


def test_compat_libraries_not_wanted_any_more_are_removed():
    stack = make_stack()
    facts = provisioned_facts("debian", stack, make_repo())
    facts["packages"]["cuda-compat-12-4"] = "550.54.15-1"
    [change] = plan(facts, stack)
    assert shlex.split(change.commands[-1])[-1] == "cuda-compat-12-4-"


def test_in_state_cuda_changes_nothing():
    stack = make_stack(forward_compat=True)
    assert plan(provisioned_facts("debian", stack, make_repo()), stack) == []
