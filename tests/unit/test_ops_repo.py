"""NVIDIA's CUDA repository per OS and CPU architecture: x86_64, and sbsa for arm64 servers (GH200, GB200)."""

from __future__ import annotations

import pytest

from gpuprov.core.errors import InputError
from gpuprov.provision.ops.repo import repo_label, repo_url

BASE = "https://developer.download.nvidia.com/compute/cuda/repos/"


@pytest.mark.parametrize("os_key,arch,url,key", [
    ("ubuntu-22.04", "x86_64", f"{BASE}ubuntu2204/x86_64/", f"{BASE}ubuntu2204/x86_64/3bf863cc.pub"),
    ("ubuntu-22.04", "aarch64", f"{BASE}ubuntu2204/sbsa/", f"{BASE}ubuntu2204/sbsa/3bf863cc.pub"),
    ("ubuntu-24.04", "arm64", f"{BASE}ubuntu2404/sbsa/", f"{BASE}ubuntu2404/sbsa/3bf863cc.pub"),
    ("debian-12", "aarch64", f"{BASE}debian12/sbsa/", f"{BASE}debian12/sbsa/3bf863cc.pub"),
    ("rhel-9", "x86_64", f"{BASE}rhel9/x86_64/", f"{BASE}rhel9/x86_64/D42D0685.pub"),
    ("rocky-9", "aarch64", f"{BASE}rhel9/sbsa/", f"{BASE}rhel9/sbsa/D42D0685.pub"),
])
def test_repository_directory_per_architecture(os_key, arch, url, key):
    assert repo_url(os_key, arch) == (url, key)


@pytest.mark.parametrize("arch", ["ppc64le", "armv7l", "", "sbsa"])
def test_unknown_architecture_is_bad_input(arch):
    with pytest.raises(InputError, match="no packages for CPU architecture") as info:
        repo_url("ubuntu-22.04", arch)
    assert info.value.exit_code == 2 and "x86_64 and aarch64" in info.value.hint


def test_unknown_os_is_bad_input():
    with pytest.raises(InputError, match="no NVIDIA repository for OS"):
        repo_url("windows-11", "x86_64")


def test_the_release_label_apt_pins_by():
    """NVIDIA's cuda-<distro>.pin pins `release l=NVIDIA CUDA`."""
    assert repo_label("debian-12") == "NVIDIA CUDA"
