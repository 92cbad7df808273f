"""`invoke validate`: the training and inference smoke suite on every host, judged against each GPU's datasheet
and against the rest of the fleet; optionally one all-reduce across the hosts; JSON, JUnit and Prometheus
reports."""

from __future__ import annotations

from gpuprov.tasks._common import (
    check_output_files,
    current_shard,
    exits_cleanly,
    finish,
    host_task,
    open_fleet,
    split_names,
    task,
)
from gpuprov.validation.slurm_jobs import DEFAULT_NICE, DEFAULT_START_DEADLINE


@host_task(help={
    "level": "quick (default: under a minute per host) or burn-in (minutes of matmul and memory load, "
             "dcgmi diag -r 3)",
    "strict": "a skipped or warning check fails",
    "image": "run the suite in this container image (docker run --gpus all) instead of the host's venv",
    "multi_node": "also all-reduce across the selected hosts with torchrun (c10d rendezvous at the first host's "
                  "cluster_address); with --via slurm in one Slurm allocation, launched with srun",
    "only": "comma list of checks to run (e.g. host.ecc,perf.matmul)",
    "json": "print the run report as JSON on stdout",
    "textfile": "place the Prometheus textfile on each host (default; --no-textfile leaves hosts alone)",
    "dry_run": "say what the environment step would do on each host (build the venv, install torch.compile's "
               "compiler, with the command); change nothing, run no suite",
    "via": "ssh (default: the suite runs over SSH) or slurm (as an exclusive Slurm job on each host's node, "
           "submitted on scheduler.controller: a busy node is validated once it frees up)",
    "partition": "--via slurm: the partition the validation jobs are submitted to",
    "qos": "--via slurm: the QOS of the validation jobs (e.g. a preemptible one)",
    "nice": f"--via slurm: the jobs' nice (default {DEFAULT_NICE}: behind work submitted at the default 0; 0 for "
            "none)",
    "start_deadline": f"--via slurm: a job still pending after this long (default {DEFAULT_START_DEADLINE}) is "
                      "cancelled and its host fails with Slurm's pending reason",
})
def validate(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False,
             level="quick", strict=False, image=None, multi_node=False, only=None, json_=False, textfile=True,
             dry_run=False, via="ssh", partition=None, qos=None, nice=None, start_deadline=None):
    """Run the training and inference smoke suite on hosts, judged against datasheets and the fleet.

    Host health, training, inference, sizing, software and performance checks; exit 1 when any check failed.
    With --via slurm each host's suite is a Slurm job on its node; Ctrl-C cancels the jobs pending or running."""
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError
    from gpuprov.core.report import check_folder
    from gpuprov.core.runtime import run_fleet
    from gpuprov.stack.lock import locks_for
    from gpuprov.validation.host import RunOptions, ValidateJob
    from gpuprov.validation.suite_config import IMAGE_PATTERN, LEVELS

    if level not in LEVELS:
        raise InputError(f"--level must be one of {', '.join(LEVELS)}, not {level!r}", step="validate")
    if image is not None and not IMAGE_PATTERN.fullmatch(image):
        raise InputError(f"--image must be an image reference like repo/name:tag, not {image!r}", step="validate")
    checks = _checks(level, only)
    slurm = _slurm_options(via, partition, qos, nice, start_deadline, multi_node, dry_run, image)
    if multi_node and current_shard() is not None:
        raise InputError("--multi-node with --shard: one all-reduce needs every host of the run in it, and a shard "
                         "has only its part (reports.merge refuses such reports)", step="validate",
                         hint="run --multi-node once over the whole selection, without --shard")
    fleet = open_fleet(c, host, group, all, inventory, parallel=parallel, trust_new_hosts=trust_new_hosts,
                       json_=json_, kind="validate")
    if multi_node and len(fleet.hosts) < 2:
        raise InputError("--multi-node needs at least two hosts", step="validate",
                         hint="select the group with --group NAME")
    locks, wheels = path_setting(c, "locks"), path_setting(c, "wheelhouse")
    check_output_files("gpuprov.reports", [fleet.reports / "validate-latest.xml",
                                           *(fleet.reports / "textfile" / f"{h.name}.prom" for h in fleet.hosts)])
    check_folder("gpuprov.locks", locks, write=False)
    check_folder("gpuprov.wheelhouse", wheels, write=True)
    locks_for(fleet.hosts, locks)  # a corrupt lock is bad input: found before any host is contacted
    job = ValidateJob(RunOptions(level=level, strict=strict, image=image, only=checks, locks_dir=locks,
                                 wheelhouse=wheels, dry_run=dry_run, multi_node=multi_node, textfile=textfile,
                                 slurm=slurm))
    if slurm is not None:
        from gpuprov.core.controller import controller_name, controller_runner

        name = controller_name(fleet.hosts, "--via slurm", "validate",
                               "set scheduler.controller to the inventory host that runs sbatch (slurmctld's host)")
        job.controller = controller_runner(fleet, name), name
    finish(_dry_run(fleet, job) if dry_run else run_fleet(fleet, job))


def _slurm_options(via, partition, qos, nice, start_deadline, multi_node: bool, dry_run: bool, image):
    """--via and its flags checked (InputError, exit 2, before any host): SlurmOptions for --via slurm, else None
    (a Slurm flag without --via slurm is refused)."""
    from gpuprov.core.errors import InputError
    from gpuprov.validation.slurm_jobs import slurm_options

    if via not in ("ssh", "slurm"):
        raise InputError(f"--via must be ssh or slurm, not {via!r}", step="validate")
    given = [flag for flag, value in (("--partition", partition), ("--qos", qos), ("--nice", nice),
                                      ("--start-deadline", start_deadline)) if value is not None]
    if via == "ssh":
        if given:
            raise InputError(f"{', '.join(given)} only with --via slurm", step="validate")
        return None
    if image is not None and multi_node:
        raise InputError("--multi-node --via slurm runs the all-reduce in the host's venv: drop --image, or use "
                         "--via ssh", step="validate")
    if dry_run:
        raise InputError("--dry-run with --via slurm: the dry run plans the environment over SSH; drop --via",
                         step="validate")
    return slurm_options(partition, qos, DEFAULT_NICE if nice is None else nice,
                         DEFAULT_START_DEADLINE if start_deadline is None else start_deadline)


def _dry_run(fleet, job) -> int:
    """validate --dry-run's answer, with no report: each host's environment plan (or why it has none). Exit 1 when
    a host could not be asked, 130 on Ctrl-C (the hosts that completed are shown)."""
    import sys

    from gpuprov.core.errors import literal
    from gpuprov.core.executor import RunInterrupted
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.runtime import failed_entry
    from gpuprov.validation.env import plan_lines

    interrupted = False
    try:
        outcomes = fleet.run(fleet.hosts, lambda conn: job.run_host(conn, lambda what: fleet.on_event(conn.host,
                                                                                                      what)))
    except RunInterrupted as stop:
        outcomes, interrupted = stop.outcomes, True
    entries = [o.value.to_dict() if o.ok else failed_entry(job, o) for o in outcomes]
    if fleet.quiet:
        print(dump_json({"dry_run": True, "hosts": [{key: entry[key] for key in ("host", "env", "error")}
                                                    for entry in entries]}))
    else:
        for entry in entries:
            lines = (plan_lines(entry["host"], entry["env"]) if entry["error"] is None else
                     [f"{entry['host']}: not asked: {entry['error']['error']}"])
            print("\n".join(literal(line) for line in lines))
    if interrupted:
        print("interrupted (Ctrl-C): the plans above are the hosts that completed", file=sys.stderr)
        return 130
    return 1 if any(entry["error"] for entry in entries) else 0


def _checks(level: str, only: str | None) -> tuple[str, ...] | None:
    """--only as given, once every name is a check (or a group of checks) of the suite that runs at `level`:
    the suite's own selection, asked here on the controller (InputError, exit 2) rather than on each host."""
    if only is None:
        return None
    from gpuprov.core.errors import InputError
    from gpuprov.smoke.runner import UsageError, discover, select

    names = tuple(split_names([only], "--only"))
    discover()
    try:
        select(level, ",".join(names))
    except UsageError as exc:
        raise InputError(str(exc), step="validate", hint="invoke validate --help lists the levels; the checks "
                                                         "are named in the error") from None
    return names


@task(help={"output": "where to write it (default build/gpuprov-smoke.pyz)"})
@exits_cleanly
def bundle(c, output=None):
    """Write the suite as one file for a bare GPU machine: `python3 gpuprov-smoke.pyz` (Python 3.9+, no gpuprov).

    A zipapp with the suite, its front end and the GPU catalog's suite configs; the same inputs give the same bytes
    (gpuprov.validation.bundle; bench/README.md says how to run it)."""
    from pathlib import Path

    from gpuprov.validation.bundle import DEFAULT_OUTPUT, build

    path = Path(output) if output else DEFAULT_OUTPUT
    check_output_files("--output", [path])
    print(build(path))
