"""Kernel headers/dkms for the running kernel and the headers metapackage of its series; nouveau blacklist with
initramfs rebuild."""

from __future__ import annotations

import shlex

import pytest
from helpers.ops import KERNEL, bare_facts, ctx_for, make_repo, make_stack, provisioned_facts

from gpuprov.core.errors import GpuprovError
from gpuprov.provision.ops import kernel


def plan(facts):
    return list(kernel.changes(ctx_for(facts)))


def test_debian_bare_host_gets_headers_of_the_running_kernel_and_a_nouveau_blacklist():
    headers, blacklist = plan(bare_facts())
    words = shlex.split(headers.commands[-1])
    assert words[-4:] == ["--no-install-recommends", f"linux-headers-{KERNEL['debian']}", "linux-headers-amd64",
                          "dkms"]
    assert "$(" not in headers.commands[-1] and not headers.reboot
    assert blacklist.reboot
    assert "+blacklist nouveau\n+options nouveau modeset=0\n" in blacklist.diff
    assert ("&& { if command -v update-initramfs >/dev/null; then update-initramfs -u; fi || "
            "{ rm -f /etc/modprobe.d/gpuprov-blacklist-nouveau.conf; false; }; }") in blacklist.commands[0]


def test_rhel_uses_kernel_devel_matched_and_dracut():
    """NVIDIA Driver Installation Guide (EL9): `dnf install kernel-devel-matched kernel-headers`."""
    headers, blacklist = plan(bare_facts("rhel"))
    assert shlex.split(headers.commands[-1])[-4:] == [f"kernel-devel-{KERNEL['rhel']}", "kernel-devel-matched",
                                                      "kernel-headers", "dkms"]
    assert "dracut -f" in blacklist.commands[0]


@pytest.mark.parametrize("os_id,version_id,release,installed,meta", [
    ("debian", "12", "6.1.0-18-amd64", {}, "linux-headers-amd64"),
    ("debian", "12", "6.1.0-18-cloud-amd64", {}, "linux-headers-cloud-amd64"),
    ("debian", "12", "6.1.0-18-arm64", {}, "linux-headers-arm64"),
    ("debian", "12", "6.1.0-18-rt-amd64", {}, "linux-headers-rt-amd64"),
    ("ubuntu", "22.04", "5.15.0-105-generic", {"linux-image-generic": "5.15.0.105.102"}, "linux-headers-generic"),
    ("ubuntu", "22.04", "6.8.0-45-generic", {"linux-image-generic-hwe-22.04": "6.8.0-45.45~22.04.1"},
     "linux-headers-generic-hwe-22.04"),
    ("ubuntu", "24.04", "6.8.0-1015-aws", {}, "linux-headers-aws"),
    ("ubuntu", "24.04", "6.8.0-1012-nvidia", {}, "linux-headers-nvidia"),
    ("ubuntu", "24.04", "6.8.0-1014-gcp", {}, "linux-headers-gcp"),
    ("ubuntu", "24.04", "6.8.0-1017-azure", {}, "linux-headers-azure"),
    ("ubuntu", "22.04", "6.5.0-1024-oem", {"linux-image-oem-22.04d": "6.5.0.1024.26"}, "linux-headers-oem-22.04d"),
    ("ubuntu", "22.04", "6.5.0-1024-oem", {}, None),
    ("debian", "12", "6.10.6+bpo-amd64", {}, None),
])
def test_headers_metapackage_follows_the_kernel_series(os_id, version_id, release, installed, meta):
    assert kernel.headers_meta(os_id, version_id, release, installed) == meta


def test_ubuntu_host_with_headers_but_without_the_metapackage_gets_only_the_metapackage():
    facts = provisioned_facts("debian", make_stack(), make_repo())
    facts["os"].update(id="ubuntu", version_id="22.04")
    facts["kernel"] = "6.8.0-45-generic"
    facts["packages"]["linux-image-generic-hwe-22.04"] = "6.8.0-45.45~22.04.1"
    [headers] = plan(facts)
    assert shlex.split(headers.commands[-1])[-1] == "linux-headers-generic-hwe-22.04"
    assert "next kernel" in headers.summary


def test_changed_blacklist_is_restored_when_the_rebuild_fails():
    facts = provisioned_facts("debian", make_stack(), make_repo())
    facts["files"][kernel.NOUVEAU_BLACKLIST] = "blacklist nouveau\n"
    [change] = plan(facts)
    assert "|| { mkdir -p /etc/modprobe.d && (umask 077 && printf %s 'blacklist nouveau\n'" in change.commands[0]


def test_in_state_kernel_changes_nothing():
    assert plan(provisioned_facts("debian", make_stack(), make_repo())) == []


def test_unparseable_kernel_release_fails_clearly():
    facts = bare_facts()
    facts["kernel"] = "6.1;reboot"
    with pytest.raises(GpuprovError, match="running kernel") as info:
        plan(facts)
    assert info.value.step == "kernel"
