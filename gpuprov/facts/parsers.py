"""Parsers for the sections of the facts script's output. Each takes the section's text and returns data.

Every parser accepts an empty section (the tool is missing) and returns null-like data for it.
"""

from __future__ import annotations

import base64
import json
import re

SECTION = re.compile(r"^@@gpuprov:(.+)$", re.M)
OS_KEYS = {("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12"), ("rhel", "9"), ("rocky", "9")}
RHEL_LIKE = {"rhel", "rocky", "almalinux", "centos", "fedora", "ol"}


def split_sections(output: str) -> dict[str, str]:
    """Cut the script's output into {section name: text}."""
    parts = SECTION.split(output)
    sections: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sections[name.strip()] = body.strip("\n")
    return sections


def parse_os_release(text: str) -> dict:
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


def parse_lspci(text: str) -> tuple[list[dict], int]:
    """NVIDIA GPUs and the NVSwitch count from `lspci -D -nn` lines."""
    from gpuprov import catalog

    gpus, nvswitches = [], 0
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


def parse_smi_tree(text: str) -> dict:
    """`nvidia-smi -q` text into nested dicts; GPU blocks under "GPU <bus id>" keys."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("==="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, sep, value = raw.strip().partition(" : ")
        if not sep and raw.rstrip().endswith(":"):
            key, sep, value = raw.strip()[:-1], ":", ""
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if sep and value.strip():
            parent[key.strip()] = value.strip()
        else:
            child: dict = {}
            parent[key.strip()] = child
            stack.append((indent, child))
    return root


def _enabled(value) -> bool | None:
    if not isinstance(value, str):
        return None
    return {"enabled": True, "disabled": False}.get(value.strip().lower())


def _mib(value) -> int | None:
    match = re.match(r"(\d+)\s*MiB", value or "") if isinstance(value, str) else None
    return int(match.group(1)) if match else None


def parse_nvidia_smi(text: str) -> dict | None:
    """Driver, CUDA and per-GPU facts from `nvidia-smi -q`; `{"error": ...}` when it failed."""
    if not text.strip():
        return None
    rc_match = re.search(r"^@@rc=(\d+)\s*$", text, re.M)
    body = text[: rc_match.start()] if rc_match else text
    if rc_match and rc_match.group(1) != "0":
        lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
        return {"error": "; ".join(lines) or f"exit code {rc_match.group(1)}"}
    tree = parse_smi_tree(body)
    gpus = []
    for key, block in tree.items():
        if not key.startswith("GPU ") or not isinstance(block, dict):
            continue
        ecc = block.get("ECC Mode", {})
        gpus.append({
            "index": len(gpus),
            "name": block.get("Product Name"),
            "uuid": block.get("GPU UUID"),
            "bus_id": key[4:],
            "memory_total_mib": _mib(block.get("FB Memory Usage", {}).get("Total")),
            "persistence_mode": _enabled(block.get("Persistence Mode")),
            "ecc_mode": _enabled(ecc.get("Current") if isinstance(ecc, dict) else None),
        })
    return {"driver_version": tree.get("Driver Version"), "cuda_version": tree.get("CUDA Version"),
            "gpus": gpus}


NVRM = re.compile(r"NVRM version:.*?(?:Kernel Module|x86_64|aarch64)\s+(\d+\.\d+(?:\.\d+)?)\s")


def parse_nvrm(text: str) -> dict | None:
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


def parse_services(text: str) -> dict[str, dict]:
    """Units from `systemctl show -p Id,LoadState,UnitFileState,ActiveState UNIT...` (blank-line separated)."""
    services = {}
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
    """A managed file's content (None when absent)."""
    status, _, payload = text.partition("\n")
    if status.strip() != "present":
        return None
    return base64.b64decode(payload.replace("\n", "")).decode(errors="replace")


def _with_rc(text: str) -> tuple[list[str], int | None]:
    """A section's lines and the `@@rc=N` its command ended with (None: the tool is missing)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[-1].startswith("@@rc="):
        return lines, None
    return lines[:-1], int(lines[-1][5:]) if lines[-1][5:].isdigit() else None


def parse_gpu_processes(text: str) -> list[dict] | None:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits` lines;
    None when nvidia-smi is missing or cannot answer."""
    lines, rc = _with_rc(text)
    if rc != 0:
        return None
    processes = []
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 3:
            continue
        pid, memory = fields[0], fields[-1]
        processes.append({"pid": int(pid) if pid.isdigit() else pid, "process_name": ",".join(fields[1:-1]),
                          "used_memory_mib": int(memory) if memory.isdigit() else None})
    return processes


def parse_containers(text: str) -> list[dict] | None:
    """Running containers from `docker ps --format ID\tNAME\tIMAGE`; None when Docker cannot be asked."""
    lines, rc = _with_rc(text)
    if rc != 0:
        return None
    return [dict(zip(("id", "name", "image"), line.split("\t", 2), strict=False)) for line in lines]


def parse_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_device_users(text: str) -> list[dict]:
    """Processes with a /dev/nvidiaN open: `PID COMM` lines."""
    users = []
    for line in parse_lines(text):
        pid, _, comm = line.partition(" ")
        if pid.isdigit():
            users.append({"pid": int(pid), "process_name": comm})
    return users


def parse_slurm(text: str) -> list[str] | None:
    """Slurm jobs on this node (`squeue -h -w NODE -o '%i %u %j'`); None without Slurm or when it fails."""
    lines, rc = _with_rc(text)
    return None if rc != 0 else lines


def parse_facts(host: str, output: str) -> dict:
    """All facts of one host from the facts script's whole output (schema in docs/design.md)."""
    sec = split_sections(output)
    uname = sec.get("uname", "").splitlines()
    meminfo = re.search(r"(\d+)", sec.get("meminfo", ""))
    gpus, nvswitch_count = parse_lspci(sec.get("lspci", ""))
    nvrm = parse_nvrm(sec.get("nvrm", ""))
    smi = parse_nvidia_smi(sec.get("nvidia-smi", ""))
    modules = set(sec.get("modules", "").split())
    packages, held = parse_packages(sec.get("packages", ""))
    services = parse_services(sec.get("services", ""))
    files = {name[5:]: parse_file(body) for name, body in sec.items() if name.startswith("file ")}
    daemon_json = _json_or_none(files.get("/etc/docker/daemon.json"))
    docker_version = first_version(sec.get("docker", ""))
    fm_service = services.get("nvidia-fabricmanager", {})
    fm_version = first_version(sec.get("fabricmanager", ""))
    dcgm_version = first_version(sec.get("dcgm", ""))
    cloud = re.search(r"status:\s*(\S+)", sec.get("cloud-init", ""))
    return {
        "host": host,
        "os": parse_os_release(sec.get("os-release", "")),
        "kernel": uname[0] if uname else None,
        "arch": uname[1] if len(uname) > 1 else None,
        "cpus": int(sec["cpus"]) if sec.get("cpus", "").strip().isdigit() else None,
        "mem_total_mib": int(meminfo.group(1)) // 1024 if meminfo else None,
        "pci_gpus": gpus,
        "nvswitch_count": nvswitch_count,
        "nvidia_smi": smi,
        "loaded_driver_version": _loaded_driver(nvrm, smi),
        "loaded_driver_open": nvrm["open"] if nvrm else None,
        "nvidia_modules_loaded": sorted(modules - {"nouveau"}),
        "packages": packages,
        "held": held,
        "nouveau_loaded": "nouveau" in modules,
        "nouveau_blacklisted": bool(sec.get("nouveau-blacklist", "").strip()),
        "secure_boot": parse_secure_boot(sec.get("secure-boot", "")),
        "kernel_headers": sec.get("kernel-headers", "").strip() == "yes",
        "docker": None if docker_version is None else {
            "version": docker_version,
            "active": services.get("docker", {}).get("active", False),
            "daemon_json": daemon_json,
            "runtimes": sorted((daemon_json or {}).get("runtimes", {})),
            "live_runtimes": _json_keys(sec.get("docker-runtimes", "")),
            "ctk_daemon_json": parse_file("present\n" + sec["ctk-daemon-json"])
            if sec.get("ctk-daemon-json", "").strip() else None,
        },
        "container_toolkit": first_version(sec.get("ctk", "")),
        "fabricmanager": None if not (fm_version or fm_service.get("exists")) else {
            "version": fm_version, "active": fm_service.get("active", False),
            "enabled": fm_service.get("enabled", False)},
        "dcgm": None if dcgm_version is None else {
            "version": dcgm_version, "active": services.get("nvidia-dcgm", {}).get("active", False)},
        "persistenced": None if not services.get("nvidia-persistenced", {}).get("exists") else {
            "active": services["nvidia-persistenced"]["active"],
            "enabled": services["nvidia-persistenced"]["enabled"]},
        "services": services,
        "reboot_required": sec.get("reboot-required", "").strip() == "yes",
        "reboot_required_pkgs": parse_lines(sec.get("reboot-required-pkgs", "")),
        "gpuprov_reboot_pending": parse_lines(sec.get("gpuprov-reboot-pending", "")),
        "gpu_processes": parse_gpu_processes(sec.get("gpu-processes", "")),
        "gpu_device_users": parse_device_users(sec.get("device-users", "")),
        "containers": parse_containers(sec.get("containers", "")),
        "slurm_jobs": parse_slurm(sec.get("slurm", "")),
        "dkms_status": parse_lines(sec["dkms"]) if sec.get("dkms", "").strip() else None,
        "kernels_installed": parse_lines(sec.get("kernels", "")),
        "dpkg_interrupted": bool(sec.get("dpkg-interrupted", "").strip()),
        "package_manager_busy": [line for line in sec.get("package-manager-busy", "").splitlines() if line],
        "cloud_init": cloud.group(1) if cloud else None,
        "disk_free_mib": parse_disk(sec.get("disk", "")),
        "files": files,
        "gathered_at": sec.get("date", "").strip() or None,
        "complete": "end" in sec,
    }


def _loaded_driver(nvrm: dict | None, smi: dict | None) -> str | None:
    """The loaded module's version: /proc/driver/nvidia/version, else what a working nvidia-smi reports
    (NVML answers only when the loaded module and the library match)."""
    if nvrm:
        return nvrm["version"]
    if smi and not smi.get("error"):
        return smi.get("driver_version")
    return None


def _json_keys(text: str) -> list[str] | None:
    """Sorted keys of a JSON object (`docker info --format '{{json .Runtimes}}'`); None when unreadable."""
    value = _json_or_none(text.strip())
    return sorted(value) if isinstance(value, dict) else None


def _json_or_none(text: str | None):
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
