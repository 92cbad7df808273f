"""Pins and holds: apt preferences (driver by version, exact versions, NVIDIA's repository by label), the whole
driver held on the host, an unattended-upgrades blacklist; dnf versionlock with epochs. Released holds."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from helpers.ops import bare_facts, ctx_for, make_repo, make_stack, pkgs, provisioned_facts

from gpuprov.core.errors import InputError
from gpuprov.core.packages import VERSIONLOCK_LIST, for_family
from gpuprov.provision.ops import driver, pins

# Written from apt_preferences(5) and NVIDIA's cuda-<distro>.pin (`Package: *` / `Pin: release l=NVIDIA CUDA` /
# `Pin-Priority: 600`).
DRIVER_STANZA = ("Package: nvidia-* libnvidia-* cuda-drivers* libcuda* libxnvctrl* xserver-xorg-video-nvidia* "
                 "kmod-nvidia* xorg-x11-nvidia*\nPin: version 570.148.08-*\nPin-Priority: 1001\n")
REPO_STANZA = "Package: *\nPin: release l=NVIDIA CUDA\nPin-Priority: 600\n"


def plan(facts, stack=None, repo=None):
    return list(pins.changes(ctx_for(facts, stack or make_stack(facts["os"]["family"]), repo)))


def in_state(family="debian", stack=None):
    stack = stack or make_stack(family)
    return provisioned_facts(family, stack, make_repo()), stack


def test_debian_preferences_pin_the_driver_by_version_the_stack_exactly_and_the_repository_by_label():
    facts, stack = in_state()
    facts["files"][pins.APT_PREFERENCES] = None
    [prefs] = plan(facts, stack)
    content = "".join(line[1:] for line in prefs.diff.splitlines(keepends=True)[2:] if line.startswith("+"))
    assert content.startswith("# Managed by gpuprov")
    stanzas = content.split("\n\n")[1:]
    assert stanzas[0] + "\n" == DRIVER_STANZA
    assert "Package: nvidia-open-570\nPin: version 570.148.08-1ubuntu1\nPin-Priority: 1001" in stanzas
    assert "Package: datacenter-gpu-manager-4-core\nPin: version 1:4.2.3-1\nPin-Priority: 1001" in stanzas
    assert stanzas[-1] == REPO_STANZA


def test_the_label_comes_from_the_repository_spec():
    facts, stack = in_state()
    [prefs] = plan(facts, stack, make_repo(label="gpuprov-lab"))
    assert "+Pin: release l=gpuprov-lab\n" in prefs.diff and "-Pin: release l=NVIDIA CUDA\n" in prefs.diff
    [prefs] = plan(facts, stack, make_repo(label=None))
    assert "-Package: *\n" in prefs.diff and "+Package: *\n" not in prefs.diff


@pytest.mark.parametrize("label", ["NVIDIA CUDA\nPackage: *", "a,o=Debian", ""])
def test_a_label_that_would_change_the_pin_is_refused(label):
    facts, stack = in_state()
    with pytest.raises(InputError, match="cannot be pinned") as info:
        plan(facts, stack, make_repo(label=label))
    assert info.value.step == "pins"


def test_bare_debian_host_blacklists_and_holds_while_the_driver_change_writes_the_pins_first():
    stack = make_stack(nvswitch=True)
    facts = bare_facts()
    unattended, hold = plan(facts, stack)
    for entry in ('"nvidia-";', '"libnvidia-";', '"cuda-";', '"libnccl";', '"datacenter-gpu-manager";', '"nvlsm";'):
        assert entry in unattended.diff
    assert "Unattended-Upgrade::Package-Blacklist {" in unattended.diff
    assert "nvidia-open-570" in hold.summary and "every installed package of the NVIDIA driver" in hold.summary
    [change] = list(driver.changes(ctx_for(facts, stack)))
    assert change.commands[0].startswith("mkdir -p /etc/apt/preferences.d && (umask 077 && printf %s ")
    assert f"+{DRIVER_STANZA.splitlines()[0]}\n" in change.diff


def _stub(tmp_path, name, script):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def run_hold(tmp_path, command, listing, family="debian", versionlock=""):
    """Run a hold command against a stand-in dpkg-query / rpm printing `listing`; the hold tool's arguments."""
    log = tmp_path / "log"
    if family == "debian":
        _stub(tmp_path, "dpkg-query", f"cat <<'EOF'\n{listing}EOF\n")
        _stub(tmp_path, "apt-mark", f'echo "$@" >> {log}\n')
    else:
        _stub(tmp_path, "rpm", f"cat <<'EOF'\n{listing}EOF\n")
        _stub(tmp_path, "dnf", f'echo "$@" >> {log}\n')
        (tmp_path / "versionlock.list").write_text(versionlock)
        command = command.replace(VERSIONLOCK_LIST, str(tmp_path / "versionlock.list"))
    subprocess.run(["sh", "-ec", command], check=True, cwd=tmp_path,
                   env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


# `dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n'` lines; the driver packages are what a real
# `nvidia-open-570` install pulled (see gpuprov/lab/standins.py DRIVER_PARTS) plus the EGL libraries it brings.
DPKG = """ii  nvidia-open-570
ii  libnvidia-compute-570
ii  libnvidia-compute-570:i386
hi  nvidia-kernel-common-570
ii  nvidia-firmware-570-570.148.08
ii  xserver-xorg-video-nvidia-570
ii  libxnvctrl0
ii  libnvidia-egl-wayland1
rc  nvidia-utils-570
ii  nvidia-container-toolkit
ii  libnccl2
ii  cuda-toolkit-12-8
ii  bash
"""


def test_debian_hold_takes_every_installed_package_of_the_driver_on_the_host(tmp_path):
    facts, stack = in_state()
    facts["held"].remove("libnvidia-compute-570")
    [hold] = plan(facts, stack)
    assert "not held now: libnvidia-compute-570" in hold.summary
    [call] = run_hold(tmp_path, hold.commands[-1], DPKG)
    assert call[call.index("hold") + 1:] == [
        "cuda-toolkit-12-8", "libnccl2", "libnvidia-compute-570", "libnvidia-compute-570:i386",
        "libnvidia-egl-wayland1", "libxnvctrl0", "nvidia-container-toolkit", "nvidia-firmware-570-570.148.08",
        "nvidia-kernel-common-570", "nvidia-open-570", "xserver-xorg-video-nvidia-570"]


def test_in_state_pins_change_nothing_and_a_moved_package_is_held_again():
    for family in ("debian", "rhel"):
        facts, stack = in_state(family)
        assert plan(facts, stack) == []
        facts["packages"]["libnccl2" if family == "debian" else "libnccl"] = "2.21.5-1+cuda12.4"
        [hold] = plan(facts, stack)
        assert "not held now: libnccl" in hold.summary


RPM = """nvidia-driver 3:570.148.08-1.el9
nvidia-driver-cuda-libs 3:570.148.08-1.el9
nvidia-driver-cuda-libs 3:570.148.08-1.el9
kmod-nvidia-open-dkms 3:570.148.08-1.el9
xorg-x11-nvidia 3:570.148.08-1.el9
libnccl (none):2.26.5-1+cuda12.9
nvidia-container-toolkit (none):1.17.8-1
libnvidia-egl-wayland 1:1.1.13.1-1.el9
bash (none):5.1.8-9.el9
"""


def test_rhel_bare_host_installs_the_versionlock_plugin_then_locks_with_epochs_on_the_host(tmp_path):
    stack = make_stack("rhel")
    [lock] = plan(bare_facts("rhel"), stack)
    assert shlex.split(lock.commands[0])[-1] == "python3-dnf-plugin-versionlock"
    calls = run_hold(tmp_path, lock.commands[-1], RPM, "rhel")
    assert calls == [["-y", "versionlock", "add", "nvidia-driver-3:570.148.08-1.el9.*",
                      "nvidia-driver-cuda-libs-3:570.148.08-1.el9.*", "kmod-nvidia-open-dkms-3:570.148.08-1.el9.*",
                      "xorg-x11-nvidia-3:570.148.08-1.el9.*", "libnccl-0:2.26.5-1+cuda12.9.*",
                      "nvidia-container-toolkit-0:1.17.8-1.*", "libnvidia-egl-wayland-1:1.1.13.1-1.el9.*"]]


def test_rhel_entries_at_another_version_are_replaced(tmp_path):
    facts, stack = in_state("rhel")
    facts["files"][VERSIONLOCK_LIST] = facts["files"][VERSIONLOCK_LIST].replace(
        "libnccl-0:2.26.5-1+cuda12.9.*", "libnccl-0:2.21.5-1+cuda12.4.*")
    [lock] = plan(facts, stack)
    assert "not held now: libnccl" in lock.summary and len(lock.commands) == 1
    calls = run_hold(tmp_path, lock.commands[0], RPM, "rhel", facts["files"][VERSIONLOCK_LIST])
    assert calls[0][:3] == ["-y", "versionlock", "delete"]
    assert "libnccl" in calls[0] and "nvidia-driver" in calls[0] and "bash" not in calls[0]
    assert calls[1][:3] == ["-y", "versionlock", "add"] and "libnccl-0:2.26.5-1+cuda12.9.*" in calls[1]


def test_rhel_epochs_in_facts_and_versionlock_are_in_state():
    facts, stack = in_state("rhel")
    assert "nvidia-kmod-common-3:570.148.08-1.el9.*\n" in facts["files"][VERSIONLOCK_LIST]
    facts["packages"]["nvidia-driver"] = "3:570.148.08-1.el9"
    assert plan(facts, stack) == []


def test_unlocked_driver_package_is_locked():
    facts, stack = in_state("rhel")
    facts["files"][VERSIONLOCK_LIST] = "".join(
        line for line in facts["files"][VERSIONLOCK_LIST].splitlines(keepends=True)
        if not line.startswith("xorg-x11-nvidia-"))
    [lock] = plan(facts, stack)
    assert "not held now: xorg-x11-nvidia" in lock.summary


@pytest.mark.parametrize("family", ["debian", "rhel"])
def test_cuda_minor_upgrade_releases_the_old_toolkit_hold_and_pin(family):
    facts, old = in_state(family)
    new = make_stack(family)
    new["cuda"] = {"version": "12.9", "packages": pkgs(("cuda-toolkit-12-9", "12.9.1-1"))}
    changes = {c.summary.split(" ")[0]: c for c in plan(facts, new)}
    release = changes["release"]
    assert release.commands == (for_family(family).unhold(["cuda-toolkit-12-8"]),)
    assert "not held now: cuda-toolkit-12-9" in changes["hold"].summary
    if family == "debian":
        prefs = changes["update"]
        assert "-Package: cuda-toolkit-12-8\n-Pin: version 12.8.1-1\n" in prefs.diff
        assert "+Package: cuda-toolkit-12-9\n+Pin: version 12.9.1-1\n" in prefs.diff


def test_a_package_pinned_twice_at_different_versions_is_refused():
    stack = make_stack()
    stack["nccl"]["packages"].append({"name": "datacenter-gpu-manager-4-core", "version": "1:4.4.1-1"})
    with pytest.raises(InputError, match="both"):
        plan(bare_facts(), stack)


def test_a_bare_plan_writes_the_preferences_once_before_the_driver_is_installed():
    from gpuprov.provision.ops import plan_changes

    changes = plan_changes(ctx_for(bare_facts(), make_stack(nvswitch=True, fourth_gen=True)))
    commands = [command for change in changes for command in change.commands]
    writes = [i for i, command in enumerate(commands) if pins.APT_PREFERENCES in command]
    installs = [i for i, command in enumerate(commands) if " install " in command and "nvidia-open-570=" in command]
    assert len(writes) == 1 and writes[0] < installs[0]


# The toolkit's release as `apt-get install cuda-toolkit-12-8` leaves it (names: NVIDIA/nvidia-container-toolkit
# #883; versions: NVIDIA's 12.8.1 images, cuda-cudart 12.8.90, libcublas 12.8.4.1, nvcc 12.8.93).
TOOLKIT = {"cuda-compiler-12-8": "12.8.1-1", "cuda-nvcc-12-8": "12.8.93-1", "cuda-cudart-12-8": "12.8.90-1",
           "libcublas-12-8": "12.8.4.1-1", "cuda-toolkit-12-8-config-common": "12.8.90-1",
           "cuda-toolkit-config-common": "12.8.90-1"}


def with_toolkit(facts, held=True):
    facts["packages"].update(TOOLKIT)
    if held:
        facts["held"] = sorted({*facts["held"], *TOOLKIT})
    return facts


def test_the_toolkits_release_is_pinned_at_its_installed_versions_and_in_state_changes_nothing():
    facts, stack = in_state()
    with_toolkit(facts)
    [prefs] = plan(facts, stack)
    assert prefs.summary.startswith(f"update {pins.APT_PREFERENCES}")
    for name, version in TOOLKIT.items():
        assert f"+Package: {name}\n+Pin: version {version}\n+Pin-Priority: 1001\n" in prefs.diff
    ctx = ctx_for(facts, stack)
    facts["files"][pins.APT_PREFERENCES] = pins.preferences(pins.pinned_packages(ctx), "570.148.08", "NVIDIA CUDA",
                                                            pins.toolkit_packages(ctx))
    assert plan(facts, stack) == []


def test_an_unheld_package_of_the_release_is_held_on_the_host_with_the_whole_release(tmp_path):
    facts, stack = in_state()
    with_toolkit(facts)
    facts["held"].remove("libcublas-12-8")
    changes = plan(facts, stack)
    [hold] = [c for c in changes if c.summary.startswith("hold")]
    assert "of the CUDA toolkit's release (not held now: libcublas-12-8)" in hold.summary
    listing = DPKG + "".join(f"ii  {name}\n" for name in TOOLKIT) + (
        "ii  cuda-compiler-12-6\nii  libcublas-12-6\nii  nsight-compute-2025.1.0\nii  gcc-12\n")
    [call] = run_hold(tmp_path, hold.commands[-1], listing)
    held = call[call.index("hold") + 1:]
    assert set(TOOLKIT) | {"nsight-compute-2025.1.0", "cuda-toolkit-12-8"} <= set(held)
    assert not {"cuda-compiler-12-6", "libcublas-12-6", "gcc-12", "bash"} & set(held)


def test_the_holds_of_the_release_are_kept_and_a_former_release_is_released():
    facts, stack = in_state()
    with_toolkit(facts)
    assert not [c for c in plan(facts, stack) if c.summary.startswith("release")]
    new = make_stack()
    new["cuda"] = {"version": "12.9", "packages": pkgs(("cuda-toolkit-12-9", "12.9.1-1"))}
    [release] = [c for c in plan(facts, new) if c.summary.startswith("release")]
    assert release.commands == (for_family("debian").unhold(
        ["cuda-compiler-12-8", "cuda-cudart-12-8", "cuda-nvcc-12-8", "cuda-toolkit-12-8",
         "cuda-toolkit-12-8-config-common"]),)


@pytest.mark.parametrize("family", ["debian", "rhel"])
def test_rhel_and_debian_hold_the_release_by_name(family):
    facts, stack = in_state(family)
    facts["packages"]["libcublas-12-8"] = "12.8.4.1-1"
    [hold] = [c for c in plan(facts, stack) if c.summary.startswith("hold")]
    assert "not held now: libcublas-12-8" in hold.summary
    assert "-(12-8)(-|$)" in hold.commands[-1]
