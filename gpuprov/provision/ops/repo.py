"""NVIDIA's CUDA network repository for an OS and a CPU architecture (data in gpuprov/data/packages.yaml)."""

from __future__ import annotations

from gpuprov.core.errors import InputError
from gpuprov.stack.data import OS_KEYS, table

# `uname -m` names, and the Debian names of the same architectures
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def _os_row(os_key: str) -> dict:
    row = table("packages")["os"].get(os_key)
    if row is None:
        raise InputError(f"no NVIDIA repository for OS {os_key!r}", step="plan",
                         hint=f"supported: {', '.join(OS_KEYS)}")
    return row


def repo_url(os_key: str, arch: str) -> tuple[str, str]:
    """(repository URL, signing key URL) of NVIDIA's repository for `os_key` on `arch` (`uname -m`): the
    directory is x86_64 on x86_64 and sbsa on arm64 servers (Grace: GH200, GB200)."""
    repository = table("packages")["repository"]
    row = _os_row(os_key)
    directory = repository["arch_dirs"].get(_ARCH_ALIASES.get(arch, arch))
    if directory is None:
        raise InputError(f"NVIDIA's CUDA repository has no packages for CPU architecture {arch!r}", step="plan",
                         hint=f"gpuprov provisions {' and '.join(repository['arch_dirs'])} hosts")
    url = f"{repository['base']}{row['repo_dir']}/{directory}/"
    return url, url + row["key_file"]


def repo_label(os_key: str) -> str:
    """The `Label:` of NVIDIA's repository Release file for `os_key`, which apt pins the repository by."""
    _os_row(os_key)
    return table("packages")["repository"]["label"]
