"""Fabric Manager only on NVSwitch systems, at exactly the driver's version, enabled and running; NSCQ with it,
and the NVLink Subnet Manager on fourth-generation NVSwitch systems (HGX B200/B300)."""

from __future__ import annotations

import shlex

import pytest
from helpers.ops import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.errors import GpuprovError
from gpuprov.ops import fabricmanager


def plan(facts, stack):
    return list(fabricmanager.changes(ctx_for(facts, stack)))


def test_no_nvswitch_no_fabric_manager():
    assert plan(bare_facts(), make_stack(nvswitch=False)) == []


@pytest.mark.parametrize("family,specs", [
    ("debian", ["nvidia-fabricmanager-570=570.148.08-1", "libnvidia-nscq-570=570.148.08-1"]),
    ("rhel", ["nvidia-fabric-manager-570.148.08-1", "libnvidia-nscq-570-570.148.08-1"])])
def test_bare_nvswitch_host_installs_fm_and_nscq_and_enables_fm_for_the_boot(family, specs):
    install, service = plan(bare_facts(family), make_stack(family, nvswitch=True))
    assert shlex.split(install.commands[-1])[-2:] == specs
    assert service.commands == ("systemctl enable nvidia-fabricmanager",
                                "if nvidia-smi -L >/dev/null 2>&1; then systemctl start nvidia-fabricmanager; fi")


def test_fourth_generation_nvswitch_host_also_gets_the_nvlink_subnet_manager_and_no_service_of_its_own():
    install, service = plan(bare_facts(), make_stack(nvswitch=True, fourth_gen=True))
    assert shlex.split(install.commands[-1])[-3:] == [
        "nvidia-fabricmanager-570=570.148.08-1", "libnvidia-nscq-570=570.148.08-1", "nvlsm=2025.10.11-1"]
    assert "nvlsm" not in " ".join(service.commands)


def test_missing_nvlsm_alone_is_installed():
    stack = make_stack(nvswitch=True, fourth_gen=True)
    facts = provisioned_facts("debian", stack, make_repo())
    del facts["packages"]["nvlsm"]
    facts["held"].remove("nvlsm")
    [install] = plan(facts, stack)
    assert len(install.commands) == 2 and shlex.split(install.commands[-1])[-1] == "nvlsm=2025.10.11-1"


def test_fm_is_started_when_the_stack_driver_is_loaded():
    stack = make_stack(nvswitch=True)
    facts = provisioned_facts("debian", stack, make_repo())
    facts["services"]["nvidia-fabricmanager"] = {"exists": True, "enabled": True, "active": False}
    [change] = plan(facts, stack)
    assert change.commands == ("systemctl enable --now nvidia-fabricmanager",)


@pytest.mark.parametrize("section", ["fabricmanager", "nscq"])
def test_fm_and_nscq_versions_must_equal_the_driver_version(section):
    stack = make_stack(nvswitch=True)
    stack[section]["version"] = "570.133.20"
    with pytest.raises(GpuprovError, match="570.133.20 does not match driver 570.148.08"):
        plan(bare_facts(), stack)


def test_in_state_fm_changes_nothing():
    for stack in (make_stack(nvswitch=True), make_stack(nvswitch=True, fourth_gen=True)):
        assert plan(provisioned_facts("debian", stack, make_repo()), stack) == []
