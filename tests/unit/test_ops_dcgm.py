"""DCGM packages and service; nvidia-persistenced enabled."""

from __future__ import annotations

import shlex

from helpers.ops import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.ops import dcgm


def plan(facts, stack=None):
    return list(dcgm.changes(ctx_for(facts, stack or make_stack(facts["os"]["family"]))))


def test_bare_host_installs_dcgm_with_epoch_and_enables_both_services():
    install, dcgm_service, persistenced = plan(bare_facts())
    assert shlex.split(install.commands[-1])[-2:] == ["datacenter-gpu-manager-4-core=1:4.2.3-1",
                                                      "datacenter-gpu-manager-4-cuda12=1:4.2.3-1"]
    started = "if nvidia-smi -L >/dev/null 2>&1; then systemctl start {}; fi"
    assert dcgm_service.commands == ("systemctl enable nvidia-dcgm", started.format("nvidia-dcgm"))
    assert persistenced.commands == ("systemctl enable nvidia-persistenced", started.format("nvidia-persistenced"))


def test_stopped_services_are_started_when_the_driver_is_loaded():
    facts = provisioned_facts("rhel", make_stack("rhel"), make_repo())
    facts["services"]["nvidia-persistenced"] = {"exists": True, "enabled": False, "active": False}
    [change] = plan(facts)
    assert change.commands == ("systemctl enable --now nvidia-persistenced",)


def test_in_state_dcgm_changes_nothing():
    assert plan(provisioned_facts("debian", make_stack(), make_repo())) == []
