"""apt and dnf command generation: exact versions, lock timeouts, quoting."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.core.errors import InputError
from gpuprov.core.packages import Package, for_family

APT_COMMON = ["DEBIAN_FRONTEND=noninteractive", "-o", "DPkg::Lock::Timeout=120",
              "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]


def test_apt_install_pins_exact_versions_waits_for_the_lock_and_removes_in_one_transaction():
    apt = for_family("debian", lock_timeout=120)
    [command] = apt.install([Package("nvidia-open-570", "570.148.08-1ubuntu1")], remove=["cuda-drivers-535"])
    words = shlex.split(command)
    assert words[:2] == ["DEBIAN_FRONTEND=noninteractive", "apt-get"]
    assert all(word in words for word in APT_COMMON)
    assert words[-4:] == ["--no-install-recommends", "--allow-downgrades",
                          "nvidia-open-570=570.148.08-1ubuntu1", "cuda-drivers-535-"]
    assert "install" in words and "-y" in words


def test_apt_hold_unhold_update_and_versions():
    apt = for_family("debian")
    assert shlex.split(apt.hold([Package("libnccl2", "2.26.5-1+cuda12.9")]))[-2:] == ["hold", "libnccl2"]
    assert shlex.split(apt.unhold(["a", "b"]))[-3:] == ["unhold", "a", "b"]
    assert "DPkg::Lock::Timeout=300" in apt.update() and apt.update().endswith("update")
    assert apt.same_version("1:4.2.3-1", "1:4.2.3-1") and not apt.same_version("4.2.3-1", "1:4.2.3-1")
    assert not apt.same_version(None, "1")


def test_dnf_install_uses_exact_nevr_and_removes_first():
    dnf = for_family("rhel")
    commands = dnf.install([Package("nvidia-driver", "3:570.148.08-1.el9")], remove=["kmod-nvidia-latest-dkms"])
    assert shlex.split(commands[0]) == ["dnf", "-y", "remove", "kmod-nvidia-latest-dkms"]
    assert shlex.split(commands[1]) == ["dnf", "-y", "--setopt=install_weak_deps=False", "install",
                                        "--allowerasing", "nvidia-driver-3:570.148.08-1.el9"]
    assert shlex.split(dnf.hold([Package("libnccl", "2.26.5-1+cuda12.9")])) == [
        "dnf", "-y", "versionlock", "add", "libnccl-2.26.5-1+cuda12.9"]
    assert shlex.split(dnf.unhold(["libnccl"])) == ["dnf", "-y", "versionlock", "delete", "libnccl"]
    assert dnf.same_version("3:570.148.08-1.el9", "570.148.08-1.el9")
    assert not dnf.same_version("570.133.20-1.el9", "570.148.08-1.el9")


@pytest.mark.parametrize("name,version", [("nvidia-open-570;reboot", "1"), ("libnccl2", "$(touch /tmp/x)"),
                                          ("a b", "1"), ("-o", "1"), ("x", "")])
def test_package_rejects_names_and_versions_that_are_not_package_strings(name, version):
    with pytest.raises(InputError, match="not a valid package"):
        Package(name, version)


def test_unknown_family_is_bad_input():
    with pytest.raises(InputError, match="no package manager"):
        for_family("arch")


@given(st.from_regex(r"[a-z0-9][a-z0-9+.-]{0,20}", fullmatch=True),
       st.from_regex(r"[0-9][A-Za-z0-9.+~:_-]{0,20}", fullmatch=True))
def test_every_package_spec_is_one_shell_word(name, version):
    for family in ("debian", "rhel"):
        pm = for_family(family)
        pkg = Package(name, version)
        words = shlex.split(pm.install([pkg])[-1])
        assert words[-1] == pm.spec(pkg)


def test_hold_installed_rejects_names_that_are_not_package_strings():
    for family in ("debian", "rhel"):
        with pytest.raises(InputError, match="not a valid package"):
            for_family(family).hold_installed(["nvidia-open;reboot"], ["nvidia-"])
        with pytest.raises(ValueError, match="plain names"):
            for_family(family).hold_installed(["nvidia-open"], ["nvidia-|.*"])


def test_versionlock_specs_are_not_expanded_as_file_globs(tmp_path):
    """`name-EPOCH:VERSION-RELEASE.*` is a dnf pattern: a file matching it must not replace it."""
    (tmp_path / "rpm").write_text("#!/bin/sh\necho 'libnccl (none):2.26.5-1+cuda12.9'\n")
    (tmp_path / "dnf").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/log\n")
    for stub in ("rpm", "dnf"):
        (tmp_path / stub).chmod(0o755)
    (tmp_path / "libnccl-0:2.26.5-1+cuda12.9.x86_64").write_text("")
    command = for_family("rhel").hold_installed(["libnccl"], ["nvidia-"])
    subprocess.run(["sh", "-ec", command], check=True, cwd=tmp_path, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert (tmp_path / "log").read_text() == "-y versionlock add libnccl-0:2.26.5-1+cuda12.9.*\n"


@pytest.mark.parametrize("pattern", ["-(12-8)(-|$)/; system(\"reboot\"); /x", "a'b", "a\\\\b", "A"])
def test_a_family_pattern_that_could_leave_its_awk_literal_is_refused(pattern):
    for family in ("debian", "rhel"):
        with pytest.raises(ValueError, match="family pattern"):
            for_family(family).hold_installed(["nvidia-open"], ["nvidia-"], pattern)
    with pytest.raises(ValueError, match="family pattern"):
        for_family("debian").install_release([Package("cuda-toolkit-12-8", "12.8.1-1")], pattern)


def test_hold_installed_selects_the_family_pattern_as_awk_reads_it(tmp_path):
    stub = tmp_path / "dpkg-query"
    stub.write_text("#!/bin/sh\nprintf 'ii  libcublas-12-8\\nii  libcublas-12-80\\nii  gcc-12\\n"
                    "hi  cuda-nvcc-12-8:arm64\\n'\n")
    stub.chmod(0o755)
    log = tmp_path / "log"
    mark = tmp_path / "apt-mark"
    mark.write_text(f'#!/bin/sh\necho "$@" > {log}\n')
    mark.chmod(0o755)
    command = for_family("debian").hold_installed([], ["nvidia-"], "-(12-8)(-|$)")
    subprocess.run(["sh", "-ec", command], check=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert log.read_text().split()[-3:] == ["hold", "cuda-nvcc-12-8:arm64", "libcublas-12-8"]
