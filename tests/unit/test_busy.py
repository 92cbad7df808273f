"""Running work refuses disruptive steps: from facts at plan time, and on the host right before the step."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuprov.core.apply import batch_script, parse_steps
from gpuprov.core.busy import REFUSED_RC, guard, running_work
from gpuprov.provision.ops import Change
from gpuprov.provision.run import Options, ProvisionRecord, _decide_reboot, _split_refused

IDLE = {"os": {"family": "debian"}, "gpu_processes": [], "gpu_device_users": [], "containers": [],
        "slurm_jobs": None, "docker": {"active": True}}


def test_idle_host_runs_nothing():
    assert running_work(IDLE) == []


def test_gpu_processes_containers_and_slurm_jobs_are_listed():
    facts = IDLE | {"gpu_processes": [{"pid": 4242, "process_name": "python", "used_memory_mib": 40960}],
                    "containers": [{"id": "3f2a", "name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}],
                    "slurm_jobs": ["1234 alice train"]}
    assert running_work(facts) == ["GPU process 4242 python (40960 MiB)",
                                   "container trainer (nvcr.io/nvidia/pytorch:25.01-py3)", "Slurm job 1234 alice train"]
    assert running_work(facts, containers_only=True) == ["container trainer (nvcr.io/nvidia/pytorch:25.01-py3)"]


def test_when_nvml_cannot_answer_device_users_count_but_gpu_daemons_do_not():
    facts = IDLE | {"gpu_processes": None, "gpu_device_users": [
        {"pid": 900, "process_name": "nvidia-persistenced"}, {"pid": 4242, "process_name": "python3"}]}
    assert running_work(facts) == ["GPU process 4242 python3"]


def test_docker_that_cannot_list_containers_is_not_taken_for_idle():
    assert running_work(IDLE | {"containers": None}) == ["containers unknown: `docker ps` did not answer"]


DRIVER = Change("driver", "install nvidia-open-570", ("echo driver-installed",), reboot=True,
                disruptive="driver change")
DOCKER = Change("container_toolkit", "restart Docker", ("echo docker-restarted",), disruptive="Docker restart")
PINS = Change("pins", "hold", ("echo held",))


def test_plan_time_refusal_keeps_the_rest_of_the_plan():
    busy = IDLE | {"gpu_processes": [{"pid": 1, "process_name": "python", "used_memory_mib": 1}]}
    allowed, refused = _split_refused([DRIVER, DOCKER, PINS], busy, disrupt=False)
    assert allowed == [DOCKER, PINS] and list(refused) == [DRIVER]
    assert _split_refused([DRIVER, DOCKER, PINS], busy, disrupt=True) == ([DRIVER, DOCKER, PINS], {})


def test_what_completes_a_refused_change_waits_with_it_and_the_index_refresh_stays():
    refresh = "DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef " \
              "-o Dpkg::Options::=--force-confold -q update"
    driver = Change("driver", "install nvidia-open-570", (refresh, "apt-get install nvidia-open-570"), reboot=True,
                    disruptive="driver change")
    cdi = Change("container_toolkit", "generate the CDI spec if it already answers", ("true",), requires="driver")
    cuda = Change("cuda", "install cuda-toolkit-12-8", ("apt-get install cuda-toolkit-12-8",))
    busy = IDLE | {"slurm_jobs": ["77 bob train"]}
    allowed, refused = _split_refused([driver, cdi, cuda], busy, disrupt=False)
    assert refused == {driver: ["Slurm job 77 bob train"], cdi: ["Slurm job 77 bob train"]}
    assert [c.commands for c in allowed] == [(refresh,), cuda.commands]


@pytest.fixture
def tools(tmp_path: Path):
    """Stand-in nvidia-smi, docker and squeue on PATH answering from files the test writes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "docker", "squeue"):
        script = bin_dir / tool
        script.write_text(f"#!/bin/sh\ncat {tmp_path}/{tool}.out 2>/dev/null\n")
        script.chmod(0o755)
    return tmp_path


def run_batch(tools: Path, changes: list, disrupt: bool = False) -> tuple[int, list]:
    env = {**os.environ, "PATH": f"{tools}/bin:{os.environ['PATH']}"}
    proc = subprocess.run(["sh", "-s"], input=batch_script(changes, disrupt=disrupt), capture_output=True,
                          text=True, env=env, timeout=60)
    return proc.returncode, parse_steps(changes, proc.stdout)


def test_guard_on_the_host_refuses_the_step_and_the_batch_goes_on(tools):
    (tools / "nvidia-smi.out").write_text("12345, python, 40960\n")
    rc, steps = run_batch(tools, [Change("driver", "swap", ("echo swapped",), disruptive="driver change"), PINS])
    assert rc == 0
    assert [(s.component, s.status) for s in steps] == [("driver", "refused"), ("pins", "done")]
    assert steps[0].rc == REFUSED_RC and "GPU process 12345, python, 40960" in steps[0].output
    assert "swapped" not in steps[0].output and "--disrupt" in steps[0].output


def test_guard_passes_on_an_idle_host_and_with_disrupt(tools):
    change = Change("driver", "swap", ("echo swapped",), disruptive="driver change")
    assert [s.status for s in run_batch(tools, [change])[1]] == ["done"]
    (tools / "squeue.out").write_text("Slurm job 77 bob train\n")
    assert [s.status for s in run_batch(tools, [change])[1]] == ["refused"]
    assert [s.output for s in run_batch(tools, [change], disrupt=True)[1]] == ["swapped"]


def test_docker_restart_is_refused_for_containers_only(tools):
    (tools / "nvidia-smi.out").write_text("12345, python, 40960\n")
    assert [s.status for s in run_batch(tools, [DOCKER])[1]] == ["done"]
    (tools / "docker.out").write_text("container trainer (pytorch)\n")
    _, [step] = run_batch(tools, [DOCKER])
    assert step.status == "refused" and "container trainer (pytorch)" in step.output


def test_guard_is_plain_sh():
    proc = subprocess.run(["sh", "-n", "-c", guard("driver change")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def decide(facts: dict, reboot: str = "if-needed", applied: bool = False, disrupt: bool = False):
    run = ProvisionRecord("gpu01", facts_after=IDLE | facts)
    return _decide_reboot(run, Options(reboot=reboot, disrupt=disrupt), applied), run


def test_os_reboot_required_alone_is_reported_not_acted_on():
    now, run = decide({"reboot_required": True, "reboot_required_pkgs": ["linux-image-6.1.0-28-amd64", "libc6"]})
    assert now is False and run.reboot == "required by the OS"
    assert run.reboot_detail == "reboot required by the OS: linux-image-6.1.0-28-amd64, libc6"


def test_this_runs_changes_or_a_recorded_driver_swap_reboot_when_idle():
    assert decide({}, applied=True)[0] is True
    now, run = decide({"gpuprov_reboot_pending": ["driver: driver 570.148.08"]})
    assert now is True and "570.148.08" in run.reboot_detail
    assert decide({}, applied=True, reboot="never")[0] is False


def test_always_reboots_without_changes_and_nothing_reboots_a_busy_host_without_disrupt():
    assert decide({}, reboot="always")[0] is True
    busy = {"containers": [{"id": "1", "name": "trainer", "image": "pytorch"}]}
    now, run = decide(busy, reboot="always")
    assert now is False and run.reboot == "refused" and "container trainer (pytorch)" in run.reboot_detail
    assert decide(busy, reboot="always", disrupt=True)[0] is True


def test_steps_keep_secrets_off_command_lines_and_cannot_eat_the_script():
    """A step's text (file contents with credentials) is in no process's /proc/PID/cmdline, and a step that
    reads stdin gets nothing of the rest of the batch."""
    secret = Change("sources", "auth", ("printf %s 'password SECRET-token' >/dev/null",
                                        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | "
                                        "grep -c 'S[E]CRET-token' || true"))
    reader = Change("a", "reads stdin", ("head -c 100 || true",))
    last = Change("b", "after the reader", ("echo still-here",))
    proc = subprocess.run(["sh", "-s"], input=batch_script([secret, reader, last]), capture_output=True,
                          text=True, timeout=60)
    steps = parse_steps([secret, reader, last], proc.stdout)
    assert [s.output for s in steps] == ["0", "", "still-here"]


def test_a_commands_own_exit_75_is_a_failure_not_a_refusal():
    change = Change("a", "exits 75", ("exit 75",))
    [step] = parse_steps([change], subprocess.run(["sh", "-s"], input=batch_script([change]), capture_output=True,
                                                  text=True, timeout=30).stdout)
    assert step.status == "failed"


def test_gpu_daemons_count_by_their_cut_comm_name_too():
    facts = IDLE | {"gpu_processes": None, "gpu_device_users": [
        {"pid": 900, "process_name": "nvidia-persiste"}, {"pid": 901, "process_name": "nv-fabricmanage"}]}
    assert running_work(facts) == []


def test_the_only_help_lists_every_component():
    from gpuprov.provision.ops import COMPONENTS
    from gpuprov.tasks.provision import ONLY_CHOICES

    assert ONLY_CHOICES.split(",") == list(COMPONENTS)


def test_gpuprovs_monitoring_container_is_not_work(tools):
    """dcgm-exporter's container (monitoring.deploy) restarts by itself: it never holds back a Docker restart."""
    (tools / "docker.out").write_text("container gpuprov-dcgm-exporter (nvcr.io/nvidia/k8s/dcgm-exporter:x)\n")
    assert [s.status for s in run_batch(tools, [DOCKER])[1]] == ["done"]
    (tools / "docker.out").write_text("container gpuprov-dcgm-exporter (x)\ncontainer gpuprov-dcgm-exporter2 (y)\n")
    _, [step] = run_batch(tools, [DOCKER])
    assert step.status == "refused" and "gpuprov-dcgm-exporter2 (y)" in step.output
    facts = IDLE | {"containers": [{"name": "gpuprov-dcgm-exporter", "image": "x"}]}
    assert running_work(facts) == []
