"""`invoke validate --via slurm`: the suite of one host runs as an exclusive Slurm batch job on its node, submitted on
the Slurm controller (scheduler.controller, through gpuprov.core.controller.ControllerRunner, as root: the job runs
as root, as the SSH run does), so that a node busy with a job is validated once it frees up instead of refused.

The job writes the suite's stdout and stderr into root-owned files under the host's gpuprov folder; once it left the
queue they are read back over the host's own SSH connection and parsed as an SSH run's output is. A job still
PENDING past the start deadline is cancelled with `scancel --state=PENDING` (so a job that just started is never
touched) and the host fails, naming the job and Slurm's pending reason (squeue's %r); a job found in any other
state than PENDING or CANCELLED after that scancel (CONFIGURING while a powered-down node boots, RUNNING, COMPLETING,
SUSPENDED) started, and is waited for. On Ctrl-C (`interrupted`), our pending or running job is cancelled.

sbatch is sent once, never again after a dropped link or a timeout (the first may have landed), with a comment of its
own by which squeue finds the job when sbatch's answer was lost. A squeue that fails (slurmctld failing over) is asked
again a few times with a growing pause; when it keeps failing, our job is cancelled and the error names it.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuprov.core.controller import NODE_NAME
from gpuprov.core.errors import GpuprovError, InputError, literal

JOB_NAME = "gpuprov-validate"
COMMENT_PREFIX = "gpuprov:"   # sbatch --comment: a token after it finds a job whose sbatch went unanswered
DEFAULT_NICE = 10000          # below every job submitted with the default nice 0
DEFAULT_START_DEADLINE = "30m"
POLL_S = 2.0
MAX_NICE = 2147483645         # Slurm's NICE_OFFSET - 3 (slurm.h): the largest --nice sbatch takes
END_MARGIN_S = 120            # past the job's time limit, how long the job may take to leave the queue
STATE_TRIES = 4               # squeue asked this many times before the job is given up (and cancelled)
STATE_BACKOFF_S = 2.0         # the pause before the second try, doubled before each next one
# a partition or QOS name: as a node name (no list, no option-like leading '-')
NAME = NODE_NAME
# squeue -o '%T|%r': the job's state in full, its reason (None while it runs)
STATE_FORMAT = "%T|%r"
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                   "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})
NOT_STARTED = frozenset({"PENDING", "CANCELLED"})   # after `scancel --state=PENDING`: the job never ran
_JOB_ID = re.compile(r"[0-9]{1,12}")
_DURATION = re.compile(r"([0-9]{1,7})(s|m|min|h)?")
_UNITS = {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}

# run(argv, admin, retry=...) on the Slurm controller -> (exit code, stdout, stderr): ControllerRunner; retry=False
# runs it once whatever happens to the link (sbatch)
Runner = Callable[..., tuple[int, str, str]]


@dataclass(frozen=True)
class SlurmOptions:
    """How validation jobs are submitted: partition, QOS, nice, and how long one may stay PENDING (seconds)."""

    partition: str | None = None
    qos: str | None = None
    nice: int = DEFAULT_NICE
    start_deadline_s: int = 1800
    poll_s: float = POLL_S


def slurm_options(partition: str | None, qos: str | None, nice, start_deadline) -> SlurmOptions:
    """The flags checked (InputError naming the flag, exit 2, before any host is touched)."""
    for flag, value in (("--partition", partition), ("--qos", qos)):
        if value is not None and not NAME.fullmatch(str(value)):
            raise InputError(f"{flag} {literal(str(value))!r} is not a Slurm name: give letters, digits, '.', '_' "
                             "and '-', starting with a letter or digit (one name, no list)", step="validate")
    text = str(nice).strip()
    if isinstance(nice, bool) or not text.isascii() or not text.isdigit() or int(text) > MAX_NICE:
        raise InputError(f"--nice must be a whole number from 0 to {MAX_NICE}, not {nice!r}", step="validate",
                         hint="a higher nice lowers the validation job's priority; 0 submits it at the default")
    match = _DURATION.fullmatch(str(start_deadline).strip())
    if match is None or int(match[1]) == 0:
        raise InputError(f"--start-deadline {start_deadline!r}: give a duration like 90s, 30m or 2h (at least 1 s)",
                         step="validate")
    return SlurmOptions(partition=partition, qos=qos, nice=int(text),
                        start_deadline_s=int(match[1]) * _UNITS[match[2]])


def time_limit_minutes(seconds: float) -> int:
    """sbatch --time in minutes: the suite's own timeout, rounded up, at least one."""
    return max(1, math.ceil(seconds / 60))


def sbatch_argv(node: str, command: str, *, output: str, error: str, seconds: float,
                options: SlurmOptions, gpus: int = 0) -> list[str]:
    """sbatch for one exclusive job on `node` that runs `command` (a shell line) with its output in `output` and
    `error`. Every value is one argv word (ControllerRunner quotes the line); names are refused unless plain.
    --chdir=/: the job would start in sbatch's working folder on the controller, which the node may not have.
    `gpus`: the host's GPUs, asked for as `--gres=gpu:N`, so that a cluster that confines devices
    (ConstrainDevices=yes) lets the suite see every GPU whatever --exclusive grants there."""
    if not NODE_NAME.fullmatch(node):
        raise InputError(f"node name {literal(node)!r} is not a plain Slurm node name", step="validate")
    for path in (output, error):
        if not path.startswith("/") or "%" in path or any(ord(c) < 32 for c in path):
            raise InputError(f"job output path {literal(path)!r} must be absolute, without '%' or control "
                             "characters", step="validate")
    argv = ["sbatch", "--parsable", "--exclusive", "-N", "1", "-w", node, "-J", JOB_NAME,
            f"--time={time_limit_minutes(seconds)}", "--chdir=/", "-o", output, "-e", error]
    if options.partition:
        argv += ["-p", options.partition]
    if options.qos:
        argv += ["--qos", options.qos]
    if options.nice:
        argv += [f"--nice={options.nice}"]
    if gpus:
        argv += [f"--gres=gpu:{int(gpus)}"]
    return [*argv, "--wrap", command]


def sbatch_multi_argv(nodes: list[str], script: str, *, output: str, seconds: float,
                      options: SlurmOptions, gpus: int = 0) -> list[str]:
    """sbatch for one exclusive allocation of `nodes` (the multi-node all-reduce): the batch script `script` runs on
    the first of them, its output (both streams) in `output` there. `gpus`: each node's GPUs (--gres counts per
    node), as sbatch_argv asks for them."""
    if len(nodes) < 2 or len(set(nodes)) != len(nodes):
        raise InputError(f"the all-reduce needs two or more different nodes, not {', '.join(nodes)}", step="validate")
    for node in nodes:
        if not NODE_NAME.fullmatch(node):
            raise InputError(f"node name {literal(node)!r} is not a plain Slurm node name", step="validate")
    argv = sbatch_argv(nodes[0], script, output=output, error=output, seconds=seconds, options=options, gpus=gpus)
    argv[argv.index("-N") + 1] = str(len(nodes))
    argv[argv.index("-w") + 1] = ",".join(nodes)
    return argv


def parse_job_id(out: str) -> str:
    """The job id `sbatch --parsable` prints (`id` or `id;cluster`); ValueError otherwise."""
    job = out.strip().split(";")[0]
    if not _JOB_ID.fullmatch(job):
        raise ValueError(f"sbatch printed {out.strip()!r}, not a job id")
    return job


def parse_state(out: str) -> tuple[str, str] | None:
    """(state, reason) from `squeue -h -j ID -t all -o STATE_FORMAT`; None when squeue no longer lists the job.
    A reason of `None` (a running job) reads as ''."""
    line = next((line for line in out.splitlines() if line.strip()), None)
    if line is None:
        return None
    state, sep, reason = line.strip().partition("|")
    if not sep or not state.isalpha() or not state.isupper():
        raise ValueError(f"not a squeue state line: {line!r}")
    return state, "" if reason == "None" else reason


class _QueryFailed(Exception):
    """squeue could not be asked, or failed: `error` says how (SlurmJob.state asks again)."""

    def __init__(self, error: GpuprovError):
        super().__init__(error.message)
        self.error = error


@dataclass
class JobOutcome:
    """A validation job that left PENDING: its id, last state seen, how long it waited in the queue."""

    job_id: str
    state: str
    pending_s: float


class SlurmJob:
    """One validation job on the controller: submit, wait (start deadline, Ctrl-C), cancel."""

    def __init__(self, run: Runner, where: str, host: str, stop: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] | None = None):
        self._run, self.where, self.host = run, where, host
        self.stop = stop or threading.Event()
        self.clock, self.sleep = clock, sleep
        self.job_id: str | None = None

    def submit(self, argv: list[str]) -> str:
        """sbatch `argv` with a comment no other job has (COMMENT_PREFIX and a random token), sent once: sent again
        after a dropped link or a timeout, a first one that landed would be left an orphan. Without an answer, the
        job with that comment is looked for and, when Slurm has it, taken as ours."""
        comment = f"{COMMENT_PREFIX}{secrets.token_hex(8)}"
        argv = [argv[0], f"--comment={comment}", *argv[1:]]
        try:
            rc, out, err = self._run(argv, True, retry=False)
        except GpuprovError as exc:
            self.job_id = self._landed(comment, argv, exc)
            return self.job_id
        if rc != 0:
            raise self._error("sbatch refused the validation job", argv, rc, out, err,
                              "check the partition, QOS and node in sbatch's answer (sinfo -N -n NODE)")
        try:
            self.job_id = parse_job_id(out)
        except ValueError as exc:
            raise self._error(str(exc), argv, rc, out, err, "check sbatch on the controller") from None
        return self.job_id

    def _landed(self, comment: str, argv: list[str], failure: GpuprovError) -> str:
        """The id of the job sbatch submitted with `comment` though its answer was lost; GpuprovError when squeue
        does not list it (or cannot be asked)."""
        lookup = ["squeue", "-h", "-t", "all", "-n", JOB_NAME, "-o", "%i|%k"]
        try:
            rc, out, _ = self._run(lookup, True)
        except GpuprovError:
            rc, out = 1, ""
        for line in out.splitlines() if rc == 0 else []:
            job, _, seen = line.strip().partition("|")
            if seen == comment and _JOB_ID.fullmatch(job):
                return job
        raise GpuprovError(
            f"sbatch got no answer on the Slurm controller {self.where} ({failure.message}), and no job with its "
            f"comment {comment} is queued: it was not sent again", host=self.host, step="suite.slurm",
            command=shlex.join(argv), output=failure.output,
            hint=f"if it was queued after all, cancel it: squeue -n {JOB_NAME} -o '%i %k' shows it with comment "
                 f"{comment} (scancel ID, on {self.where}); then validate this host again")

    def state(self) -> tuple[str, str] | None:
        """The job's (state, reason), None once squeue no longer lists it; squeue asked again after a failure
        (STATE_TRIES in all, pausing STATE_BACKOFF_S, doubled each time). When it keeps failing, the job is cancelled
        (as far as scancel gets through) and the last error raised, naming the job."""
        for attempt in range(1, STATE_TRIES + 1):
            try:
                return self._state()
            except _QueryFailed as failed:
                if attempt == STATE_TRIES:
                    raise self._given_up(failed.error) from None
                (self.sleep or self.stop.wait)(STATE_BACKOFF_S * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    def _given_up(self, error: GpuprovError) -> GpuprovError:
        try:
            self.cancel()
            done = f"validation job {self.job_id} was cancelled (scancel {self.job_id})"
        except GpuprovError:
            done = f"cancelling it failed too: cancel it yourself (scancel {self.job_id} on {self.where})"
        return GpuprovError(f"{error.message}, {STATE_TRIES} times: gpuprov stopped watching validation job "
                            f"{self.job_id}", host=self.host, step="suite.slurm", command=error.command,
                            output=error.output, hint=f"{done}; check that slurmctld answers: scontrol ping (on "
                                                      f"{self.where}), then validate this host again")

    def _state(self) -> tuple[str, str] | None:
        argv = ["squeue", "-h", "-j", str(self.job_id), "-t", "all", "-o", STATE_FORMAT]
        try:
            rc, out, err = self._run(argv, True)
        except GpuprovError as exc:   # the link to the controller (already reconnected once by the runner)
            raise _QueryFailed(exc) from None
        if rc != 0:
            if "Invalid job id" in err + out:   # purged from slurmctld's memory: it ended
                return None
            raise _QueryFailed(self._error(f"squeue failed for job {self.job_id}", argv, rc, out, err,
                                           f"check that slurmctld answers: scontrol ping (on {self.where})"))
        try:
            return parse_state(out)
        except ValueError as exc:
            raise self._error(f"squeue printed what gpuprov cannot read: {exc}", argv, rc, out, err,
                              "check squeue on the controller") from None

    def wait(self, start_deadline_s: float, run_limit_s: float, poll_s: float = POLL_S) -> JobOutcome:
        """Until the job left the queue. PENDING past `start_deadline_s`: cancelled (only while still pending),
        GpuprovError naming the job and Slurm's reason. Started but not ended within `run_limit_s`, or Ctrl-C
        (`stop` set by the executor's hook): cancelled, GpuprovError. A KeyboardInterrupt on this thread (the
        multi-node job waits on the main one) cancels it too, and goes on."""
        try:
            return self._wait(start_deadline_s, run_limit_s, poll_s)
        except KeyboardInterrupt:
            self.cancel()
            raise

    def _wait(self, start_deadline_s: float, run_limit_s: float, poll_s: float) -> JobOutcome:
        started = self.clock()
        ran_at: float | None = None
        state, reason = "PENDING", ""
        while True:
            if self.stop.is_set():
                self.cancel()
                raise GpuprovError(f"interrupted (Ctrl-C): validation job {self.job_id} cancelled ({state})",
                                   host=self.host, step="suite", hint="rerun validate --via slurm on this host")
            seen = self.state()
            now = self.clock()
            if seen is None or seen[0] in ENDED:
                final = seen[0] if seen else "ENDED"
                return JobOutcome(self.job_id, final, round((ran_at or now) - started, 3))
            state, reason = seen
            if state == "PENDING" and now - started >= start_deadline_s:
                self.cancel(pending_only=True)
                after = self.state()
                # gone, cancelled or still pending: it never ran. Any other state (CONFIGURING while its node boots,
                # RUNNING, COMPLETING, SUSPENDED, or ended) means it started just before scancel: waited for
                if after is None or after[0] in NOT_STARTED:
                    raise GpuprovError(
                        f"validation job {self.job_id} did not start within {int(start_deadline_s)} s on the Slurm "
                        f"controller {self.where}: Slurm's pending reason is {literal(reason or 'none')}; the job "
                        "was cancelled", host=self.host, step="suite.slurm", command=f"squeue -j {self.job_id}",
                        hint="see why the node does not free up (squeue -w NODE; sinfo -N -n NODE), or give a "
                             "longer --start-deadline")
                state = after[0]
            if state != "PENDING" and ran_at is None:
                ran_at = now
            if ran_at is not None and now - ran_at > run_limit_s:
                self.cancel()
                raise GpuprovError(f"validation job {self.job_id} ran past {int(run_limit_s)} s: cancelled",
                                   host=self.host, step="suite.slurm", command=f"squeue -j {self.job_id}",
                                   hint=f"look at the node's slurmd log and at the job (scontrol show job "
                                        f"{self.job_id})")
            (self.sleep or self.stop.wait)(poll_s)

    def cancel(self, pending_only: bool = False) -> None:
        """scancel our job (only while PENDING when `pending_only`); a job already gone is no error."""
        if self.job_id is None:
            return
        argv = ["scancel", *(["--state=PENDING"] if pending_only else []), str(self.job_id)]
        rc, out, err = self._run(argv, True)
        if rc != 0 and "Invalid job id" not in err + out and "already completing" not in err + out:
            raise self._error(f"scancel failed for job {self.job_id}", argv, rc, out, err,
                              f"cancel it yourself: scancel {self.job_id} (on {self.where})")

    def _error(self, message: str, argv: list[str], rc: int, out: str, err: str, hint: str) -> GpuprovError:
        output = "\n".join(part for part in (out.rstrip("\n"), err.rstrip("\n")) if part)
        return GpuprovError(f"{message} (exit {rc}, on the Slurm controller {self.where})", host=self.host,
                            step="suite.slurm", command=shlex.join(argv), output=output, hint=hint)
