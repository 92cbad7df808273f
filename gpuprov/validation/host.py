"""`invoke validate` as a fleet job (gpuprov.core.runtime): on each host its facts, its stack (the lock's when one
governs it), the suite config, the Python environment (or the container image) and the suite run; then the
run-level steps that need every host's results: fleet outliers, the optional all-reduce across the hosts, the
Prometheus textfiles (placed on each host and kept beside the report), the JUnit report and the tables."""

from __future__ import annotations

import dataclasses
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.core.runtime import HostJob, HostRecord, Say
from gpuprov.validation import LAYOUT, Layout
from gpuprov.validation.slurm_jobs import SlurmOptions

TEXTFILE = "gpuprov_validate.prom"
REPORT_OUTPUT = 65536   # characters of a stopped host's output its report entry keeps (the tail)
MATRIX_HOSTS = 8        # past this many hosts, the console shows the compact matrix instead of a table per host
STYLES = {"fail": "bold red", "warn": "yellow", "pass": "green", "skip": "dim", "error": "bold red",
          "partial": "cyan"}


@dataclass(frozen=True)
class RunOptions:
    """What the operator asked for, and where the controller keeps things."""

    level: str = "quick"
    strict: bool = False
    image: str | None = None
    only: tuple[str, ...] | None = None
    locks_dir: Path = Path("locks")
    wheelhouse: Path = Path("build/wheelhouse")
    layout: Layout = LAYOUT
    dry_run: bool = False   # say what the environment step would do (gpuprov.validation.env.env_plan); change nothing
    multi_node: bool = False   # also all-reduce across the hosts (gpuprov.validation.multinode)
    textfile: bool = True      # place each host's Prometheus textfile in its node_exporter folder
    slurm: SlurmOptions | None = None   # --via slurm: the suite runs as a Slurm job (gpuprov.validation.slurm_jobs)


@dataclass
class ValidationRecord(HostRecord):
    """Everything validation found on one host: the JSON report's host entry (to_dict). Its status is judged from
    its results and error (host_status), whatever the runtime set."""

    address: str = ""
    cluster_address: str = ""
    level: str = "quick"
    strict: bool = False
    image: str | None = None
    gpu: str | None = None
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    lock: str | None = None
    stack: dict | None = None
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    suite_copied: bool = False
    versions: dict = field(default_factory=dict)
    suite_seconds: float = 0.0
    results: list = field(default_factory=list)
    outlier_pct: float = 10.0
    textfile_dir: str = ""
    textfile: dict = field(default_factory=dict)
    input_error: bool = False    # its validation stopped on bad input (an InputError)
    slurm: dict | None = None    # --via slurm: the job (id, final state, seconds it waited in the queue)

    @property
    def fleet_group(self) -> str | None:
        from gpuprov.validation.fleet import group_of

        if not self.results:
            return None
        return group_of(self.gpu, self.versions, bool(self.config.get("gpus_visible")), self.level)

    def details(self) -> dict:
        from gpuprov.validation.fleet import figures_of

        stack = self.stack or {}
        return {
            "address": self.address, "cluster_address": self.cluster_address, "counts": counts(self.results),
            "gpu": self.gpu, "level": self.level, "strict": self.strict, "image": self.image,
            "started": self.started, "seconds": round(self.seconds, 3), "suite_seconds": self.suite_seconds,
            "lock": self.lock,
            "stack": {"driver": (stack.get("driver") or {}).get("version"),
                      "cuda": (stack.get("cuda") or {}).get("version"), "pytorch": stack.get("pytorch"),
                      "ngc_pytorch": stack.get("ngc_pytorch")} if stack else None,
            "config": self.config, "env": self.env, "suite_copied": self.suite_copied, "versions": self.versions,
            "results": self.results,
            "fleet": {"group": self.fleet_group, "figures": figures_of(self.results)} if self.results else None,
            "textfile": self.textfile, **({"slurm": self.slurm} if self.slurm is not None else {}),
        }

    def to_dict(self) -> dict:
        """The common fields and validation's own; the status judged, the error always there (None when none)."""
        return {**super().to_dict(), "status": host_status(self.results, self.error), "error": self.reported_error()}

    def reported_error(self) -> dict | None:
        """The error as the report has it: whether the host was skipped (not started) and whether it was bad
        input, with only the tail of a long output."""
        if self.error is None:
            return None
        error = {**self.error, "skipped": self.status == "skipped", "input_error": self.input_error}
        output = error.get("output")
        if isinstance(output, str) and len(output) > REPORT_OUTPUT:
            error["output"] = (f"[gpuprov: the first {len(output) - REPORT_OUTPUT} characters of the output are "
                               f"left out of the report]\n" + output[-REPORT_OUTPUT:])
        return error


def counts(results: list[dict]) -> dict[str, int]:
    out = {"pass": 0, "fail": 0, "warn": 0, "skip": 0}
    for item in results:
        out[item["status"]] = out.get(item["status"], 0) + 1
    return out


def host_status(results: list[dict], error: dict | None) -> str:
    """error (validation did not finish), fail, warn, partial (some checks skipped) or pass (every check
    passed). A skip never counts as a pass."""
    if error:
        return "error"
    found = counts(results)
    if found["fail"]:
        return "fail"
    if found["warn"]:
        return "warn"
    if found["skip"] or not results:
        return "partial"
    return "pass"


def _stack(host, facts: dict, settings, options: RunOptions) -> tuple[dict | None, str | None, list[str]]:
    """The host's stack, lock and notices as provision sees them; on an OS gpuprov has no stack data for (and no
    lock governing the host), none: the suite runs without the stack's expectations, with the PyTorch wheel
    variant the inventory names (validate.torch_wheel), which such a host must name."""
    from gpuprov.stack.data import OS_KEYS
    from gpuprov.stack.host import LockUse, stack_for
    from gpuprov.stack.lock import lock_path_for

    os_facts = facts.get("os") or {}
    if os_facts.get("key") or lock_path_for(host, options.locks_dir) is not None:
        return stack_for(host, facts, LockUse(locks_dir=options.locks_dir))
    shown = os_facts.get("pretty_name") or "-".join(filter(None, (os_facts.get("id"), os_facts.get("version_id")))) \
        or "an unknown OS"
    if not settings.torch_wheel:
        raise InputError(f"gpuprov has no stack data for {shown}, so it cannot choose the PyTorch wheel variant of "
                         "the suite's venv", host=host.name, step="stack.resolve",
                         hint=f"set validate.torch_wheel for this host (cu128, cu129, cpu, ...); gpuprov's stacks "
                              f"cover {', '.join(OS_KEYS)}")
    return None, None, [f"gpuprov has no stack data for {shown} (its stacks cover {', '.join(OS_KEYS)}): the suite "
                        f"runs with validate.torch_wheel {settings.torch_wheel} and judges no driver or CUDA "
                        "version against a stack"]


class ValidateJob(HostJob):
    """`invoke validate`: the suite on each host (ValidationRecord), judged against the GPU's datasheet; then the
    fleet verdicts, the optional all-reduce across the hosts and the textfiles (finish), the JUnit report beside
    the JSON one (siblings), a table per host and the fleet summary. A host fails the run (exit 1) when a check
    failed or its textfile could not be placed."""

    kind = "validate"
    columns = ("host", "gpu", "status", "pass", "fail", "warn", "skip", "seconds", "detail")
    # gpuprov.validation.variables, and the stack's own (hardware, stack) that the expectations come from
    variables = ("validate", "workload", "data_dir", "cluster_address", "hardware", "stack")

    def __init__(self, options: RunOptions):
        super().__init__(options.dry_run)
        self.options = options
        self.started = time.time()
        self.multi_node: dict | None = None      # the all-reduce's summary, once finish ran it
        self.records: dict[str, ValidationRecord] = {}   # every host's record by name, failed hosts' too
        self.controller = None   # --via slurm: (runner, controller name) that submits the jobs (set by the task)
        self.stopping = threading.Event()   # set on Ctrl-C: --via slurm cancels its jobs

    def hooks(self, fleet):
        """--via slurm: the first Ctrl-C cancels the validation jobs pending or running (SlurmJob.wait)."""
        from gpuprov.core.batches import BatchHooks

        return BatchHooks(interrupted=self.stopping.set) if self.options.slurm is not None else None

    def new_record(self, host) -> ValidationRecord:
        """A host's record; the runtime also asks for one for a host that failed before its run began, and its
        entry is made from it: kept by name for finish."""
        record = ValidationRecord(host.name, address=host.address, level=self.options.level,
                                  strict=self.options.strict, image=self.options.image)
        self.records[host.name] = record
        return record

    def run_host(self, conn, say: Say) -> ValidationRecord:
        """The whole validation of one connected host (validate); a GpuprovError fails the host with the record
        so far attached (exc.run), saying whether it was bad input."""
        record = self.new_record(conn.host)
        started = time.monotonic()
        try:
            self.validate(conn, record, say)
            return record
        except GpuprovError as exc:
            record.input_error = isinstance(exc, InputError)
            exc.run = record
            raise
        finally:
            record.seconds = time.monotonic() - started

    def validate(self, conn, record: ValidationRecord, say: Say) -> None:
        """Facts, stack, suite config, the environment (a dry run stops once it is planned), the suite."""
        from gpuprov.facts.gather import gather
        from gpuprov.validation.env import (
            compiler_wanted,
            ensure_compiler,
            ensure_env,
            env_plan,
            probe_host,
            request_for,
            wheelhouse_for,
        )
        from gpuprov.validation.remote import Remote
        from gpuprov.validation.suite import push_suite, run_suite, suite_command, write_config
        from gpuprov.validation.suite_config import build_config, gpu_model, load_seconds, torch_wheel, validate_vars

        host, options, layout = conn.host, self.options, self.options.layout
        settings = validate_vars(host)
        record.cluster_address, record.outlier_pct, record.textfile_dir = (settings.cluster_address,
                                                                           settings.outlier_pct,
                                                                           settings.textfile_dir)
        say("facts")
        facts = gather(conn)
        record.stack, record.lock, record.notices = _stack(host, facts, settings, options)
        model = gpu_model(host, record.stack)
        record.gpu = model.key if model else None
        record.config = build_config(host, facts, record.stack, settings, level=options.level,
                                     strict=options.strict, image=options.image)
        remote = Remote(conn)
        if options.image is None:
            python = probe_host(remote, layout)
            pytorch = (record.stack or {}).get("pytorch") or {}
            request = request_for(python, torch_wheel(record.stack, settings),
                                  settings.torch_version or pytorch.get("version"), settings.torch_index)
            wheelhouse = wheelhouse_for(request, options.wheelhouse, say=say)
            if self.dry_run:
                record.env = {"mode": "venv", "request": request.key(), **env_plan(python, wheelhouse, options.only,
                                                                                    layout)}
                return
            say("python env")
            record.env = {"mode": "venv", "request": request.key(), **ensure_env(remote, python, wheelhouse, layout,
                                                                                say=say)}
            if compiler_wanted(options.only):   # torch.compile's g++, gcc and Python.h, from the distribution
                record.env["compiler"] = ensure_compiler(remote, python, layout, say=say)
            current = python.smoke_digest
        else:
            if facts.get("docker") is None:
                raise GpuprovError(f"--image {options.image} needs Docker on the host, and it has none",
                                   host=host.name, step="suite",
                                   hint="set container_engine: docker for the host and run provision, or "
                                        "validate without --image")
            record.env = {"mode": "image", "image": options.image}
            if self.dry_run:
                return
            current = remote.run(f"cat {shlex.quote(layout.smoke_marker)} 2>/dev/null || true", sudo=False,
                                 timeout=30).stdout
            current = current.strip() or None
        say("copy suite")
        record.suite_copied = push_suite(remote, current, layout)
        write_config(remote, record.config, layout)
        say(f"suite ({options.level})")
        suite_started = time.monotonic()
        command = suite_command(level=options.level, strict=options.strict,
                                only=list(options.only) if options.only else None, image=options.image,
                                layout=layout, ulimits=settings.image_ulimits)
        if options.slurm is None:
            document = run_suite(remote, command, options.level, record.config.get("datasheet"),
                                 load_seconds(record.config))
        else:
            document = self._suite_job(remote, host, command, record, load_seconds(record.config))
        record.suite_seconds = round(time.monotonic() - suite_started, 3)
        record.versions = document.get("versions") or {}
        record.results = document["results"]

    def _suite_job(self, remote, host, command: str, record: ValidationRecord, load_s: float) -> dict:
        """--via slurm: the suite as an exclusive job on the host's node, submitted on the Slurm controller; its
        output, read back from the node as root once the job left the queue, parsed as an SSH run's."""
        from gpuprov.core.controller import checked_node
        from gpuprov.validation.slurm_jobs import END_MARGIN_S, SlurmJob, sbatch_argv
        from gpuprov.validation.suite import TIMEOUTS, parse_document

        runner, where = self.controller
        options, layout = self.options, self.options.layout
        node = checked_node(host, "suite.slurm")
        seconds = TIMEOUTS[options.level] + load_s
        stem = f"{layout.run}/slurm-validate"
        output, error = f"{stem}.out", f"{stem}.err"
        q = shlex.quote
        # root's files of the last job removed first: a job that never wrote them is not read as this one's
        remote.run(f"rm -f {q(output)} {q(error)}", timeout=60, step="suite.slurm")
        job = SlurmJob(runner, where, host.name, stop=self.stopping)
        job_id = job.submit(sbatch_argv(node, command, output=output, error=error, seconds=seconds,
                                        options=options.slurm, gpus=record.config["expect"]["count"] or 0))
        record.slurm = {"job_id": job_id, "node": node, "controller": where}
        outcome = job.wait(options.slurm.start_deadline_s, seconds + END_MARGIN_S, options.slurm.poll_s)
        record.slurm.update(state=outcome.state, pending_s=outcome.pending_s)
        out = remote.run(f"cat {q(output)} 2>/dev/null; true", timeout=120, step="suite.slurm").stdout
        err = remote.run(f"cat {q(error)} 2>/dev/null; true", timeout=120, step="suite.slurm").stdout
        return parse_document(host.name, out, err, 0 if outcome.state == "COMPLETED" else 1,
                              f"validation job {job_id} ({outcome.state}): {command}", record.config.get("datasheet"))

    # -- the fleet's view ------------------------------------------------------------------------------------
    def failing(self, entry: dict) -> bool:
        """A check failed, or the host's textfile could not be placed."""
        return (any(item["status"] == "fail" for item in entry.get("results") or [])
                or bool((entry.get("textfile") or {}).get("error")))

    def finish(self, fleet, records: list, entries: list[dict]) -> dict:
        """The fleet verdicts, the all-reduce across the hosts (--multi-node), the entries made again from the
        records, each host's textfile placed on it (unless --no-textfile) and kept in <reports>/textfile/."""
        from gpuprov.validation.report import write_prometheus_textfile

        # a failed host's record (its entry was made from it) is kept by name: the all-reduce names it too
        runs = [record or self.records[entry["host"]] for record, entry in zip(records, entries, strict=True)]
        apply_fleet(runs, fleet.reports, self.options.strict)
        if self.options.multi_node:
            self.multi_node = _multi_node(fleet, runs, self.options, self.controller, self.stopping)
        finished = time.time()
        entries[:] = [run.to_dict() for run in runs]
        if self.options.textfile:
            _publish(fleet, runs, entries, finished)
        textfiles = {entry["host"]: str(write_prometheus_textfile(fleet.reports / "textfile" / f"{entry['host']}.prom",
                                                                  entry, finished)) for entry in entries}
        return {"finished": finished, "finished_epoch": finished, "multi_node": self.multi_node,
                "textfiles": textfiles}

    def siblings(self, report: Path, entries: list[dict]) -> dict[str, str]:
        """The JUnit report: the JSON report's name with .xml (and validate-latest.xml)."""
        from gpuprov.core.report import write_report_sibling
        from gpuprov.validation.report import junit_report

        return {"junit": str(write_report_sibling(report, self.kind, ".xml", junit_report(entries)))}

    def row(self, entry: dict) -> dict:
        found = entry.get("counts") or {}
        failed = [item for item in entry.get("results") or [] if item["status"] == "fail"]
        detail = (entry.get("error") or {}).get("error") or "; ".join(f"{i['check']}: {i['reason']}" for i in failed)
        return {"host": entry["host"], "gpu": entry.get("gpu") or "", "status": entry.get("status", ""),
                "pass": found.get("pass", 0), "fail": found.get("fail", 0), "warn": found.get("warn", 0),
                "skip": found.get("skip", 0), "seconds": f"{entry.get('seconds', 0):.1f}", "detail": detail[:160]}

    def print_details(self, entries: list[dict]) -> None:
        """Up to MATRIX_HOSTS hosts, a table per host (every check with its status, figures and reason; a host whose
        validation stopped: its error); past that, the compact host x check matrix and the failures (print_matrix).
        Then the all-reduce's verdict. Names, reasons and errors are printed as written."""
        from gpuprov.core.report import console, styled

        out = console()
        if len(entries) > MATRIX_HOSTS:
            print_matrix(entries, out)
        else:
            _print_tables(entries, out)
        summary = self.multi_node
        if summary:
            status = summary.get("status")
            out.print(styled(f"multi-node ({', '.join(summary.get('hosts', []))}, rendezvous "
                             f"{summary.get('rendezvous')}):"),
                      styled(str(status), "green" if status == "pass" else "bold red"),
                      styled(summary.get("reason") or ""))

    def title(self) -> str:
        return "validate: fleet summary"

    def report_fields(self) -> dict:
        options = self.options
        return {"level": options.level, "strict": options.strict, "image": options.image,
                "only": list(options.only) if options.only else None, "started": self.started}


def _print_tables(entries: list[dict], out) -> None:
    """A table per host: every check with its status, figures and reason; a host whose validation stopped: its
    error with its step, command, hint and the last lines of its output."""
    from rich.table import Table

    from gpuprov.core.report import styled

    for entry in entries:
        if entry.get("error") and not entry.get("results"):
            error = entry["error"]
            out.print(styled(f"{entry['host']}: validation stopped", "bold red"), styled(error.get("error") or ""))
            for key in ("step", "command", "hint"):
                if error.get(key):
                    out.print(styled(f"  {key}: {error[key]}"))
            lines = [line for line in str(error.get("output") or "").splitlines() if line.strip()]
            for line in lines[-3:]:
                out.print(styled(f"  output: {line}"))
            continue
        title = f"{entry['host']} ({entry.get('gpu') or 'GPU unknown'}, {entry.get('level')}" + (
            f", image {entry['image']}" if entry.get("image") else "") + ")"
        table = Table(title=styled(title), title_justify="left")
        for column in ("check", "status", "figures", "reason"):
            table.add_column(column, overflow="fold")
        for item in entry.get("results") or []:
            table.add_row(styled(item["check"]), styled(item["status"], STYLES.get(item["status"])),
                          styled(_figures_text(item.get("figures") or {})), styled(item["reason"]))
        out.print(table)


def print_matrix(entries: list[dict], out, width: int = 120) -> None:
    """The compact view of a large run: a line per host (failures first, then by name) with its status and one
    character per check (gpuprov.validation.matrix.GLYPHS), the checks' legend wrapped at `width`, then every
    failure (host, check, reason) on a line of its own."""
    from rich.text import Text

    from gpuprov.core.report import styled
    from gpuprov.validation.matrix import GLYPHS, cells, checks, failures, labels, ordered

    hosts = ordered(entries)
    names = checks(hosts)
    tags = labels(len(names))
    gap = " " if tags and len(tags[0]) > 1 else ""   # one-letter columns side by side, longer ones spaced
    legend = ", ".join(f"{GLYPHS[status]} {status}" for status in ("fail", "warn", "skip", "pass"))
    out.print(styled(f"validate: {len(hosts)} hosts x {len(names)} checks ({legend}, blank: not run)"),
              soft_wrap=True)
    name_width = max(len("host"), *(len(literal(str(entry["host"]))) for entry in hosts))
    status_width = max(len("status"), *(len(str(entry.get("status", ""))) for entry in hosts))
    out.print(styled(f"{'host':<{name_width}}  {'status':<{status_width}}  {gap.join(tags)}"), soft_wrap=True)
    for entry in hosts:
        status = str(entry.get("status", ""))
        line = Text.assemble(styled(f"{literal(str(entry['host'])):<{name_width}}  "),
                             styled(f"{status:<{status_width}}", STYLES.get(status)), "  ")
        for index, found in enumerate(cells(entry, names)):
            line.append_text(styled(gap * bool(index) + (GLYPHS[found] if found else " ").rjust(len(tags[index])),
                                    STYLES.get(found)))
        if entry.get("error") and not entry.get("results"):
            line.append_text(styled("  validation stopped", "bold red"))
        out.print(line, soft_wrap=True)
    line_text = "checks:"
    for tag, name in zip(tags, names, strict=True):   # "a fleet.perf.allreduce," items, never split
        item = f" {tag} {name}" + ("," if name != names[-1] else "")
        if len(line_text) + len(item) > width and line_text.strip():
            out.print(styled(line_text), soft_wrap=True)
            line_text = " " * len("checks:")
        line_text += item
    if names:
        out.print(styled(line_text), soft_wrap=True)
    found = failures(hosts)
    out.print(styled(f"failures: {len(found)}", "bold red" if found else "green"), soft_wrap=True)
    for host, check, reason in found:
        out.print(styled(f"  {host} {check}: {reason}"), soft_wrap=True)


def _figures_text(figures: dict, limit: int = 6) -> str:
    """A check's scalar figures for a table cell: key=value, the first `limit` of them."""
    parts = []
    for key, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str) or key == "per_gpu":
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts[:limit]) + (" ..." if len(parts) > limit else "")


def apply_fleet(runs: list[ValidationRecord], reports_dir: Path, strict: bool, now: float | None = None) -> None:
    """Add each host's fleet results (fleet.perf.matmul, ...) against this run's hosts and recent reports."""
    from gpuprov.validation.fleet import Sample, figures_of, outliers, recent_samples

    current = [Sample(r.host, r.fleet_group, figures_of(r.results), r.started) for r in runs
               if r.results and r.error is None and figures_of(r.results)]
    if not current:
        return
    found = outliers(current, recent_samples(reports_dir, now=now), {r.host: r.outlier_pct for r in runs}, strict)
    for run in runs:
        run.results.extend(found.get(run.host, []))


def _multi_node(fleet, runs: list[ValidationRecord], options: RunOptions, controller=None, stop=None) -> dict:
    """The all-reduce across the fleet's hosts, its runs on the fleet's connections (every host at once); with
    --via slurm in one Slurm allocation through srun (`controller`: (runner, name); `stop`: set on Ctrl-C). Each
    host gets its multinode.allreduce result. Returns the summary."""
    from gpuprov.validation.multinode import nodes_for, run_multinode
    from gpuprov.validation.suite_config import validate_vars

    def on_fleet(hosts: list, work, settings, **_) -> list:   # jump_of and on_event: the fleet's own
        return dataclasses.replace(fleet, settings=settings).run(hosts, work)

    nodes = nodes_for(runs, fleet.hosts, validate_vars)
    if options.slurm is not None:
        outcome = _srun(fleet, nodes, options, controller, stop)
    else:
            outcome = run_multinode(nodes, fleet.hosts, fleet.settings, jump_of=fleet.inventory.jump_host,
                                port=validate_vars(fleet.hosts[0]).rdzv_port, level=options.level,
                                image=options.image, layout=options.layout, on_event=fleet.on_event,
                                run_on_hosts=on_fleet)
    for run in runs:
        item = outcome["results"].get(run.host)
        if item is not None:
            run.results.append(item)
    return outcome["summary"]


def _srun(fleet, nodes: list, options: RunOptions, controller, stop) -> dict:
    """--multi-node --via slurm: gpuprov.validation.srun on the hosts' Slurm nodes, every host at once."""
    from gpuprov.core.controller import checked_node
    from gpuprov.validation.srun import Member, run_srun
    from gpuprov.validation.suite_config import validate_vars

    settings = dataclasses.replace(fleet.settings, parallel=max(1, len(fleet.hosts)), max_fail=None)
    everyone = dataclasses.replace(fleet, settings=settings)
    members = [Member(checked_node(host, "multi-node"), node) for host, node in zip(fleet.hosts, nodes, strict=True)]
    return run_srun(members, fleet.hosts, everyone.run, controller, options.slurm,
                    port=validate_vars(fleet.hosts[0]).rdzv_port, level=options.level, stop=stop,
                    layout=options.layout)


def _publish(fleet, runs: list[ValidationRecord], entries: list[dict], finished: float) -> None:
    """Each reachable host's textfile into its node_exporter textfile folder (no progress lines); the outcome goes
    into its entry."""
    from gpuprov.validation.report import prometheus_textfile

    by_name = {entry["host"]: entry for entry in entries}
    folders = {run.host: run.textfile_dir for run in runs if run.textfile_dir}
    unreachable = {name for name, entry in by_name.items()
                   if (entry.get("error") or {}).get("skipped") or (entry.get("error") or {}).get("step") == "connect"}
    targets = [h for h in fleet.hosts if h.name in folders and h.name not in unreachable]
    if not targets:
        return
    quiet = dataclasses.replace(fleet, on_event=lambda host, event: None)
    outcomes = quiet.run(targets, lambda conn: publish_textfile(
        conn, prometheus_textfile(by_name[conn.host.name], finished), folders[conn.host.name]))
    for outcome in outcomes:
        entry = by_name[outcome.host.name]
        entry["textfile"] = {"path": outcome.value} if outcome.ok else {
            "path": f"{folders[outcome.host.name]}/{TEXTFILE}", "error": str(outcome.error)}


def publish_textfile(conn, text: str, directory: str, name: str = TEXTFILE) -> str:
    """Place the host's Prometheus textfile `name` in node_exporter's textfile folder: a temporary file in that folder,
    renamed over the old one (node_exporter never reads half a file). Root writes only into a folder root alone
    can change (no symlink can be swapped in); another is refused. Returns its path."""
    from gpuprov.validation.remote import Remote

    folder = directory.rstrip("/")
    path = f"{folder}/{name}"
    Remote(conn, step="textfile").write_text(text, path, step="textfile", hint=(
        f"root writes the textfile only into a folder root alone can change: make {folder} and every folder above "
        f"it owned by root and writable by root alone (chown root:root {folder}; chmod 0755 {folder}; node_exporter "
        "only reads it), or set validate.textfile_dir to such a folder"))
    return path
