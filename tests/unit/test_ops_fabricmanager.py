"""Fabric Manager only on NVSwitch systems, at exactly the driver's version, enabled and running."""

from __future__ import annotations

import shlex

import pytest
from test_ops_base import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.errors import GpuprovError
from gpuprov.ops import fabricmanager


def plan(facts, stack):
    return list(fabricmanager.changes(ctx_for(facts, stack)))


def test_no_nvswitch_no_fabric_manager():
    assert plan(bare_facts(), make_stack(nvswitch=False)) == []


@pytest.mark.parametrize("family,spec", [("debian", "nvidia-fabricmanager-570=570.148.08-1"),
                                         ("rhel", "nvidia-fabric-manager-570.148.08-1")])
def test_bare_nvswitch_host_installs_fm_and_enables_it_for_the_boot(family, spec):
    install, service = plan(bare_facts(family), make_stack(family, nvswitch=True))
    assert shlex.split(install.commands[-1])[-1] == spec
    assert service.commands == ("systemctl enable nvidia-fabricmanager",
                                "if nvidia-smi -L >/dev/null 2>&1; then systemctl start nvidia-fabricmanager; fi")


def test_fm_is_started_when_the_stack_driver_is_loaded():
    stack = make_stack(nvswitch=True)
    facts = provisioned_facts("debian", stack, make_repo())
    facts["services"]["nvidia-fabricmanager"] = {"exists": True, "enabled": True, "active": False}
    [change] = plan(facts, stack)
    assert change.commands == ("systemctl enable --now nvidia-fabricmanager",)


def test_fm_version_must_equal_the_driver_version():
    stack = make_stack(nvswitch=True)
    stack["fabricmanager"]["version"] = "570.133.20"
    with pytest.raises(GpuprovError, match="does not match driver 570.148.08"):
        plan(bare_facts(), stack)


def test_in_state_fm_changes_nothing():
    stack = make_stack(nvswitch=True)
    assert plan(provisioned_facts("debian", stack, make_repo()), stack) == []
