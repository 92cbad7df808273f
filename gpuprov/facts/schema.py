"""The facts documents as types: what `gpuprov.facts.gather.gather` and `gpuprov.harden.facts.gather` return.

TypedDicts, so the documents stay plain dicts (JSON as they are, `facts.get("docker")` as before) while type
checkers and readers see each key's type. A job that asks for some facts gets a document with those keys only,
hence `total=False` on the documents; `host` (base facts), `complete` and `notices` are always there.
"""

from __future__ import annotations

from typing import Literal, TypedDict


class OsRelease(TypedDict):
    """/etc/os-release: `key` is the OS gpuprov supports (`debian-12`, `ubuntu-22.04`, ...) or None."""

    id: str | None
    version_id: str | None
    codename: str | None
    family: Literal["debian", "rhel"] | None
    pretty_name: str | None
    key: str | None


class PciGpu(TypedDict):
    """One NVIDIA display controller on the PCI bus (`lspci -D -nn`)."""

    slot: str
    device_id: str
    description: str
    model: str | None


class SmiGpu(TypedDict):
    """One GPU as `nvidia-smi -q -x` reports it."""

    index: int
    name: str | None
    uuid: str | None
    bus_id: str | None
    memory_total_mib: int | None
    persistence_mode: bool | None
    ecc_mode: bool | None


class NvidiaSmi(TypedDict):
    """A working `nvidia-smi -q -x`."""

    driver_version: str | None
    cuda_version: str | None
    gpus: list[SmiGpu]


class NvidiaSmiError(TypedDict):
    """nvidia-smi is installed but did not answer: its message (`Failed to initialize NVML: ...`)."""

    error: str


class Nvrm(TypedDict):
    """The loaded kernel module (/proc/driver/nvidia/version)."""

    version: str
    open: bool


class ServiceState(TypedDict):
    exists: bool
    enabled: bool
    active: bool


class DockerFacts(TypedDict):
    version: str
    active: bool
    daemon_json: dict | None
    runtimes: list[str]
    live_runtimes: list[str] | None
    ctk_daemon_json: str | None


class FabricManagerFacts(TypedDict):
    version: str | None
    active: bool
    enabled: bool


class DcgmFacts(TypedDict):
    version: str
    active: bool


class PersistencedFacts(TypedDict):
    active: bool
    enabled: bool


class GpuProcess(TypedDict):
    pid: int | str
    process_name: str
    used_memory_mib: int | None


class DeviceUser(TypedDict):
    pid: int
    process_name: str


class Container(TypedDict, total=False):
    id: str
    name: str
    image: str


class HostFacts(TypedDict, total=False):
    """The base facts document (docs/design.md, "Host facts")."""

    host: str
    os: OsRelease
    kernel: str | None
    arch: str | None
    cpus: int | None
    mem_total_mib: int | None
    pci_gpus: list[PciGpu]
    nvswitch_count: int
    nvidia_smi: NvidiaSmi | NvidiaSmiError | None
    loaded_driver_version: str | None
    loaded_driver_open: bool | None
    nvidia_modules_loaded: list[str]
    packages: dict[str, str]
    held: list[str]
    nouveau_loaded: bool
    nouveau_blacklisted: bool
    secure_boot: bool | None
    kernel_headers: bool
    docker: DockerFacts | None
    container_toolkit: str | None
    fabricmanager: FabricManagerFacts | None
    dcgm: DcgmFacts | None
    persistenced: PersistencedFacts | None
    services: dict[str, ServiceState]
    reboot_required: bool
    reboot_required_pkgs: list[str]
    gpuprov_reboot_pending: list[str]
    gpu_processes: list[GpuProcess] | None
    gpu_device_users: list[DeviceUser]
    containers: list[Container] | None
    slurm_jobs: list[str] | None
    dkms_status: list[str] | None
    kernels_installed: list[str]
    dpkg_interrupted: bool
    package_manager_busy: list[str]
    cloud_init: str | None
    disk_free_mib: dict[str, int]
    files: dict[str, str | None]
    gathered_at: str | None
    complete: bool
    notices: list[str]


class Controller(TypedDict):
    """Where gpuprov connects from, as the host sees it (SSH_CONNECTION)."""

    address: str
    port: int


class HardenFacts(TypedDict, total=False):
    """The harden facts document (`gpuprov.harden.facts`)."""

    os: OsRelease
    systemd: bool
    controller: Controller | None
    user_groups: list[str]
    sshd: dict[str, list[str]] | None
    sshd_error: str | None
    ssh_supports: dict[str, list[str]]
    host_key_types: list[str]
    sshd_dropins: list[str]
    nft: bool
    nft_table: str | None
    units: dict[str, str]
    packages: dict[str, str]
    apt_config: dict[str, list[str]]
    sysctl: dict[str, str]
    tmp_options: list[str] | None
    docker: bool
    docker_bridges: list[str] | None
    other_firewalls: dict[str, str]
    other_rulesets: list[str]
    guards: list[str]
    files: dict[str, str | None]
    complete: bool
    notices: list[str]
