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


SOCKET_TIMEOUT = "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation\n"


class FakeController:
    """squeue answers scripted per call; scancel recorded (and ends a pending job as Slurm does). `after_cancel`: the
    states of a job that started just before `scancel --state=PENDING` (which leaves it alone); `squeue_failures`:
    how many squeue calls fail first (slurmctld failing over), -1 for all of them."""

    def __init__(self, states: list[str], *, start_on_cancel: bool = False, after_cancel: list[str] | None = None,
                 squeue_failures: int = 0):
        self.states = list(states)
        self.calls: list[list[str]] = []
        self.retries: dict[str, list[bool]] = {}
        self.cancelled = False
        self.after_cancel = after_cancel or (["RUNNING|None", "COMPLETED|None"] if start_on_cancel else None)
        self.squeue_failures = squeue_failures

    def __call__(self, argv: list[str], admin: bool, *, retry: bool = True) -> tuple[int, str, str]:
        assert admin   # every command as root: with PrivateData=jobs another user's job is hidden
        self.calls.append(argv)
        self.retries.setdefault(argv[0], []).append(retry)
        if argv[0] == "sbatch":
            return 0, "77\n", ""
        if argv[0] == "scancel":
            if self.after_cancel and "--state=PENDING" in argv:
                self.states = list(self.after_cancel)
            else:
                self.cancelled = True
                self.states = ["CANCELLED|ReqNodeNotAvail"]
            return 0, "", ""
        if self.squeue_failures:
            self.squeue_failures -= 1
            return 1, "", SOCKET_TIMEOUT
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
    def refuse(argv, admin, *, retry=True):
        return 1, "", "sbatch: error: Invalid qos specification\n"

    with pytest.raises(GpuprovError) as caught:
        SlurmJob(refuse, "ctl", "gpu-01").submit(["sbatch", "--qos", "nope"])
    words = shlex.split(caught.value.command)
    assert "Invalid qos specification" in caught.value.output
    assert words[0] == "sbatch" and words[-2:] == ["--qos", "nope"]


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


# -- review: GPUs in the allocation, sbatch sent once, a job that started, squeue failing over ------------------

def gpu_members(count=4):
    from gpuprov.validation.multinode import Node
    from gpuprov.validation.srun import Member

    return [Member(name, Node(f"inv-{name}", f"10.0.0.{i + 1}", count, "cuda", True))
            for i, name in enumerate(("gpu-01", "gpu-02"))]


def test_the_multi_node_allocation_asks_for_each_nodes_gpus_and_srun_for_them():
    """--gres counts per node in sbatch and srun; by default a step gets the GRES its job asked for, except those an
    exclusive job holds implicitly (srun(1), --gres). --gpus-per-task would bind each task to one GPU (it implies
    --gpu-bind=per_task), where the worker takes device LOCAL_RANK."""
    from gpuprov.validation.slurm_jobs import sbatch_multi_argv
    from gpuprov.validation.srun import batch_script, run_srun

    argv = sbatch_multi_argv(["gpu-01", "gpu-02"], "srun true", output=OUT, seconds=600, options=SlurmOptions(),
                             gpus=8)
    assert "--gres=gpu:8" in argv and argv[-2:] == ["--wrap", "srun true"]
    script = batch_script(gpu_members(8), port=29400, level="quick")
    assert "srun --kill-on-bad-exit=1 --ntasks-per-node=8 -N 2 --gres=gpu:8 " in script
    assert "--gpus-per-task" not in script
    assert "--gres" not in batch_script(members(), port=29400, level="quick")

    controller = FakeController(["COMPLETED|None"])
    run_srun(gpu_members(4), [], lambda hosts, work: [], (controller, "ctl"), SlurmOptions(poll_s=0), port=29400,
             level="quick", stop=threading.Event())
    sbatch = controller.calls[0]
    assert sbatch[0] == "sbatch" and "--gres=gpu:4" in sbatch
    assert "--ntasks-per-node=4 -N 2 --gres=gpu:4 " in sbatch[-1]


def test_sbatch_is_sent_without_the_runners_retry_and_other_commands_with_it():
    controller = FakeController(["RUNNING|None", "COMPLETED|None"])
    job, _ = job_on(controller)
    job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2)
    assert controller.retries["sbatch"] == [False]
    assert set(controller.retries["squeue"]) == {True}


class LostAnswer:
    """A slow slurmctld: sbatch times out on the link, but the job was queued (`landed`) as 77 with its comment;
    squeue -n lists it (and another gpuprov run's job)."""

    def __init__(self, landed: bool):
        self.landed, self.calls, self.comment = landed, [], None

    def __call__(self, argv, admin, *, retry=True):
        self.calls.append(argv)
        if argv[0] == "sbatch":
            self.comment = next(a.split("=", 1)[1] for a in argv if a.startswith("--comment="))
            raise GpuprovError("command timed out after 60 s", host="ctl", command=shlex.join(argv))
        if argv[0] == "squeue" and "-n" in argv:
            ours = f"77|{self.comment}\n" if self.landed else ""
            return 0, "12|gpuprov:0123456789abcdef\n" + ours, ""
        return 0, "COMPLETED|None\n", ""


def test_sbatch_without_an_answer_is_not_sent_again_and_its_job_found_by_its_comment():
    controller = LostAnswer(landed=True)
    job = SlurmJob(controller, "ctl", "gpu-01")
    assert job.submit(["sbatch", "--parsable", "-J", "gpuprov-validate"]) == "77"
    assert [c[0] for c in controller.calls].count("sbatch") == 1
    lookup = controller.calls[1]
    assert lookup[:1] == ["squeue"] and lookup[lookup.index("-n") + 1] == "gpuprov-validate"
    assert job.wait(start_deadline_s=10, run_limit_s=900, poll_s=0).state == "COMPLETED"


def test_sbatch_without_an_answer_and_no_job_queued_fails_naming_where_to_look():
    controller = LostAnswer(landed=False)
    with pytest.raises(GpuprovError) as caught:
        SlurmJob(controller, "ctl", "gpu-01").submit(["sbatch", "--parsable", "-J", "gpuprov-validate"])
    assert [c[0] for c in controller.calls] == ["sbatch", "squeue"]   # never sent again, nothing cancelled
    assert caught.value.host == "gpu-01" and "timed out" in caught.value.message
    assert controller.comment in caught.value.hint and "squeue -n gpuprov-validate" in caught.value.hint


@pytest.mark.parametrize("started", ["CONFIGURING|None", "COMPLETING|None", "SUSPENDED|None", "RUNNING|None"])
def test_a_job_that_left_pending_as_the_deadline_passed_is_waited_for(started):
    controller = FakeController(["PENDING|Priority"], after_cancel=[started, started, "COMPLETED|None"])
    job, _ = job_on(controller)
    outcome = job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2)
    assert outcome.state == "COMPLETED"
    assert [c for c in controller.calls if c[0] == "scancel"] == [["scancel", "--state=PENDING", "77"]]


@pytest.mark.parametrize("after", ["PENDING|Priority", "CANCELLED|Priority", ""])
def test_a_job_still_pending_cancelled_or_gone_after_scancel_never_started(after):
    controller = FakeController(["PENDING|Priority"], after_cancel=[after])
    job, _ = job_on(controller)
    with pytest.raises(GpuprovError) as caught:
        job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2)
    assert "did not start" in caught.value.message and "Priority" in caught.value.message


def test_squeue_failing_for_a_moment_is_asked_again():
    controller = FakeController(["RUNNING|None", "COMPLETED|None"], squeue_failures=2)
    job, clock = job_on(controller)
    assert job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2).state == "COMPLETED"
    assert not any(c[0] == "scancel" for c in controller.calls)
    assert clock.now > 2   # it paused before asking again


def test_squeue_failing_for_good_cancels_our_job_and_names_it():
    controller = FakeController(["RUNNING|None"], squeue_failures=-1)
    job, clock = job_on(controller)
    with pytest.raises(GpuprovError) as caught:
        job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2)
    squeues = [c for c in controller.calls if c[0] == "squeue"]
    assert 2 <= len(squeues) <= 6   # a few tries, bounded
    assert controller.calls[-1] == ["scancel", "77"]
    assert "77" in caught.value.message and "scancel 77" in caught.value.hint
    assert "Socket timed out" in caught.value.output and caught.value.host == "gpu-01"
    assert clock.now < 120


def test_a_controller_link_that_keeps_dropping_while_waiting_cancels_our_job():
    calls = []

    def run(argv, admin, *, retry=True):
        calls.append(argv)
        if argv[0] == "sbatch":
            return 0, "77\n", ""
        if argv[0] == "squeue":
            raise GpuprovError("connection lost", host="ctl", command=shlex.join(argv))
        return 0, "", ""

    clock = Clock()
    job = SlurmJob(run, "ctl", "gpu-01", clock=clock, sleep=clock.sleep)
    job.submit(["sbatch"])
    with pytest.raises(GpuprovError) as caught:
        job.wait(start_deadline_s=10, run_limit_s=900, poll_s=2)
    assert calls[-1] == ["scancel", "77"] and "77" in caught.value.hint
