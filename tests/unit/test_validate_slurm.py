"""`validate --via slurm` on the controller's side: the sbatch line, the flags refused before any host, squeue's
state and pending reason read, the start deadline and Ctrl-C with a fake Slurm controller (a scripted runner).
Expected values are Slurm's own (sbatch/squeue/scancel man pages, slurm-22.05) and the flags' documented ranges."""

from __future__ import annotations

import shlex
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.validation.slurm_jobs import SlurmJob, SlurmOptions, parse_job_id, parse_state, sbatch_argv, slurm_options

OUT, ERR = "/opt/gpuprov/run/slurm-validate.out", "/opt/gpuprov/run/slurm-validate.err"


def test_sbatch_is_one_exclusive_job_on_the_node_with_the_flags_given():
    argv = sbatch_argv("gpu-01", "cd /opt/gpuprov && python -m smoke --only 'a b'", output=OUT, error=ERR,
                       seconds=900, options=SlurmOptions(partition="gpu", qos="scavenger", nice=10000))
    assert argv == ["sbatch", "--parsable", "--exclusive", "-N", "1", "-w", "gpu-01", "-J", "gpuprov-validate",
                    "--time=15", "--chdir=/", "-o", OUT, "-e", ERR, "-p", "gpu", "--qos", "scavenger", "--nice=10000",
                    "--wrap", "cd /opt/gpuprov && python -m smoke --only 'a b'"]
    # what the controller's shell gets back as words is the argv itself: the command stays one word
    assert shlex.split(shlex.join(argv)) == argv


def test_a_gpu_host_asks_for_every_gpu_as_gres_and_a_cpu_host_for_none():
    """With ConstrainDevices=yes a job sees only the GPUs it was allocated (Slurm's gres.html, cgroup.conf(5))."""
    assert sbatch_argv("n1", "true", output=OUT, error=ERR, seconds=60, options=SlurmOptions(),
                       gpus=8)[-3:] == ["--gres=gpu:8", "--wrap", "true"]
    assert not any(a.startswith("--gres") for a in sbatch_argv("n1", "true", output=OUT, error=ERR, seconds=60,
                                                                options=SlurmOptions()))


def test_no_partition_qos_or_nice_when_not_given_and_the_time_limit_rounds_up():
    argv = sbatch_argv("n1", "true", output=OUT, error=ERR, seconds=901, options=SlurmOptions(nice=0))
    assert "--time=16" in argv and "-p" not in argv and "--qos" not in argv
    assert not any(a.startswith("--nice") for a in argv)


@pytest.mark.parametrize("node", ["gpu[01-02]", "a,b", "-w", "", "n 1", "n\n1"])
def test_a_node_that_is_not_one_plain_name_is_refused(node):
    with pytest.raises(InputError):
        sbatch_argv(node, "true", output=OUT, error=ERR, seconds=60, options=SlurmOptions())


@pytest.mark.parametrize("path", ["relative.out", "/tmp/%j.out", "/tmp/a\nb"])
def test_an_output_path_slurm_would_expand_or_a_relative_one_is_refused(path):
    with pytest.raises(InputError):
        sbatch_argv("n1", "true", output=path, error=ERR, seconds=60, options=SlurmOptions())


@given(st.text(min_size=1, max_size=40))
def test_any_partition_name_is_a_plain_name_or_refused(name):
    try:
        options = slurm_options(name, None, 0, "30m")
    except InputError as exc:
        assert "--partition" in exc.message
        return
    assert options.partition == name and name[0].isascii() and name[0].isalnum()
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)


@given(st.text(min_size=1, max_size=40))
def test_any_qos_name_is_a_plain_name_or_refused(name):
    try:
        slurm_options(None, name, 0, "30m")
    except InputError as exc:
        assert "--qos" in exc.message
        return
    assert "," not in name and not name.startswith("-") and " " not in name


@pytest.mark.parametrize(("nice", "deadline", "flag"), [
    ("-1", "30m", "--nice"), ("ten", "30m", "--nice"), ("2147483646", "30m", "--nice"), ("٣", "30m", "--nice"),
    ("0", "0", "--start-deadline"), ("0", "30 minutes", "--start-deadline"), ("0", "-5m", "--start-deadline"),
])
def test_bad_nice_or_deadline_is_refused_naming_the_flag(nice, deadline, flag):
    with pytest.raises(InputError) as caught:
        slurm_options(None, None, nice, deadline)
    assert flag in caught.value.message


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("45", 45)])
def test_start_deadline_units(text, seconds):
    assert slurm_options(None, None, "2147483645", text).start_deadline_s == seconds


def test_sbatch_parsable_answers():
    assert parse_job_id("1234\n") == "1234"
    assert parse_job_id("1234;gpuprov-lab\n") == "1234"   # --parsable with a cluster name: id;cluster
    with pytest.raises(ValueError):
        parse_job_id("sbatch: error: Batch job submission failed")


def test_squeue_state_and_pending_reason():
    assert parse_state("PENDING|Resources\n") == ("PENDING", "Resources")
    assert parse_state("PENDING|ReqNodeNotAvail, UnavailableNodes:gpu-01\n") == (
        "PENDING", "ReqNodeNotAvail, UnavailableNodes:gpu-01")
    assert parse_state("RUNNING|None\n") == ("RUNNING", "")
    assert parse_state("") is None
    with pytest.raises(ValueError):
        parse_state("squeue: error: something\n")


class FakeController:
    """squeue answers scripted per call; scancel recorded (and ends a pending job as Slurm does)."""

    def __init__(self, states: list[str], *, start_on_cancel: bool = False):
        self.states = list(states)
        self.calls: list[list[str]] = []
        self.cancelled = False
        self.start_on_cancel = start_on_cancel

    def __call__(self, argv: list[str], admin: bool) -> tuple[int, str, str]:
        assert admin   # every command as root: with PrivateData=jobs another user's job is hidden
        self.calls.append(argv)
        if argv[0] == "sbatch":
            return 0, "77\n", ""
        if argv[0] == "scancel":
            if self.start_on_cancel:   # it started just before: --state=PENDING leaves it alone
                self.states = ["RUNNING|None", "COMPLETED|None"]
            else:
                self.cancelled = True
                self.states = ["CANCELLED|ReqNodeNotAvail"]
            return 0, "", ""
        line = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return 0, line + "\n", ""


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def job_on(controller, stop=None) -> tuple[SlurmJob, Clock]:
    clock = Clock()
    job = SlurmJob(controller, "ctl", "gpu-01", stop=stop, clock=clock, sleep=clock.sleep)
    job.submit(["sbatch", "--parsable"])
    return job, clock


def test_a_job_that_waits_then_runs_reports_how_long_it_was_pending():
    controller = FakeController(["PENDING|Resources"] * 5 + ["RUNNING|None"] * 3 + ["COMPLETED|None"])
    job, _ = job_on(controller)
    outcome = job.wait(start_deadline_s=600, run_limit_s=900, poll_s=2)
    assert (outcome.job_id, outcome.state, outcome.pending_s) == ("77", "COMPLETED", 10.0)
    assert not any(c[0] == "scancel" for c in controller.calls)


def test_a_job_pending_past_the_deadline_is_cancelled_pending_only_and_named_with_its_reason():
    controller = FakeController(["PENDING|ReqNodeNotAvail, UnavailableNodes:gpu-01"])
    job, clock = job_on(controller)
    with pytest.raises(GpuprovError) as caught:
        job.wait(start_deadline_s=30, run_limit_s=900, poll_s=2)
    assert ["scancel", "--state=PENDING", "77"] in controller.calls
    assert "77" in caught.value.message and "ReqNodeNotAvail, UnavailableNodes:gpu-01" in caught.value.message
    assert caught.value.host == "gpu-01"
    assert 30 <= clock.now <= 32


def test_a_job_that_starts_as_the_deadline_passes_is_left_running():
    controller = FakeController(["PENDING|Priority"], start_on_cancel=True)
    job, _ = job_on(controller)
    assert job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2).state == "COMPLETED"


def test_a_job_gone_from_the_queue_has_ended():
    controller = FakeController(["RUNNING|None", ""])
    job, _ = job_on(controller)
    assert job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2).state == "ENDED"


def test_ctrl_c_cancels_our_job():
    stop = threading.Event()
    controller = FakeController(["RUNNING|None"])
    job, clock = job_on(controller, stop)
    job.sleep = lambda seconds: stop.set()
    with pytest.raises(GpuprovError) as caught:
        job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2)
    assert controller.calls[-1] == ["scancel", "77"]
    assert caught.value.message == "interrupted (Ctrl-C): validation job 77 cancelled (RUNNING)"
    assert clock.now == 0


def test_a_running_job_past_its_limit_is_cancelled():
    controller = FakeController(["RUNNING|None"])
    job, _ = job_on(controller)
    with pytest.raises(GpuprovError):
        job.wait(start_deadline_s=10, run_limit_s=20, poll_s=2)
    assert controller.calls[-1] == ["scancel", "77"]


def test_sbatch_refusal_is_an_error_with_its_answer():
    def refuse(argv, admin):
        return 1, "", "sbatch: error: Invalid qos specification\n"

    with pytest.raises(GpuprovError) as caught:
        SlurmJob(refuse, "ctl", "gpu-01").submit(["sbatch", "--qos", "nope"])
    assert "Invalid qos specification" in caught.value.output and caught.value.command == "sbatch --qos nope"


# -- the multi-node all-reduce through srun --------------------------------------------------------------------

def members(names=("gpu-01", "gpu-02"), nproc=(1, 1)):
    from gpuprov.validation.multinode import Node
    from gpuprov.validation.srun import Member

    return [Member(name, Node(f"inv-{name}'x", f"10.0.0.{i + 1}", count, "cpu", True))
            for i, (name, count) in enumerate(zip(names, nproc, strict=True))]


def test_one_allocation_of_all_the_nodes():
    from gpuprov.validation.slurm_jobs import sbatch_multi_argv

    argv = sbatch_multi_argv(["gpu-01", "gpu-02"], "srun true", output=OUT, seconds=600, options=SlurmOptions())
    assert argv[argv.index("-N") + 1] == "2" and argv[argv.index("-w") + 1] == "gpu-01,gpu-02"
    assert argv[argv.index("-o") + 1] == argv[argv.index("-e") + 1] == OUT and "--exclusive" in argv
    for nodes in (["gpu-01"], ["gpu-01", "gpu-01"], ["gpu-01", "gpu[02-03]"]):
        with pytest.raises(InputError):
            sbatch_multi_argv(nodes, "true", output=OUT, seconds=600, options=SlurmOptions())


def test_the_batch_script_is_valid_shell_and_each_task_finds_its_inventory_name():
    import subprocess

    from gpuprov.validation.srun import _case, batch_script

    script = batch_script(members(), port=29400, level="quick")
    assert subprocess.run(["sh", "-n", "-c", script], capture_output=True).returncode == 0
    assert "srun --kill-on-bad-exit=1 --ntasks-per-node=1 -N 2 " in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    # a name with a quote in it is data: the task's shell sets it as it is
    case = _case(members(), lambda m: m.node.name)
    out = subprocess.run(["sh", "-c", case + '; printf %s "$v"'], capture_output=True, text=True,
                         env={"SLURMD_NODENAME": "gpu-02", "PATH": "/usr/bin:/bin"})
    assert out.stdout == "inv-gpu-02'x"
    unknown = subprocess.run(["sh", "-c", case], capture_output=True, text=True,
                             env={"SLURMD_NODENAME": "other", "PATH": "/usr/bin:/bin"})
    assert unknown.returncode == 1 and "not one of ours" in unknown.stderr


def test_hosts_with_different_task_counts_are_named():
    from gpuprov.validation.srun import same_tasks

    assert same_tasks(members()) is None
    assert "inv-gpu-01'x: 8 cpu" in same_tasks(members(nproc=(8, 4)))


def test_a_keyboard_interrupt_while_waiting_cancels_the_job_and_goes_on():
    controller = FakeController(["PENDING|Priority"])
    job, clock = job_on(controller)

    def interrupt(seconds):
        raise KeyboardInterrupt

    job.sleep = interrupt
    with pytest.raises(KeyboardInterrupt):
        job.wait(start_deadline_s=600, run_limit_s=900, poll_s=2)
    assert controller.calls[-1] == ["scancel", "77"]
