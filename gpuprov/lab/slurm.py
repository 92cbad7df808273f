"""A real Slurm cluster in the lab (`invoke lab.up --slurm`): Debian bookworm's slurm-wlm 22.05 and munge, installed
with apt from the lab mirror; slurmctld on a lab host without GPUs (profile `slurm-controller`), slurmd on every GPU
host, whose simulated GPUs are its gres (`Gres=gpu:<type>:<count>`, one /dev/nvidiaN node each), all GPU hosts in
one partition (`gpu`, the inventory group of the same name).

The packages (gpuprov.lab.debian.SLURM_PACKAGES and what a bare host lacks for them) are downloaded only when asked,
and served as a flat repository of their own at `<mirror>/slurm/`, signed with the mirror's key; the mirror's own
repository and a lab without Slurm are unchanged. One munge key per lab is made on this machine
(`.lab/slurm/munge.key`, 0600) and installed on every node (owner munge, 0400).

What Slurm needs in a lab container: slurmd `-b` (report the boot time as its start time) and ReturnToService=2,
so that a rebooted host re-registers by itself, a drained one keeping its state and reason; proctrack/linuxproc and
task/none (no cgroup confinement), `IgnoreSystemd=yes` in cgroup.conf (the cgroup plugin is always loaded); gres.conf
lines with `File=` (AutoDetect=off). Hosts keep their names as NodeName and their internal IP as NodeAddr.

    ensure_slurm(state, client) -> SlurmCluster     install, configure and start it (a second run changes nothing)
    cluster_of(state) -> SlurmCluster               the cluster the lab's hosts make (no engine needed)
    run_on_controller(state, argv) -> stdout         a command on the controller host
    submit_job(state, node, seconds) -> job id       `sbatch --wrap 'sleep N'` on that node
    job_state(state, job_id) -> str                  PENDING, RUNNING, COMPLETED, ...
    node_state(state, node) -> (state, reason)       sinfo's long state (idle, drained, ...) and the reason
    render_slurm_conf / render_gres_conf             the configuration files (pure)
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import ipaddress
import os
import re
import shlex
import shutil
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.lab.state import SLURM_CONTROLLER_PROFILE, SLURM_PARTITION, LabHost, LabPaths, LabState

CLUSTER_NAME = "gpuprov-lab"
MIRROR_SUBDIR = "slurm"
# apt reads this list only when the lab installs Slurm (-o Dir::Etc::SourceList=...): kept out of
# sources.list.d, where provisioning would find a second source on the mirror's address (preflight's
# duplicate_source) and every apt-get update would read it
SOURCE_LIST = "/etc/gpuprov-lab/slurm-sources.list"
KEYRING = "/etc/apt/keyrings/gpuprov-lab-slurm.asc"
DIGEST_FILE = "/etc/gpuprov-lab/slurm.digest"
STAGED_MUNGE_KEY = "/etc/gpuprov-lab/munge.key"
DEVICES_UNIT = "gpuprov-lab-nvidia-devices.service"
NVIDIA_MAJOR = 195
READY_TIMEOUT_S = int(os.environ.get("GPUPROV_LAB_SLURM_TIMEOUT", "180"))
# slurmd -b: report the boot time as the start time (a container's "boot" is its start); the controller waits this
# long for a rebooted node (`scontrol reboot`) to come back
SLURMD_OPTIONS = "-b"
RESUME_TIMEOUT_S = 600
RELEASE_DIR = "/run/gpuprov-lab-release"   # submit_job(release=True): a job ends once its id's file is here
MIN_JOB_AGE_S = 3600     # finished jobs stay visible to `scontrol show job` (job_state) this long
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_GRES_TYPE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_JOB_ID = re.compile(r"^[0-9]+$")
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    """A progress sink that shows nothing."""


@dataclass(frozen=True)
class SlurmNode:
    """A host of the cluster: its name (Slurm's NodeName, the inventory's host name), internal IP, CPUs and GPUs."""

    name: str
    addr: str
    gpu_type: str = ""
    gpus: int = 0
    cpus: int = 1


@dataclass(frozen=True)
class SlurmCluster:
    """The controller and the compute nodes (all in `partition`)."""

    controller: SlurmNode
    nodes: tuple[SlurmNode, ...]
    partition: str = SLURM_PARTITION


def check_name(name: str) -> str:
    """`name` when it is a host name Slurm and a shell take literally; InputError otherwise."""
    if not _NAME.match(name):
        raise InputError(f"{name!r} cannot be a Slurm node name (lowercase letters, digits and '-')", step="lab slurm")
    return name


def gres_type(gpu_model: str) -> str:
    """The gres type of a catalog GPU model: the model's name in lowercase (`H100-SXM` -> `h100-sxm`)."""
    kind = str(gpu_model).lower()
    if not _GRES_TYPE.match(kind):
        raise InputError(f"GPU model {gpu_model!r} cannot be a gres type", step="lab slurm")
    return kind


def _addr(value: str | None, name: str) -> str:
    try:
        return str(ipaddress.IPv4Address(value or ""))
    except ValueError:
        raise GpuprovError(f"{name} has no internal IP on the lab network", host=name, step="lab slurm",
                           hint="`invoke lab.down`, then `invoke lab.up --slurm`") from None


def controller_profile():
    """The Profile of the controller host: profiles.yaml's `service_profiles.slurm-controller`, with the devices
    every lab host has and no GPUs (its `hardware` is empty)."""
    from gpuprov.lab.profiles import load_document, parse_profiles

    document = load_document()
    spec = (document.get("service_profiles") or {}).get(SLURM_CONTROLLER_PROFILE) or {}
    probe = {SLURM_CONTROLLER_PROFILE: {"description": spec.get("description", ""),
                                        "hardware": {"gpu": None, "count": 0, "nvswitch": False}}}
    profile = parse_profiles({**document, "profiles": probe, "default_mix": []})[SLURM_CONTROLLER_PROFILE]
    return dataclasses.replace(profile, hardware={})


def cluster_of(state: LabState, cpus: dict[str, int] | None = None) -> SlurmCluster:
    """The cluster the lab's hosts make: the slurm-controller host and every GPU host (`cpus`: each node's CPU
    count, 1 where not given)."""
    controllers = [h for h in state.hosts if h.profile == SLURM_CONTROLLER_PROFILE]
    if len(controllers) != 1:
        raise GpuprovError(f"the lab has {len(controllers)} Slurm controller hosts, not one", step="lab slurm",
                           hint="run `invoke lab.up --slurm`")
    ctl = controllers[0]
    nodes = tuple(SlurmNode(check_name(h.name), _addr(h.internal_ip, h.name), gres_type(h.hardware["gpu"]),
                            int(h.hardware["count"]), (cpus or {}).get(h.name, 1))
                  for h in state.hosts if h is not ctl)
    if not nodes:
        raise GpuprovError("the lab has no GPU host for slurmd", step="lab slurm", hint="use --hosts 1 or more")
    return SlurmCluster(SlurmNode(check_name(ctl.name), _addr(ctl.internal_ip, ctl.name)), nodes)


# ------------------------------------------------------------------------------------------ configuration

def render_slurm_conf(cluster: SlurmCluster) -> str:
    """slurm.conf for the cluster (every name and address checked by cluster_of)."""
    ctl = cluster.controller
    lines = [
        "# Written by `invoke lab.up --slurm` (gpuprov.lab.slurm); the next lab.up rewrites it.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={ctl.name}({ctl.addr})",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "GresTypes=gpu",
        "ReturnToService=2",
        f"ResumeTimeout={RESUME_TIMEOUT_S}",
        'RebootProgram="/usr/bin/systemctl reboot"',
        f"MinJobAge={MIN_JOB_AGE_S}",
        "SchedulerType=sched/backfill",
        "SlurmUser=slurm",
        "SlurmdUser=root",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
    ]
    lines += [f"NodeName={n.name} NodeAddr={n.addr} CPUs={n.cpus} Gres=gpu:{n.gpu_type}:{n.gpus} State=UNKNOWN"
              for n in cluster.nodes]
    lines.append(f"PartitionName={cluster.partition} Nodes={','.join(n.name for n in cluster.nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def device_files(count: int) -> str:
    """The `File=` of `count` GPUs: /dev/nvidia0 for one, /dev/nvidia[0-N] for more (Slurm's hostlist range)."""
    return "/dev/nvidia0" if count == 1 else f"/dev/nvidia[0-{count - 1}]"


def render_gres_conf(cluster: SlurmCluster) -> str:
    """gres.conf: one line per node with the GPUs' type and device files (no autodetection)."""
    lines = ["# Written by `invoke lab.up --slurm` (gpuprov.lab.slurm).", "AutoDetect=off"]
    lines += [f"NodeName={n.name} Name=gpu Type={n.gpu_type} File={device_files(n.gpus)}"
              for n in cluster.nodes if n.gpus]
    return "\n".join(lines) + "\n"


CGROUP_CONF = ("# Written by `invoke lab.up --slurm`: lab hosts are containers in the host's cgroup tree.\n"
               "IgnoreSystemd=yes\n")


def devices_unit(count: int) -> str:
    """A boot-time unit that makes /dev/nvidia0..count-1 (a container's /dev is new at every start)."""
    make = "; ".join(f"[ -e /dev/nvidia{i} ] || mknod -m 0666 /dev/nvidia{i} c {NVIDIA_MAJOR} {i}"
                     for i in range(count))
    return ("[Unit]\nDescription=gpuprov lab: device nodes of the simulated GPUs (Slurm's gres files)\n"
            "Before=slurmd.service\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
            f"ExecStart=/bin/sh -c {shlex.quote(make)}\n\n[Install]\nWantedBy=multi-user.target\n")


def host_files(cluster: SlurmCluster, node: SlurmNode, source: str, key: str, munge_key: bytes) -> dict[str, tuple]:
    """{path: (content, mode)} of what `node` gets (the controller when it is cluster.controller)."""
    files: dict[str, tuple] = {
        SOURCE_LIST: (f"deb [signed-by={KEYRING}] {source} /\n".encode(), 0o644),
        KEYRING: (key.encode(), 0o644),
        "/etc/slurm/slurm.conf": (render_slurm_conf(cluster).encode(), 0o644),
        "/etc/slurm/gres.conf": (render_gres_conf(cluster).encode(), 0o644),
        "/etc/slurm/cgroup.conf": (CGROUP_CONF.encode(), 0o644),
        STAGED_MUNGE_KEY: (munge_key, 0o400),
    }
    if node != cluster.controller:
        files["/etc/default/slurmd"] = (f'SLURMD_OPTIONS="{SLURMD_OPTIONS}"\n'.encode(), 0o644)
        files[f"/etc/systemd/system/{DEVICES_UNIT}"] = (devices_unit(node.gpus).encode(), 0o644)
    return files


def files_digest(files: dict[str, tuple]) -> str:
    text = hashlib.sha256()
    for path in sorted(files):
        content, mode = files[path]
        text.update(f"{path}\0{mode:o}\0".encode() + hashlib.sha256(content).digest())
    return text.hexdigest()[:16]


def _tar(files: dict[str, tuple]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        dirs = sorted({str(Path(p).parent).lstrip("/") for p in files})
        for name in dirs:
            for depth in range(1, name.count("/") + 2):
                part = "/".join(name.split("/")[:depth])
                if part not in tar.getnames():
                    info = tarfile.TarInfo(part)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(content), mode, int(time.time())
            tar.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return buffer


def setup_script(packages: tuple[str, ...], services: tuple[str, ...], digest: str) -> str:
    """The shell script that installs the packages when missing, installs the munge key and (re)starts `services`."""
    names = " ".join(shlex.quote(p) for p in packages)
    units = " ".join(shlex.quote(s) for s in services)
    return f"""set -e
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
installed=$(dpkg-query -W -f='${{db:Status-Abbrev}}\n' {names} 2>/dev/null | grep -c '^ii' || true)
source="-o Dir::Etc::SourceList={SOURCE_LIST} -o Dir::Etc::SourceParts=- -o APT::Get::List-Cleanup=0"
if [ "$installed" != {len(packages)} ]; then
  apt-get -q update $source
  apt-get -q install -y --no-install-recommends -o Dpkg::Options::=--force-confold $source {names}
fi
install -o munge -g munge -m 0400 {STAGED_MUNGE_KEY} /etc/munge/munge.key
mkdir -p /var/log/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
chown slurm:slurm /var/log/slurm /var/lib/slurm/slurmctld
systemctl daemon-reload
systemctl enable -q {units}
systemctl restart {units}
echo {shlex.quote(digest)} > {DIGEST_FILE}
"""


# ------------------------------------------------------------------------------------------------ packages

def slurm_dir(paths: LabPaths) -> Path:
    return paths.state_dir / "slurm"


def ensure_munge_key(paths: LabPaths) -> bytes:
    """The lab's munge key (1024 random bytes, made once, mode 0600)."""
    path = slurm_dir(paths) / "munge.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(1024))
    path.chmod(0o600)
    return path.read_bytes()


def build_slurm_repo(paths: LabPaths, client, progress: Progress = _quiet) -> Path:
    """The signed flat repository of the Slurm packages under .lab/slurm/repo/<digest> (built once)."""
    from gpuprov.lab.debian import SLURM_PACKAGES, ensure_debian_debs
    from gpuprov.lab.images import _image_exists, base_tag
    from gpuprov.lab.mirror import _link, _write_index, ensure_key, ensure_tools, machine_arch

    if not _image_exists(client, base_tag()):
        raise GpuprovError("the lab base image is missing", step="lab slurm", hint="run `invoke lab.up --slurm`")
    debs = ensure_debian_debs(paths, client, base_tag(), names=SLURM_PACKAGES, progress=progress)
    ensure_tools(progress)
    fpr = ensure_key(paths, progress)
    digest = hashlib.sha256(f"{debs.digest()}:{fpr}".encode()).hexdigest()[:16]
    root = slurm_dir(paths) / "repo"
    repo = root / digest
    if (repo / "InRelease").exists():
        return repo
    work = root / f".build-{digest}"
    shutil.rmtree(work, ignore_errors=True)
    targets = []
    for deb in debs.debs:
        target = work / "pool" / deb.path.name
        _link(deb.path, target)
        targets.append(target)
    _write_index(paths, fpr, work, targets, machine_arch(), "gpuprov lab mirror: Debian's Slurm and munge")
    work.rename(repo)
    progress(f"slurm: signed repository {digest} of {len(targets)} Debian packages")
    return repo


def serve_repo(client, repo: Path, progress: Progress = _quiet) -> str:
    """Put the repository into the lab mirror at /slurm/ (unless it serves it already). Returns its URL."""
    from gpuprov.lab.engine import find_lab_container
    from gpuprov.lab.labels import NETWORK
    from gpuprov.lab.mirror import MIRROR_NAME, SERVE_DIR, _ip, repo_tar

    mirror = find_lab_container(client, MIRROR_NAME, "lab mirror")
    if mirror is None or mirror.status != "running":
        raise GpuprovError("the lab mirror is not running", step="lab slurm", hint="run `invoke lab.up --slurm`")
    marker = repo / "digest"
    if not marker.exists():
        marker.write_text(repo.name + "\n", encoding="utf-8")
    served = mirror.exec_run(["cat", f"{SERVE_DIR}/{MIRROR_SUBDIR}/digest"]).output.decode(errors="replace").strip()
    if served != repo.name:
        if not mirror.put_archive(SERVE_DIR, repo_tar(repo, MIRROR_SUBDIR)):
            raise GpuprovError("cannot copy the Slurm repository into the lab mirror", step="lab slurm",
                               hint="`invoke lab.down`, then `invoke lab.up --slurm`")
        progress(f"slurm: the mirror serves the Slurm packages at /{MIRROR_SUBDIR}/")
    return f"http://{_ip(mirror, NETWORK)}/{MIRROR_SUBDIR}/"


# ---------------------------------------------------------------------------------------------- the hosts

def _exec(client, host: LabHost, argv: list[str], step: str) -> str:
    container = client.containers.get(host.container_id)
    result = container.exec_run(argv)
    output = result.output.decode(errors="replace")
    if result.exit_code != 0:
        raise GpuprovError(f"`{shlex.join(argv[:3])}` failed with exit code {result.exit_code}", host=host.name,
                           step=step, command=shlex.join(argv), output=output,
                           hint="read the output above; `invoke lab.up --slurm` again retries")
    return output


def _setup_host(client, host: LabHost, files: dict[str, tuple], packages: tuple[str, ...],
                services: tuple[str, ...], progress: Progress) -> bool:
    """Bring one host to `files` and running `services`; False when it already was."""
    digest = files_digest(files)
    check = (f"[ \"$(cat {DIGEST_FILE} 2>/dev/null)\" = {shlex.quote(digest)} ] && "
             f"systemctl is-active -q {' '.join(shlex.quote(s) for s in services)}")
    container = client.containers.get(host.container_id)
    if container.exec_run(["sh", "-c", check]).exit_code == 0:
        return False
    if not container.put_archive("/", _tar(files)):
        raise GpuprovError("cannot copy the Slurm configuration into the host", host=host.name, step="lab slurm")
    started = time.monotonic()
    _exec(client, host, ["sh", "-c", setup_script(packages, services, digest)], "lab slurm: install and start")
    progress(f"slurm: {host.name}: {', '.join(services)} configured and started in "
             f"{time.monotonic() - started:.0f} s")
    return True


def _cpus(client, host: LabHost) -> int:
    return int(_exec(client, host, ["nproc"], "lab slurm: nproc").strip())


def ensure_slurm(state: LabState, client, progress: Progress = _quiet) -> SlurmCluster:
    """Install, configure and start Slurm on the lab's hosts and wait until every node answers."""
    from gpuprov.lab.debian import SLURM_PACKAGES

    started = time.monotonic()
    cpus = {h.name: _cpus(client, h) for h in state.hosts if h.profile != SLURM_CONTROLLER_PROFILE}
    cluster = cluster_of(state, cpus)
    url = serve_repo(client, build_slurm_repo(state.paths, client, progress), progress)
    key = (state.paths.state_dir / "mirror-key.asc").read_text(encoding="utf-8")
    munge_key = ensure_munge_key(state.paths)
    ctl_pkgs = tuple(p for p in SLURM_PACKAGES if p != "slurmd")
    node_pkgs = tuple(p for p in SLURM_PACKAGES if p != "slurmctld")
    jobs = [(state.host(cluster.controller.name), host_files(cluster, cluster.controller, url, key, munge_key),
             ctl_pkgs, ("munge", "slurmctld"))]
    jobs += [(state.host(n.name), host_files(cluster, n, url, key, munge_key), node_pkgs,
              ("munge", DEVICES_UNIT, "slurmd")) for n in cluster.nodes]
    with ThreadPoolExecutor(max_workers=8) as pool:
        changed = list(pool.map(lambda job: _setup_host(client, *job, progress), jobs))
    wait_nodes(state, cluster, time.monotonic() + READY_TIMEOUT_S)
    word = "configured" if any(changed) else "unchanged"
    progress(f"slurm: cluster {word}, {len(cluster.nodes)} nodes answer in partition {cluster.partition} "
             f"({time.monotonic() - started:.0f} s)")
    return cluster


def wait_nodes(state: LabState, cluster: SlurmCluster, deadline: float) -> None:
    """Block until every node answers the controller (any state but down/unknown/not responding)."""
    seen = ""
    while time.monotonic() < deadline:
        try:
            seen = run_on_controller(state, ["sinfo", "-N", "-h", "-o", "%N %t"])
        except GpuprovError as exc:
            seen = exc.output or str(exc)
        states = dict(line.split(None, 1) for line in seen.splitlines() if len(line.split()) == 2)
        if all(n.name in states and not states[n.name].endswith("*")
               and not states[n.name].startswith(("down", "unk", "fail", "npc"))
               for n in cluster.nodes):
            return
        time.sleep(1)
    raise GpuprovError(f"the Slurm nodes do not all answer the controller: {seen.strip() or 'no answer'}",
                       host=cluster.controller.name, step="lab slurm", command="sinfo -N",
                       hint="look at /var/log/slurm/*.log on the controller and the nodes")


# --------------------------------------------------------------------------------------------- using it

def run_on_controller(state: LabState, argv: list[str]) -> str:
    """Run `argv` (no shell) on the Slurm controller host; its stdout. GpuprovError when it fails."""
    import docker

    ctl = next((h for h in state.hosts if h.profile == SLURM_CONTROLLER_PROFILE), None)
    if ctl is None:
        raise GpuprovError("the lab has no Slurm controller", step="lab slurm", hint="run `invoke lab.up --slurm`")
    container = docker.from_env().containers.get(ctl.container_id)
    result = container.exec_run(argv, demux=True)
    out, err = (part.decode(errors="replace") if part else "" for part in result.output)
    if result.exit_code != 0:
        raise GpuprovError(f"`{argv[0]}` failed with exit code {result.exit_code}", host=ctl.name, step="lab slurm",
                           command=shlex.join(argv), output=out + err, hint="read the output above")
    return out


def submit_job(state: LabState, node: str, seconds: int, *, name: str = "gpuprov-lab",
               partition: str = SLURM_PARTITION, release: bool = False) -> int:
    """Submit a batch job on `node` that runs SECONDS (`release`: until `release_job` ends it, at most SECONDS;
    either way it ends by itself, exit 0), with a time limit a minute or two above it (as a real job has one:
    squeue's time left means something); the job id."""
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 0:
        raise InputError(f"seconds must be a whole number of seconds, got {seconds!r}", step="lab slurm")
    work = (f"for i in $(seq {seconds}); do [ -e {RELEASE_DIR}/$SLURM_JOB_ID ] && exit 0; sleep 1; done"
            if release else f"sleep {seconds}")
    out = run_on_controller(state, ["sbatch", "--parsable", "-p", partition, "-w", check_name(node), "-J", name,
                                    f"--time={seconds // 60 + 2}", "-o", "/dev/null", "--wrap", work])
    job = out.strip().split(";")[0]
    if not _JOB_ID.match(job):
        raise GpuprovError(f"sbatch answered {out.strip()!r}, not a job id", step="lab slurm", command="sbatch")
    return int(job)


def release_job(state: LabState, node: str, job_id: int) -> None:
    """End a job submitted with `release=True` on `node`: it finishes by itself (COMPLETED), nothing is killed."""
    import docker

    host = next((h for h in state.hosts if h.name == check_name(node)), None)
    if host is None:
        raise InputError(f"no lab host {node!r}", step="lab slurm", hint="name one of: "
                         + ", ".join(h.name for h in state.hosts))
    _exec(docker.from_env(), host, ["sh", "-c", f"mkdir -p {RELEASE_DIR} && touch {RELEASE_DIR}/{int(job_id)}"],
          "lab slurm: release a job")


def job_state(state: LabState, job_id: int) -> str:
    """The job's state as Slurm names it (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...)."""
    out = run_on_controller(state, ["scontrol", "-o", "show", "job", str(int(job_id))])
    found = re.search(r"(?:^|\s)JobState=(\S+)", out)
    if not found:
        raise GpuprovError(f"scontrol shows no JobState for job {job_id}", step="lab slurm", output=out)
    return found.group(1)


def node_state(state: LabState, node: str) -> tuple[str, str]:
    """(sinfo's long state of `node`, e.g. idle, drained, draining, down; its reason, "" for none)."""
    out = run_on_controller(state, ["sinfo", "-h", "-N", "-n", check_name(node), "-o", "%T|%E"]).strip()
    long_state, _, reason = out.partition("|")
    return long_state, "" if reason == "none" else reason
