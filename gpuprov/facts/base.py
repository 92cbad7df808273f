"""The base facts: what gpuprov needs to know about a host (schema: gpuprov.facts.schema.HostFacts), one provider
per fact, registered in REGISTRY. Commands are POSIX sh, read-only, run as root; `need TOOL` exits 127 where the
tool is missing (a fact, not a failure).

A new fact source is one `REGISTRY.register(Provider(name, command, parse, unknown))` here (or in the module that
owns it, as gpuprov.harden.facts does for its own registry); a job then asks for it by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from gpuprov.facts.parsers import (
    first_version,
    json_keys,
    json_or_none,
    loaded_driver,
    parse_containers,
    parse_device_users,
    parse_disk,
    parse_file,
    parse_files,
    parse_gpu_processes,
    parse_lines,
    parse_lspci,
    parse_nvidia_smi_xml,
    parse_nvrm,
    parse_os_release,
    parse_packages,
    parse_secure_boot,
    parse_services,
    parse_slurm,
)
from gpuprov.facts.providers import Derived, FactArgs, Provider, Registry, quoted_word
from gpuprov.facts.schema import (
    DcgmFacts,
    DockerFacts,
    FabricManagerFacts,
    PersistencedFacts,
    ServiceState,
)

T = TypeVar("T")


def text_only(parse: Callable[[str], T]) -> Callable[[str, int], T]:
    """A parser of a command whose exit status says nothing the output does not (empty output: nothing there)."""
    return lambda text, rc: parse(text)


def first_line(text: str) -> str | None:
    found = parse_lines(text)
    return found[0] if found else None


def files_command(args: FactArgs) -> str:
    """The job's files: per file `@@file PATH`, then `present` and its base64, `unreadable`, or nothing (absent)."""
    if not args.files:
        return ":"
    words = " ".join(quoted_word(path, "managed file path") for path in args.files)
    return (f"for f in {words}; do\n  printf '@@file %s\\n' \"$f\"\n"
            "  if [ -r \"$f\" ]; then echo present; base64 < \"$f\"; elif [ -e \"$f\" ]; then echo unreadable; fi\n"
            "done")


NVIDIA_SMI = "need nvidia-smi; timeout 60 nvidia-smi -q -x 2>&1"   # driver, GPUs and their processes
LSPCI = "need lspci; lspci -D -nn 2>/dev/null | grep -F '[10de:'"
MODULES = ("cut -d' ' -f1 /proc/modules 2>/dev/null | "
           "grep -E '^(nouveau|nvidia|nvidia_uvm|nvidia_drm|nvidia_modeset)$'")
DPKG_PATTERNS = ("'nvidia*' 'libnvidia*' 'cuda*' 'libcu*' 'libnpp*' 'libnv*' 'gds-tools*' 'nsight-*' 'libnccl*' "
                 "'datacenter-gpu-manager*' 'libxnvctrl*' 'xserver-xorg-video-nvidia*' 'nvlsm*' 'dkms' "
                 "'linux-headers-*' 'linux-image-*' 'docker.io' 'docker-ce' 'unattended-upgrades' 'prometheus' "
                 "'prometheus-node-exporter'")
RPM_NAMES = ("nvidia|libnvidia|cuda|libcu|libnpp|libnv|gds-tools|nsight-|libnccl|datacenter-gpu-manager|dkms|"
             "kmod-nvidia|kernel-devel|kernel-headers|docker|moby|python3-dnf-plugin-versionlock|nvlsm|prometheus")
PACKAGES = ("if have dpkg-query; then\n"
            "  dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' " + DPKG_PATTERNS
            + " 2>/dev/null | grep '^[ih]i'\n"
            "elif have rpm; then\n"
            "  rpm -qa --qf 'ii \\t%{NAME}\\t%{EPOCH}:%{VERSION}-%{RELEASE}\\n' 2>/dev/null |\n"
            "    grep -E '\t(" + RPM_NAMES + ")'\n"
            "fi")
SECURE_BOOT = """if [ -d /sys/firmware/efi ]; then
  f=$(ls /sys/firmware/efi/efivars/SecureBoot-* 2>/dev/null | head -n 1)
  if [ -n "$f" ]; then od -An -t u1 -j 4 -N 1 "$f" 2>/dev/null; else echo unknown; fi
else
  echo bios
fi"""
KERNEL_HEADERS = """k=$(uname -r)
if [ -e "/lib/modules/$k/build" ] || [ -d "/usr/src/linux-headers-$k" ] || [ -d "/usr/src/kernels/$k" ]; then
  echo yes
else
  echo no
fi"""
# what `nvidia-ctk runtime configure` would write, made on a temporary copy (the real diff for the plan)
CTK_DAEMON_JSON = """need nvidia-ctk; need dockerd
t=$(mktemp -d) && { [ -f /etc/docker/daemon.json ] && cp /etc/docker/daemon.json "$t/daemon.json"
  nvidia-ctk runtime configure --runtime=docker --config="$t/daemon.json" >/dev/null 2>&1 && base64 < "$t/daemon.json"
  rm -rf "$t"; }"""
SERVICE_UNITS = ("docker nvidia-fabricmanager nvidia-dcgm nvidia-persistenced nvlsm unattended-upgrades cloud-init "
                 "prometheus-node-exporter prometheus nvidia-dcgm-exporter gpuprov-drift.timer "
                 "gpuprov-validate-idle.timer")
# processes holding a GPU device open: what runs even when NVML cannot answer (driver/library mismatch)
DEVICE_USERS = """[ -d /proc/driver/nvidia ] || exit 0
find /proc/[0-9]*/fd -maxdepth 1 -lname '/dev/nvidia[0-9]*' 2>/dev/null | cut -d/ -f3 | sort -un |
  while read -r p; do echo "$p $(cat "/proc/$p/comm" 2>/dev/null)"; done"""
PACKAGE_MANAGERS = "need pgrep; pgrep -a -x 'apt|apt-get|dpkg|unattended-upgr|dnf|yum|packagekitd' 2>/dev/null"


def _int(text: str) -> int | None:
    value = text.strip()
    return int(value) if value.isdigit() else None


def _mem_total_mib(text: str) -> int | None:
    match = re.search(r"(\d+)", text)
    return int(match.group(1)) // 1024 if match else None


def _modules(text: str) -> set[str]:
    return set(text.split())


def _ctk_daemon_json(text: str) -> str | None:
    return parse_file("present\n" + text) if text.strip() else None


def _cloud_init(text: str) -> str | None:
    match = re.search(r"status:\s*(\S+)", text)
    return match.group(1) if match else None


def _docker(version: str | None, services: dict[str, ServiceState], files: dict[str, str | None],
            live_runtimes: list[str] | None, ctk_daemon_json: str | None) -> DockerFacts | None:
    if version is None:
        return None
    daemon_json = json_or_none(files.get("/etc/docker/daemon.json"))
    return {"version": version, "active": services.get("docker", {}).get("active", False),
            "daemon_json": daemon_json, "runtimes": sorted((daemon_json or {}).get("runtimes", {})),
            "live_runtimes": live_runtimes, "ctk_daemon_json": ctk_daemon_json}


def _fabricmanager(version: str | None, services: dict[str, ServiceState]) -> FabricManagerFacts | None:
    service = services.get("nvidia-fabricmanager", {})
    if not (version or service.get("exists")):
        return None
    return {"version": version, "active": service.get("active", False), "enabled": service.get("enabled", False)}


def _dcgm(version: str | None, services: dict[str, ServiceState]) -> DcgmFacts | None:
    if version is None:
        return None
    return {"version": version, "active": services.get("nvidia-dcgm", {}).get("active", False)}


def _persistenced(services: dict[str, ServiceState]) -> PersistencedFacts | None:
    service = services.get("nvidia-persistenced")
    if not service or not service["exists"]:
        return None
    return {"active": service["active"], "enabled": service["enabled"]}


REGISTRY = Registry("facts")
_add = REGISTRY.register  # `default=False`: a building block of derived facts, gathered when they are asked for

_add(Provider("os", "cat /etc/os-release 2>/dev/null", text_only(parse_os_release), parse_os_release("")))
_add(Provider("kernel", "uname -r", text_only(first_line)))
_add(Provider("arch", "uname -m", text_only(first_line)))
_add(Provider("cpus", "getconf _NPROCESSORS_ONLN 2>/dev/null", text_only(_int)))
_add(Provider("mem_total_mib", "grep -E '^MemTotal:' /proc/meminfo", text_only(_mem_total_mib)))
_add(Provider("pci_gpus", LSPCI, text_only(lambda text: parse_lspci(text)[0]), []))
_add(Provider("nvswitch_count", LSPCI, text_only(lambda text: parse_lspci(text)[1]), 0))
_add(Provider("nvidia_smi", NVIDIA_SMI, parse_nvidia_smi_xml))
_add(Provider("nvrm", "cat /proc/driver/nvidia/version 2>/dev/null", text_only(parse_nvrm)), default=False)
_add(Derived("loaded_driver_version", ("nvrm", "nvidia_smi"), loaded_driver))
_add(Derived("loaded_driver_open", ("nvrm",), lambda nvrm: nvrm["open"] if nvrm else None))
_add(Provider("nvidia_modules_loaded", MODULES, text_only(lambda text: sorted(_modules(text) - {"nouveau"})), []))
_add(Provider("packages", PACKAGES, text_only(lambda text: parse_packages(text)[0]), {}))
_add(Provider("held", PACKAGES, text_only(lambda text: parse_packages(text)[1]), []))
_add(Provider("nouveau_loaded", MODULES, text_only(lambda text: "nouveau" in _modules(text)), False))
_add(Provider("nouveau_blacklisted",
              "grep -rhsE '^[[:space:]]*blacklist[[:space:]]+nouveau' /etc/modprobe.d /usr/lib/modprobe.d "
              "/lib/modprobe.d", text_only(lambda text: bool(text.strip())), False))
_add(Provider("secure_boot", SECURE_BOOT, text_only(parse_secure_boot)))
_add(Provider("kernel_headers", KERNEL_HEADERS, text_only(lambda text: text.strip() == "yes"), False))
_add(Provider("dockerd_version", "need dockerd; dockerd --version 2>/dev/null", text_only(first_version)),
     default=False)
_add(Provider("services", f"need systemctl; systemctl show -p Id,LoadState,UnitFileState,ActiveState "
                          f"{SERVICE_UNITS} 2>/dev/null", text_only(parse_services), {}))
_add(Provider("files", files_command, text_only(parse_files), {}))
_add(Provider("docker_runtimes", "need docker; timeout 20 docker info --format '{{json .Runtimes}}' 2>/dev/null",
              text_only(json_keys)), default=False)
_add(Provider("ctk_daemon_json", CTK_DAEMON_JSON, text_only(_ctk_daemon_json)), default=False)
_add(Derived("docker", ("dockerd_version", "services", "files", "docker_runtimes", "ctk_daemon_json"), _docker))
_add(Provider("container_toolkit", "need nvidia-ctk; nvidia-ctk --version 2>/dev/null", text_only(first_version)))
_add(Provider("fabricmanager_version", "need nv-fabricmanager; nv-fabricmanager --version 2>/dev/null",
              text_only(first_version)), default=False)
_add(Derived("fabricmanager", ("fabricmanager_version", "services"), _fabricmanager))
_add(Provider("dcgm_version", "need dcgmi; dcgmi --version 2>/dev/null", text_only(first_version)), default=False)
_add(Derived("dcgm", ("dcgm_version", "services"), _dcgm))
_add(Derived("persistenced", ("services",), _persistenced))
_add(Provider("reboot_required", "[ -f /var/run/reboot-required ] && echo yes",
              text_only(lambda text: text.strip() == "yes"), False))
_add(Provider("reboot_required_pkgs", "cat /var/run/reboot-required.pkgs 2>/dev/null", text_only(parse_lines), []))
_add(Provider("gpuprov_reboot_pending", "cat /run/gpuprov/reboot-pending 2>/dev/null", text_only(parse_lines), []))
_add(Provider("gpu_processes", NVIDIA_SMI, parse_gpu_processes))   # the same run as nvidia_smi
_add(Provider("gpu_device_users", DEVICE_USERS, text_only(parse_device_users), []))
_add(Provider("containers", "need docker; timeout 20 docker ps --format '{{.ID}}\\t{{.Names}}\\t{{.Image}}' "
                            "2>/dev/null", parse_containers))
_add(Provider("slurm_jobs", "need squeue; timeout 20 squeue -h -w \"$(hostname -s)\" -o '%i %u %j' 2>/dev/null",
              parse_slurm))
_add(Provider("dkms_status", "need dkms; dkms status 2>/dev/null",
              text_only(lambda text: parse_lines(text) or None)))
_add(Provider("kernels_installed", "ls -1 /lib/modules 2>/dev/null", text_only(parse_lines), []))
_add(Provider("dpkg_interrupted", "[ -d /var/lib/dpkg/updates ] && ls -A /var/lib/dpkg/updates 2>/dev/null | "
                                  "head -n 3", text_only(lambda text: bool(text.strip())), False))
_add(Provider("package_manager_busy", PACKAGE_MANAGERS,
              text_only(lambda text: [line for line in text.splitlines() if line]), []))
_add(Provider("cloud_init", "need cloud-init; cloud-init status 2>/dev/null", text_only(_cloud_init)))
_add(Provider("disk_free_mib", "df -Pk / /var 2>/dev/null", text_only(parse_disk), {}))
_add(Provider("gathered_at", "date -u +%Y-%m-%dT%H:%M:%SZ", text_only(first_line)))
