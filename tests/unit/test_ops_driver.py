"""The driver: exact packages, branch and flavor replacement, holds lifted first, reboot flagged."""

from __future__ import annotations

import shlex

import pytest
from helpers.ops import bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.core.errors import InputError
from gpuprov.core.packages import for_family
from gpuprov.provision.ops import driver, pins


def plan(facts, stack=None):
    return list(driver.changes(ctx_for(facts, stack or make_stack(facts["os"]["family"]))))


def test_bare_debian_host_installs_the_open_driver_at_the_exact_version():
    [change] = plan(bare_facts())
    assert change.reboot
    assert "install nvidia-open-570=570.148.08-1ubuntu1 (installed: none)" in change.summary
    words = shlex.split(change.commands[-1])
    assert words[-3:] == ["--no-install-recommends", "--allow-downgrades", "nvidia-open-570=570.148.08-1ubuntu1"]
    assert "DPkg::Lock::Timeout=300" in words and "DEBIAN_FRONTEND=noninteractive" in words


def test_lock_timeout_comes_from_the_context():
    [change] = list(driver.changes(ctx_for(bare_facts(), lock_timeout=900)))
    assert "DPkg::Lock::Timeout=900" in change.commands[-1]


def test_branch_change_unholds_then_replaces_the_old_branch_in_one_transaction():
    facts = bare_facts()
    facts["packages"] = {"cuda-drivers-535": "535.230.02-1", "libnvidia-compute-535": "535.230.02-1",
                         "nvidia-kernel-common-535": "535.230.02-1", "nvidia-container-toolkit": "1.17.8-1",
                         "libnvidia-container1": "1.17.8-1"}
    facts["held"] = ["cuda-drivers-535", "libnvidia-compute-535", "nvidia-container-toolkit"]
    [change] = plan(facts)
    prefs, update, unhold, install = change.commands
    assert pins.APT_PREFERENCES in prefs and update == for_family("debian").update()
    assert shlex.split(unhold)[-3:] == ["unhold", "cuda-drivers-535", "libnvidia-compute-535"]
    assert shlex.split(install)[-4:] == ["nvidia-open-570=570.148.08-1ubuntu1", "cuda-drivers-535-",
                                         "libnvidia-compute-535-", "nvidia-kernel-common-535-"]
    assert "libnvidia-container1" not in install and "remove cuda-drivers-535 535.230.02-1" in change.summary


def test_flavor_switch_to_open_drops_proprietary_kernel_modules_only():
    facts = bare_facts()
    facts["packages"] = {"cuda-drivers-570": "570.148.08-1", "nvidia-kernel-dkms": "570.148.08-1",
                         "nvidia-kernel-common-570": "570.148.08-1", "libnvidia-compute-570": "570.148.08-1"}
    [change] = plan(facts)
    words = shlex.split(change.commands[-1])
    assert "cuda-drivers-570-" in words and "nvidia-kernel-dkms-" in words
    assert not any(w.startswith(("nvidia-kernel-common", "libnvidia-compute")) for w in words)


def test_upgrade_within_the_branch_writes_the_new_pins_and_unholds_the_whole_installed_driver_first():
    """Held at 570.133.20 (and pinned to it), the driver's packages could not move to 570.148.08."""
    stack = make_stack(nvswitch=True)
    facts = provisioned_facts("debian", make_stack(version="570.133.20", nvswitch=True), make_repo())
    [change] = plan(facts, stack)
    assert "(installed: 570.133.20-1ubuntu1)" in change.summary and pins.APT_PREFERENCES in change.summary
    prefs, _, unhold, install = change.commands
    assert "Pin: version 570.148.08-*" in prefs and "-Pin: version 570.133.20-*\n" in change.diff
    assert shlex.split(unhold)[-5:] == ["unhold", "libnvidia-compute-570", "nvidia-kernel-common-570",
                                        "nvidia-open-570", "xserver-xorg-video-nvidia-570"]
    assert shlex.split(install)[-1] == "nvidia-open-570=570.148.08-1ubuntu1"


def test_nvidia_version_pinning_package_is_installed_in_its_own_transaction_before_the_driver():
    """DIG-590: from R590 the branch is locked by nvidia-driver-pinning-<branch>, installed before the driver."""
    stack = make_stack(branch="590", version="590.48.01")
    stack["driver"]["packages"] = [{"name": "nvidia-driver-pinning-590", "version": "590.48.01-1"},
                                   {"name": "nvidia-open", "version": "590.48.01-1ubuntu1"}]
    [change] = plan(bare_facts(), stack)
    _, _, pinning, rest = change.commands
    assert shlex.split(pinning)[-1] == "nvidia-driver-pinning-590=590.48.01-1"
    assert shlex.split(rest)[-1] == "nvidia-open=590.48.01-1ubuntu1" and "pinning" not in rest


def test_rhel_unlocks_every_locked_package_of_the_installed_driver():
    stack = make_stack("rhel")
    facts = provisioned_facts("rhel", make_stack("rhel", version="570.133.20"), make_repo())
    [change] = plan(facts, stack)
    assert len(change.commands) == 3 and pins.APT_PREFERENCES not in change.commands[0]
    assert shlex.split(change.commands[1]) == [
        "dnf", "-y", "versionlock", "delete", "kmod-nvidia-open-dkms", "nvidia-driver", "nvidia-driver-cuda-libs",
        "nvidia-kmod-common", "xorg-x11-nvidia"]


def test_rhel_unlocks_removes_and_installs_exact_nevrs():
    stack = make_stack("rhel")
    facts = bare_facts("rhel")
    facts["packages"] = {"nvidia-driver": "3:565.57.01-1.el9", "kmod-nvidia-latest-dkms": "3:565.57.01-1.el9"}
    facts["files"]["/etc/dnf/plugins/versionlock.list"] = "nvidia-driver-3:565.57.01-1.el9.*\n"
    [change] = plan(facts, stack)
    assert [shlex.split(c) for c in change.commands[1:]] == [
        ["dnf", "-y", "versionlock", "delete", "nvidia-driver"],
        ["dnf", "-y", "remove", "kmod-nvidia-latest-dkms"],
        ["dnf", "-y", "--setopt=install_weak_deps=False", "install", "--allowerasing",
         "nvidia-driver-570.148.08-1.el9", "kmod-nvidia-open-dkms-570.148.08-1.el9"]]


def test_in_state_driver_changes_nothing_even_with_an_epoch_on_rhel():
    assert plan(provisioned_facts("debian", make_stack(), make_repo())) == []
    facts = provisioned_facts("rhel", make_stack("rhel"), make_repo())
    facts["packages"]["nvidia-driver"] = "3:570.148.08-1.el9"
    assert plan(facts, make_stack("rhel")) == []


@pytest.mark.parametrize("name,branch,flavor", [
    ("libnvidia-compute-570", "570", None), ("nvidia-dkms-570-server-open", "570", "open"),
    ("nvidia-kernel-dkms", None, "proprietary"), ("nvidia-kernel-common-570", "570", None),
    ("kmod-nvidia-latest-dkms", None, "proprietary"), ("nvidia-kmod-common", None, None),
    ("nvidia-driver-570", "570", "proprietary"), ("nvidia-driver", None, None),
    ("linux-modules-nvidia-570-server-6.8.0-45-generic", "570", "proprietary"),
])
def test_branch_and_flavor_of_package_names(name, branch, flavor):
    assert driver.branch_of(name) == branch and driver.flavor_of(name) == flavor


def test_injected_version_in_the_stack_is_rejected():
    stack = make_stack()
    stack["driver"]["packages"][0]["version"] = "1;reboot"
    with pytest.raises(InputError, match="not a valid package"):
        plan(bare_facts(), stack)


def test_unversioned_driver_package_of_another_branch_is_replaced():
    """From R590 the driver is `nvidia-open` with no branch in its name: going back to 580 removes it."""
    from gpuprov.provision.ops.driver import stale_packages, version_branch

    facts = bare_facts()
    facts["packages"] = {"nvidia-open": "595.58.03-1", "nvidia-driver-pinning-595": "595.58.03-1",
                         "nvidia-container-toolkit": "1.20.0-1"}
    ctx = ctx_for(facts, make_stack(branch="580", version="580.173.02"))
    assert stale_packages(ctx) == ("nvidia-driver-pinning-595", "nvidia-open")
    assert version_branch("1:595.58.03-1") == "595" and version_branch("1.20.0-1") is None
