"""Parsers of what the fact providers' commands print (gpuprov/facts/base.py registers them with their commands).

Every parser accepts empty output (the tool is missing) and returns null-like data for it. Parsers of commands whose
exit status matters take `(text, rc)`, as `Provider.parse` does; `rc` is `providers.MISSING` when the tool is not
installed.
"""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET

from gpuprov.facts.providers import MISSING, NoAnswer
from gpuprov.facts.schema import (
    Container,
    DeviceUser,
    GpuProcess,
    NvidiaSmi,
    NvidiaSmiError,
    Nvrm,
    OsRelease,
    PciGpu,
    ServiceState,
    SmiGpu,
)
from gpuprov.smoke import nvsmi

LEGACY_RC = re.compile(r"^@@rc=(\d*)\s*$", re.M)
OS_KEYS = {("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12"), ("rhel", "9"), ("rocky", "9")}
RHEL_LIKE = {"rhel", "rocky", "almalinux", "centos", "fedora", "ol"}


def parse_os_release(text: str) -> OsRelease:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"').strip("'")
    os_id = values.get("ID")
    version = values.get("VERSION_ID")
    likes = set(values.get("ID_LIKE", "").split())
    if os_id in {"debian", "ubuntu"} or "debian" in likes:
        family = "debian"
    elif os_id in RHEL_LIKE or likes & {"rhel", "fedora"}:
        family = "rhel"
    else:
        family = None
    major = (version or "").split(".")[0]
    key = None
    if (os_id, version) in OS_KEYS:
        key = f"{os_id}-{version}"
    elif os_id in {"rhel", "rocky"} and (os_id, major) in OS_KEYS:
        key = f"{os_id}-{major}"
    return {"id": os_id, "version_id": version, "codename": values.get("VERSION_CODENAME") or None,
            "family": family, "pretty_name": values.get("PRETTY_NAME"), "key": key}


LSPCI_LINE = re.compile(
    r"^(?P<slot>(?:[0-9a-fA-F]{4,}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<cls>.*?)\s\[(?P<class_id>[0-9a-fA-F]{4})\]:\s+(?P<desc>.*)\s"
    r"\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
)


def parse_lspci(text: str) -> tuple[list[PciGpu], int]:
    """NVIDIA GPUs and the NVSwitch count from `lspci -D -nn` lines."""
    from gpuprov import catalog

    gpus: list[PciGpu] = []
    nvswitches = 0
    for line in text.splitlines():
        match = LSPCI_LINE.match(line.strip())
        if not match or match["vendor"].lower() != "10de":
            continue
        device = match["device"].lower()
        if catalog.is_nvswitch(device):
            nvswitches += 1
            continue
        if not match["class_id"].startswith("03"):  # display controllers only (VGA 0300, 3D 0302)
            continue
        model = catalog.by_pci_id(device)
        gpus.append({"slot": match["slot"], "device_id": device, "description": match["desc"].strip(),
                     "model": model.key if model else None})
    return gpus, nvswitches


def _enabled(value: str | None) -> bool | None:
    if not isinstance(value, str):
        return None
    return {"enabled": True, "disabled": False}.get(value.strip().lower())


def _failure(text: str, rc: int) -> NvidiaSmiError:
    """nvidia-smi's own message (every line it printed), or its exit code when it printed nothing."""
    return {"error": "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())
            or f"exit code {rc}"}


XML_START = re.compile(r"<\?xml|<nvidia_smi_log[\s>]")
XML_END = "</nvidia_smi_log>"


def _smi_report(text: str, rc: int) -> dict | str:
    """`nvidia-smi -q -x` (stderr joined in) read by the suite's own parser (gpuprov.smoke.nvsmi.parse_q_xml), or
    what went wrong (a str): nvidia-smi's own message, no XML, or invalid XML."""
    if rc != 0:
        return _failure(text, rc)["error"]
    start = XML_START.search(text)
    end = text.rfind(XML_END)
    if start is None or end < 0:
        return f"nvidia-smi -q -x printed no XML report: {text.strip()[:300] or 'nothing'}"
    try:
        return nvsmi.parse_q_xml(text[start.start(): end + len(XML_END)])
    except ET.ParseError as exc:
        return f"nvidia-smi -q -x printed invalid XML ({exc})"


def parse_nvidia_smi_xml(text: str, rc: int) -> NvidiaSmi | NvidiaSmiError | None:
    """Driver, CUDA and per-GPU facts from `nvidia-smi -q -x`; None when nvidia-smi is not installed,
    `{"error": ...}` when it failed."""
    if rc == MISSING:
        return None
    report = _smi_report(text, rc)
    if isinstance(report, str):
        return {"error": report}
    gpus: list[SmiGpu] = [{
        "index": index, "name": gpu["name"], "uuid": gpu["uuid"], "bus_id": gpu["bus_id"],
        "memory_total_mib": gpu["memory_total_mib"], "persistence_mode": _enabled(gpu["persistence_mode"]),
        "ecc_mode": _enabled(gpu["ecc_mode"])} for index, gpu in enumerate(report["gpus"])]
    return {"driver_version": report["driver_version"], "cuda_version": report["cuda_version"], "gpus": gpus}


def parse_gpu_processes(text: str, rc: int) -> list[GpuProcess] | None:
    """The compute processes in the same `nvidia-smi -q -x` report (one NVML start per gather, not two): one entry
    per process and GPU, as `--query-compute-apps` lists them. A process of type C, C+G, M or M+C (MPS) is work; a
    graphics-only one (type G: Xorg) is not, as `--query-compute-apps` does not list it either. None without
    nvidia-smi, NoAnswer when it failed (NVML cannot answer)."""
    if rc == MISSING:
        return None
    report = _smi_report(text, rc)
    if isinstance(report, str):
        raise NoAnswer(report if report.startswith("nvidia-smi") else f"nvidia-smi -q -x failed: {report}")
    return [{"pid": proc["pid"], "process_name": proc["name"] or "", "used_memory_mib": proc["used_mib"]}
            for gpu in report["gpus"] for proc in gpu["processes"] if (proc["type"] or "C") != "G"]


def with_status(text: str) -> tuple[str, int | None]:
    """A command's output with its exit status appended as a last `@@rc=N` line (how the lab tests hold what a
    tool printed) -> (the output, N); N is None without such a line."""
    matches = list(LEGACY_RC.finditer(text))
    if not matches or text[matches[-1].end():].strip():
        return text, None
    last = matches[-1]
    return text[: last.start()], int(last.group(1)) if last.group(1) else None


NVRM = re.compile(r"NVRM version:.*?(?:Kernel Module|x86_64|aarch64)\s+(\d+\.\d+(?:\.\d+)?)\s")


def parse_nvrm(text: str) -> Nvrm | None:
    """The loaded kernel module's version and flavour from /proc/driver/nvidia/version."""
    match = NVRM.search(text)
    if not match:
        return None
    return {"version": match.group(1), "open": "Open Kernel Module" in text}


def parse_packages(text: str) -> tuple[dict[str, str], list[str]]:
    """Installed packages {name: version} and the held ones, from dpkg-query (status ii/hi) or rpm lines."""
    packages, held = {}, []
    for line in text.splitlines():
        fields = line.split("\t")
        status = fields[0].strip() if fields else ""
        if len(fields) != 3 or status not in {"ii", "hi"}:
            continue
        name = fields[1].strip()
        packages[name] = fields[2].strip().removeprefix("(none):").removeprefix("0:")
        if status == "hi":
            held.append(name)
    return packages, sorted(held)


def parse_secure_boot(text: str) -> bool | None:
    value = text.strip()
    if value == "bios":
        return False
    if value.isdigit():
        return value == "1"
    return None


def parse_services(text: str) -> dict[str, ServiceState]:
    """Units from `systemctl show -p Id,LoadState,UnitFileState,ActiveState UNIT...` (blank-line separated)."""
    services: dict[str, ServiceState] = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if not props.get("Id"):
            continue
        services[props["Id"].removesuffix(".service")] = {
            "exists": props.get("LoadState") == "loaded",
            "enabled": props.get("UnitFileState") in {"enabled", "enabled-runtime", "static", "alias"},
            "active": props.get("ActiveState") == "active",
        }
    return services


def first_version(text: str) -> str | None:
    match = re.search(r"(\d+\.\d+(?:\.\d+)*)", text)
    return match.group(1) if match else None


def parse_disk(text: str) -> dict[str, int]:
    """Free MiB per mount point from `df -Pk`."""
    free = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 6 and fields[3].isdigit():
            free[fields[5]] = int(fields[3]) // 1024
    return free


def parse_file(text: str) -> str | None:
    """A managed file's content (None when absent): `present` and its base64, `unreadable`, or nothing."""
    status, _, payload = text.partition("\n")
    if status.strip() != "present":
        return None
    return base64.b64decode(payload.replace("\n", "")).decode(errors="replace")


FILE_MARK = re.compile(r"^@@file (?P<path>.*)$", re.M)


def parse_files(text: str) -> dict[str, str | None]:
    """{path: content or None} from the files provider's `@@file PATH` records (each parsed by parse_file)."""
    marks = list(FILE_MARK.finditer(text))
    files = {}
    for index, mark in enumerate(marks):
        end = marks[index + 1].start() if index + 1 < len(marks) else len(text)
        files[mark.group("path")] = parse_file(text[mark.end() + 1: end].strip("\n"))
    return files


def parse_containers(text: str, rc: int) -> list[Container] | None:
    """Running containers from `docker ps --format ID\tNAME\tIMAGE`; None without Docker; NoAnswer when it fails."""
    if rc == MISSING:
        return None
    if rc != 0:
        raise NoAnswer(f"docker ps exited {rc}")
    return [dict(zip(("id", "name", "image"), line.split("\t", 2), strict=False)) for line in parse_lines(text)]


def parse_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_device_users(text: str) -> list[DeviceUser]:
    """Processes with a /dev/nvidiaN open: `PID COMM` lines."""
    users: list[DeviceUser] = []
    for line in parse_lines(text):
        pid, _, comm = line.partition(" ")
        if pid.isdigit():
            users.append({"pid": int(pid), "process_name": comm})
    return users


def parse_slurm(text: str, rc: int) -> list[str] | None:
    """Slurm jobs on this node (`squeue -h -w NODE -o '%i %u %j'`); None without Slurm; NoAnswer when it fails."""
    if rc == MISSING:
        return None
    if rc != 0:
        raise NoAnswer(f"squeue exited {rc}")
    return parse_lines(text)


def loaded_driver(nvrm: Nvrm | None, smi: NvidiaSmi | NvidiaSmiError | None) -> str | None:
    """The loaded module's version: /proc/driver/nvidia/version, else what a working nvidia-smi reports
    (NVML answers only when the loaded module and the library match)."""
    if nvrm:
        return nvrm["version"]
    if smi and "error" not in smi:
        return smi.get("driver_version")
    return None


def json_keys(text: str) -> list[str] | None:
    """Sorted keys of a JSON object (`docker info --format '{{json .Runtimes}}'`); None when unreadable."""
    value = json_or_none(text.strip())
    return sorted(value) if isinstance(value, dict) else None


def json_or_none(text: str | None):
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
