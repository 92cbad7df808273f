"""Validate one host: facts, its stack (the lock's when one governs it), the suite config, the Python
environment (or the container image), the suite run; and the run-level steps that need every host's
results: fleet outliers, the exit code, the Prometheus textfile placed on each host."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.validation import LAYOUT, Layout

TEXTFILE = "gpuprov_validate.prom"
REPORT_OUTPUT = 65536   # characters of a stopped host's output its report entry keeps (the tail)


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


@dataclass
class HostValidation:
    """Everything validation found on one host: the JSON report's host entry (to_dict)."""

    host: str
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
    notices: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    suite_copied: bool = False
    versions: dict = field(default_factory=dict)
    suite_seconds: float = 0.0
    results: list = field(default_factory=list)
    error: dict | None = None
    outlier_pct: float = 10.0
    textfile_dir: str = ""
    textfile: dict = field(default_factory=dict)

    @property
    def fleet_group(self) -> str | None:
        from gpuprov.validation.fleet import group_of

        if not self.results:
            return None
        return group_of(self.gpu, self.versions, bool(self.config.get("gpus_visible")), self.level)

    def to_dict(self) -> dict:
        from gpuprov.validation.fleet import figures_of

        stack = self.stack or {}
        return {
            "host": self.host, "address": self.address, "cluster_address": self.cluster_address,
            "status": host_status(self.results, self.error), "counts": counts(self.results), "gpu": self.gpu,
            "level": self.level, "strict": self.strict, "image": self.image, "started": self.started,
            "seconds": round(self.seconds, 3), "suite_seconds": self.suite_seconds, "lock": self.lock,
            "stack": {"driver": (stack.get("driver") or {}).get("version"),
                      "cuda": (stack.get("cuda") or {}).get("version"), "pytorch": stack.get("pytorch"),
                      "ngc_pytorch": stack.get("ngc_pytorch")} if stack else None,
            "notices": self.notices, "config": self.config, "env": self.env, "suite_copied": self.suite_copied,
            "versions": self.versions, "results": self.results, "error": self.error,
            "fleet": {"group": self.fleet_group, "figures": figures_of(self.results)} if self.results else None,
            "textfile": self.textfile,
        }


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
    from gpuprov.errors import InputError
    from gpuprov.provision import Options, stack_for
    from gpuprov.stack.data import OS_KEYS
    from gpuprov.stack.lock import lock_path_for

    os_facts = facts.get("os") or {}
    if os_facts.get("key") or lock_path_for(host, options.locks_dir) is not None:
        return stack_for(host, facts, Options(locks_dir=options.locks_dir))
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


def validate_host(conn, host, options: RunOptions, say: Callable[[str], None] = lambda what: None) -> HostValidation:
    """The whole validation of one connected host. Raises GpuprovError with the run so far attached (.run)."""
    from gpuprov.facts.gather import gather
    from gpuprov.ops import MANAGED_FILES
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

    started = time.monotonic()
    run = HostValidation(host.name, address=host.address, level=options.level, strict=options.strict,
                         image=options.image)
    layout = options.layout
    try:
        settings = validate_vars(host)
        run.cluster_address, run.outlier_pct, run.textfile_dir = (settings.cluster_address, settings.outlier_pct,
                                                                  settings.textfile_dir)
        say("facts")
        facts = gather(conn, MANAGED_FILES)
        run.stack, run.lock, run.notices = _stack(host, facts, settings, options)
        model = gpu_model(host, run.stack)
        run.gpu = model.key if model else None
        run.config = build_config(host, facts, run.stack, settings, level=options.level, strict=options.strict,
                                  image=options.image)
        remote = Remote(conn)
        if options.image is None:
            python = probe_host(remote, layout)
            pytorch = (run.stack or {}).get("pytorch") or {}
            request = request_for(python, torch_wheel(run.stack, settings),
                                  settings.torch_version or pytorch.get("version"), settings.torch_index)
            wheelhouse = wheelhouse_for(request, options.wheelhouse, say=say)
            if options.dry_run:
                run.env = {"mode": "venv", "request": request.key(), **env_plan(python, wheelhouse, options.only,
                                                                                 layout)}
                return run
            say("python env")
            run.env = {"mode": "venv", "request": request.key(), **ensure_env(remote, python, wheelhouse, layout,
                                                                             say=say)}
            if compiler_wanted(options.only):   # torch.compile's g++, gcc and Python.h, from the distribution
                run.env["compiler"] = ensure_compiler(remote, python, layout, say=say)
            current = python.smoke_digest
        else:
            if facts.get("docker") is None:
                raise GpuprovError(f"--image {options.image} needs Docker on the host, and it has none",
                                   host=host.name, step="suite",
                                   hint="set container_engine: docker for the host and run provision, or "
                                        "validate without --image")
            run.env = {"mode": "image", "image": options.image}
            if options.dry_run:
                return run
            current = remote.run(f"cat {shlex.quote(layout.smoke_marker)} 2>/dev/null || true", sudo=False,
                                 timeout=30).stdout
            current = current.strip() or None
        say("copy suite")
        run.suite_copied = push_suite(remote, current, layout)
        write_config(remote, run.config, layout)
        say(f"suite ({options.level})")
        suite_started = time.monotonic()
        document = run_suite(remote, suite_command(level=options.level, strict=options.strict,
                                                   only=list(options.only) if options.only else None,
                                                   image=options.image, layout=layout,
                                                   ulimits=settings.image_ulimits), options.level,
                             run.config.get("datasheet"), load_seconds(run.config))
        run.suite_seconds = round(time.monotonic() - suite_started, 3)
        run.versions = document.get("versions") or {}
        run.results = document["results"]
        return run
    except GpuprovError as exc:
        exc.run = run
        raise
    finally:
        run.seconds = time.monotonic() - started


def failed_run(outcome) -> HostValidation:
    """The HostValidation of a host whose validation stopped, with its error."""
    run = getattr(outcome.error, "run", None)
    if not isinstance(run, HostValidation):
        run = HostValidation(outcome.host.name, address=outcome.host.address)
    from gpuprov.errors import InputError

    run.error = outcome.error.to_dict() | {"skipped": outcome.skipped,
                                           "input_error": isinstance(outcome.error, InputError)}
    output = run.error.get("output")
    if isinstance(output, str) and len(output) > REPORT_OUTPUT:
        run.error["output"] = (f"[gpuprov: the first {len(output) - REPORT_OUTPUT} characters of the output are "
                               f"left out of the report]\n" + output[-REPORT_OUTPUT:])
    run.results = []
    return run


def apply_fleet(runs: list[HostValidation], reports_dir: Path, strict: bool, now: float | None = None) -> None:
    """Add each host's fleet results (fleet.perf.matmul, ...) against this run's hosts and recent reports."""
    from gpuprov.validation.fleet import Sample, figures_of, outliers, recent_samples

    current = [Sample(r.host, r.fleet_group, figures_of(r.results), r.started) for r in runs
               if r.results and r.error is None and figures_of(r.results)]
    if not current:
        return
    found = outliers(current, recent_samples(reports_dir, now=now), {r.host: r.outlier_pct for r in runs}, strict)
    for run in runs:
        run.results.extend(found.get(run.host, []))


def exit_code(hosts: list[dict]) -> int:
    """From the report's host entries: 0 every host validated and no check failed; 1 a check failed or a host
    could not be validated; 2 every problem was bad input (an inventory variable, a lock)."""
    errors = [h for h in hosts if h.get("error")]
    failed = [h for h in hosts if any(item["status"] == "fail" for item in h.get("results") or [])]
    if not errors and not failed:
        return 0
    if not failed and all(h["error"].get("input_error") for h in errors):
        return 2
    return 1


def publish_textfile(conn, text: str, directory: str) -> str:
    """Place the host's Prometheus textfile in node_exporter's textfile folder: a temporary file in that folder,
    renamed over the old one (node_exporter never reads half a file). Root writes only into a folder root alone
    can change (no symlink can be swapped in); another is refused. Returns its path."""
    from gpuprov.validation.remote import Remote

    folder = directory.rstrip("/")
    path = f"{folder}/{TEXTFILE}"
    Remote(conn, step="textfile").write_text(text, path, step="textfile", hint=(
        f"root writes the textfile only into a folder root alone can change: make {folder} and every folder above "
        f"it owned by root and writable by root alone (chown root:root {folder}; chmod 0755 {folder}; node_exporter "
        "only reads it), or set validate.textfile_dir to such a folder"))
    return path
