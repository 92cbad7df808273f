"""Running work on a host: what a disruptive step (driver change, reboot, fabric manager or Docker restart)
would interrupt. Read from facts before the plan runs, and checked again on the host right before each
disruptive step, so a job that started in between is not killed either.
"""

from __future__ import annotations

import shlex

# Daemons that keep GPU devices open on every healthy host; they are not work. Also as /proc/PID/comm shows
# them: the kernel cuts a process name to 15 characters (nvidia-persistenced -> nvidia-persiste).
GPU_DAEMONS = frozenset(name for daemon in ("nvidia-persistenced", "nv-hostengine", "nv-fabricmanager", "nvidia-smi",
                                            "nvidia-powerd", "dcgm-exporter", "nvidia-cuda-mps-server")
                        for name in (daemon, daemon[:15]))
# gpuprov's own monitoring container (gpuprov.monitoring.exporters.CONTAINER): not work, and it restarts by itself.
INFRA_CONTAINERS = frozenset({"gpuprov-dcgm-exporter"})
# What each kind of disruption interrupts: a Docker restart only stops containers.
CONTAINERS_ONLY = frozenset({"Docker restart"})
REFUSED_RC = 75  # EX_TEMPFAIL: the step was refused because work runs there; rerun when the host is idle
REFUSED_MARK = "@@gpuprov:refused"
DISRUPT_FLAG = "--disrupt"


def running_work(facts: dict, containers_only: bool = False) -> list[str]:
    """One line per thing running on the host that a disruptive step would interrupt."""
    work: list[str] = []
    if not containers_only:
        processes = facts.get("gpu_processes")
        if processes is None:  # NVML cannot answer (no driver, or a driver/library mismatch)
            processes = [user for user in facts.get("gpu_device_users") or []
                         if user.get("process_name") not in GPU_DAEMONS]
        for proc in processes:
            memory = proc.get("used_memory_mib")
            work.append(f"GPU process {proc.get('pid')} {proc.get('process_name')}"
                        + (f" ({memory} MiB)" if memory is not None else ""))
    containers = facts.get("containers")
    if containers is None and (facts.get("docker") or {}).get("active"):
        work.append("containers unknown: `docker ps` did not answer")
    for container in containers or []:
        if container.get("name") in INFRA_CONTAINERS:
            continue
        work.append(f"container {container.get('name')} ({container.get('image')})")
    if not containers_only:
        work += [f"Slurm job {job}" for job in facts.get("slurm_jobs") or []]
    return work


def work_for(disruption: str, facts: dict) -> list[str]:
    """The running work a given disruption would interrupt."""
    return running_work(facts, containers_only=disruption in CONTAINERS_ONLY)


def guard(disruption: str) -> str:
    """Shell lines that refuse the step (exit REFUSED_RC, naming what runs) when work runs on the host now."""
    # a Docker that does not answer is not taken for one without containers
    containers = ("if command -v docker >/dev/null 2>&1; then "
                  "if c=$(timeout 20 docker ps --format 'container {{.Names}} ({{.Image}})'); then "
                  "printf '%s\\n' \"$c\" | sed '/^$/d' | grep -Ev " + shlex.quote(
                      "^container (" + "|".join(sorted(INFRA_CONTAINERS)) + ") ") + "; "
                  "elif systemctl is-active -q docker; then "
                  "echo 'containers unknown: `docker ps` did not answer'; fi; fi")
    checks = [containers]
    if disruption not in CONTAINERS_ONLY:
        daemons = "|".join(sorted(GPU_DAEMONS))
        checks = [
            "if command -v nvidia-smi >/dev/null 2>&1 && p=$(timeout 30 nvidia-smi --query-compute-apps="
            "pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null); then "
            "printf '%s\\n' \"$p\" | sed '/^$/d; s/^/GPU process /'; "
            "elif [ -d /proc/driver/nvidia ]; then "
            "find /proc/[0-9]*/fd -maxdepth 1 -lname '/dev/nvidia[0-9]*' 2>/dev/null | cut -d/ -f3 | sort -un | "
            "while read -r pid; do echo \"GPU process $pid $(cat /proc/$pid/comm 2>/dev/null)\"; done | "
            f"grep -Ev {shlex.quote(' (' + daemons + ')$')}; fi",
            containers,
            "command -v squeue >/dev/null 2>&1 && timeout 20 squeue -h -w \"$(hostname -s)\" -o 'Slurm job %i %u %j'",
        ]
    body = "; ".join(f"{{ {check}; }} 2>/dev/null || true" for check in checks)
    message = f"refused {disruption}: work runs on this host (rerun with {DISRUPT_FLAG} to interrupt it):"
    return (f"work=$({body}); if [ -n \"$work\" ]; then echo {shlex.quote(REFUSED_MARK + ' ' + message)}; "
            f"printf '%s\\n' \"$work\"; exit {REFUSED_RC}; fi")
