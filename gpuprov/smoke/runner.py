"""The suite's runner: `python -m smoke --config FILE [--only a,b] [--level quick|burn-in] [--strict] [--textfile P]`.

It imports every module of the suite's folder (all `*.py` but core, isolation, runner and __main__: the suite is a plain
folder on the host, so the file listing is the registry's source), selects the registered checks for the level
(and `--only`: exact names or a group prefix such as `host`), and runs each in a child forked from the runner, in its
own process group, under the check's timeout (the runner imports torch once, after a child showed it imports,
so the checks do not pay its import each): a check hung in a GPU or NCCL call is killed with everything it
started and reported as fail "timed out after N s". A module that fails to import is a fail result of its own
(`import:<module>`), so a broken check is never silently missing.

It prints ONE JSON document on stdout (progress goes to stderr):

    {"schema": 1, "host": str, "level": str, "strict": bool, "started": ISO 8601 UTC, "seconds": float,
     "versions": {"python", "torch", "cuda", "cudnn", "nccl", "onnxruntime", "onnx", "numpy", "driver", "dcgm",
                  "docker"},
     "results": [Result.to_dict(), ...]}

`--textfile PATH` also writes the results as a Prometheus textfile (gpuprov.smoke.textfile), replaced atomically.
`--strict` (or the config's `strict`) turns skip and warn into fail, the reason kept behind "strict: ". Exit
status: 0 when no result failed, 1 when one did, 2 for bad usage (unreadable config, unknown check).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import re
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from .core import FAIL, LEVELS, PACKAGE, REGISTRY, SKIP, STATUSES, SUITE_DIR, WARN, Check, Context, Result
from .isolation import fork_is_safe, on_term, run_isolated
from .textfile import validation_textfile, write_textfile

SCHEMA = 1
NOT_CHECKS = {"__init__", "__main__", "core", "isolation", "runner", "textfile"}
GROUPS = ("host", "sizing", "software", "train", "infer", "perf", "tools")
TORCH_GROUPS = ("train", "infer", "perf")   # the checks that import torch
VERSIONS_TIMEOUT = 120


class UsageError(Exception):
    """Bad arguments or config: exit 2."""


def module_names(folder: Path = SUITE_DIR) -> list[str]:
    """The suite's modules other than the runner's own, by file listing."""
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in NOT_CHECKS and not p.stem.startswith("."))


def discover(folder: Path = SUITE_DIR) -> tuple[dict[str, str], list[Result]]:
    """Import every module; returns (check name -> module name, a fail result per module that did not import)."""
    failures = []
    for name in module_names(folder):
        try:
            importlib.import_module(f"{PACKAGE}.{name}")
        except Exception as exc:
            failures.append(Result(f"import:{name}", FAIL, f"module {name}.py does not import: "
                                                           f"{type(exc).__name__}: {exc}"))
    owners = {}
    for check in REGISTRY.values():
        module = getattr(check.fn, "__module__", "") or ""
        owners[check.name] = module.rsplit(".", 1)[-1]
    return owners, failures


def _order(check: Check) -> tuple:
    group = check.name.split(".")[0]
    return (GROUPS.index(group) if group in GROUPS else len(GROUPS), check.name)


def select(level: str, only: str | None) -> list[Check]:
    """The checks to run at `level`, narrowed by --only (exact names or group prefixes, comma-separated)."""
    chosen = [c for c in REGISTRY.values() if level in c.levels]
    if only:
        tokens = [t.strip() for t in only.split(",") if t.strip()]
        wanted = set()
        for token in tokens:
            matched = {c.name for c in REGISTRY.values() if c.name == token or c.name.startswith(token + ".")}
            if not matched:
                raise UsageError(f"--only {token}: no such check (checks: {', '.join(sorted(REGISTRY))})")
            if not matched & {c.name for c in chosen}:
                raise UsageError(f"--only {token}: does not run at level {level}")
            wanted |= matched
        chosen = [c for c in chosen if c.name in wanted]
    return sorted(chosen, key=_order)


def _valid(data, name: str) -> str | None:
    """Why a child's result is not a valid Result for check `name` (None when it is)."""
    if not isinstance(data, dict):
        return "not an object"
    if data.get("check") != name:
        return f"it names check {data.get('check')!r}"
    if data.get("status") not in STATUSES:
        return f"unknown status {data.get('status')!r}"
    if not isinstance(data.get("reason"), str) or not data["reason"].strip():
        return "it gives no reason"
    if not isinstance(data.get("figures"), dict) or not isinstance(data.get("thresholds"), dict):
        return "figures and thresholds must be objects"
    if not isinstance(data.get("seconds"), (int, float)):
        return "seconds must be a number"
    return None


def run_check(check: Check, module: str, config: dict) -> Result:
    """Run one check in a forked child, in its own process group, under its timeout (with the load time the
    config asks of it: the burn-in)."""
    timeout = check.timeout_for(config)
    data, rc, tail, seconds = run_isolated(lambda path: run_one(check.name, module, config, path), timeout,
                                           ["--one", check.name, "--module", module])
    if rc is None:
        return Result(check.name, FAIL, f"timed out after {timeout:g} s" + (f" (last output: {tail})"
                                                                              if tail else ""),
                      {}, {"timeout_s": timeout}, round(seconds, 3))
    if data is None:
        how = f"exited with code {rc}" if rc >= 0 else f"was killed by signal {-rc}"
        return Result(check.name, FAIL, f"the check's process {how} without a result"
                      + (f": {tail}" if tail else ""), {}, {}, round(seconds, 3))
    problem = _valid(data, check.name)
    if problem:
        return Result(check.name, FAIL, f"the check returned an invalid result ({problem})", {}, {},
                      round(seconds, 3))
    return Result(data["check"], data["status"], data["reason"], data["figures"], data["thresholds"],
                  round(float(data["seconds"]) or seconds, 3))


def apply_strict(result: Result) -> Result:
    """--strict: a skip or a warn is a fail, its reason kept."""
    if result.status in (SKIP, WARN):
        return Result(result.check, FAIL, "strict: " + result.reason, result.figures, result.thresholds,
                      result.seconds)
    return result


# ---- inside the child (a fork of the runner, or `--one` from the command line) ---------------------------------------


def _write(path: str, data) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, default=str)
    os.replace(tmp, path)


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {os.path.basename(last.filename)}:{last.lineno})"


def run_one(name: str, module: str, config: dict, result_path: str) -> int:
    """Child side of run_check: import the check's module, run it, write its Result as JSON."""
    start = time.monotonic()
    ctx = Context(config)
    try:
        importlib.import_module(f"{PACKAGE}.{module}")
        result = REGISTRY[name].fn(ctx)
        if not isinstance(result, Result):
            result = Result(name, FAIL, f"the check returned {type(result).__name__}, not a Result")
    except Exception as exc:
        result = Result(name, FAIL, f"the check raised {type(exc).__name__}: {exc}{_where(exc)}")
    if not result.seconds:
        result.seconds = round(time.monotonic() - start, 3)
    _write(result_path, result.to_dict())
    return 0


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def collect_versions(config: dict) -> dict:
    """Versions of everything the suite uses (None where absent)."""
    versions = {"python": platform.python_version(), "torch": None, "cuda": None, "cudnn": None, "nccl": None,
                "onnxruntime": _dist_version("onnxruntime", "onnxruntime-gpu"), "onnx": _dist_version("onnx"),
                "numpy": _dist_version("numpy"), "driver": None, "dcgm": None, "docker": None}
    try:
        software = importlib.import_module(f"{PACKAGE}.software")
        versions.update(software.torch_versions())
    except ImportError:
        versions["torch"] = _dist_version("torch")
    except Exception as exc:
        versions["torch_error"] = f"{type(exc).__name__}: {exc}"
    ctx = Context(config)
    try:
        nvsmi = importlib.import_module(f"{PACKAGE}.nvsmi")
        versions["driver"] = nvsmi.query(ctx)[0]["driver_version"]
    except Exception:
        versions["driver"] = None
    rc, out, _ = ctx.run(["dcgmi", "--version"], timeout=20)
    match = re.search(r"version:\s*(\S+)", out) if rc == 0 else None
    versions["dcgm"] = match.group(1) if match else None
    runtime = (config.get("container") or {}).get("runtime")
    if runtime:
        rc, out, _ = ctx.run([runtime, "--version"], timeout=20)
        versions["docker" if runtime == "docker" else runtime] = out.strip() if rc == 0 else None
    return versions


def versions_child(config: dict, result_path: str) -> int:
    _write(result_path, collect_versions(config))
    return 0


# ---- the parent ----------------------------------------------------------------------------------------------------


def _load_config(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the config {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise UsageError(f"the config {path} is not a JSON object")
    return config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}", description="gpuprov's host validation suite")
    parser.add_argument("--config", required=True, help="the suite config (JSON) written by the controller")
    parser.add_argument("--only", help="comma-separated check names or group prefixes (host, train, ...)")
    parser.add_argument("--level", choices=LEVELS, help="quick (default) or burn-in")
    parser.add_argument("--strict", action="store_true", help="skip and warn count as fail")
    parser.add_argument("--list", action="store_true", help="list the checks for the level and exit")
    parser.add_argument("--textfile", help="also write the results as a Prometheus textfile to this path "
                                           "(node_exporter's textfile collector folder)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--module", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--versions", action="store_true", help=argparse.SUPPRESS)
    return parser


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def preload_torch(versions: dict) -> str:
    """Import torch in the runner once, so that every check's forked child has it without paying the import
    (seconds each). Only after the version probe, a child, imported it cleanly: a torch that crashes or hangs on
    import takes down a child, never the runner. Importing torch does not initialise CUDA (that happens at the
    first CUDA call, in a check's child), so forking after it is safe; the runner itself makes no torch call.
    A CPU build (no CUDA to initialise at all) also gets torch._dynamo, which optimizers, DDP and torch.compile
    import (a second or more each). Returns what was imported ("" for nothing)."""
    if not versions.get("torch") or versions.get("torch_error"):
        return ""
    try:
        import torch
    except Exception:  # noqa: BLE001 - the checks import it again and report what goes wrong
        return ""
    if getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None):
        return "torch"
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001 - as above
        return "torch"
    return "torch, torch._dynamo"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = _load_config(args.config)
        level = args.level or config.get("level") or "quick"
        if level not in LEVELS:
            raise UsageError(f"level {level!r} is not one of {', '.join(LEVELS)}")
        config = dict(config, level=level)
        if args.one:
            return run_one(args.one, args.module, config, args.result)
        if args.versions:
            return versions_child(config, args.result)
        started = datetime.datetime.now(datetime.timezone.utc)
        begin = time.monotonic()
        owners, failures = discover()
        checks = select(level, args.only)
    except UsageError as exc:
        print(f"{PACKAGE}: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for check in checks:
            print(f"{check.name}\ttimeout {check.timeout_for(config):g} s\tlevels {','.join(check.levels)}")
        return 0
    strict = bool(args.strict or config.get("strict"))
    signal.signal(signal.SIGTERM, on_term)
    data, rc, tail, _ = run_isolated(lambda path: versions_child(config, path), VERSIONS_TIMEOUT)
    versions = data if isinstance(data, dict) else {"python": platform.python_version(),
                                                      "error": f"version probe failed (exit {rc}): {tail}"}
    preloaded = preload_torch(versions) if any(c.name.split(".")[0] in TORCH_GROUPS or c.name == "software"
                                               for c in checks) else ""
    forked = fork_is_safe(os.path.abspath(args.config), level)
    how = (f"children forked after importing {preloaded}" if preloaded else "forked children") if forked else \
        "fresh interpreters (the runner loaded the CUDA driver)"
    _progress(f"checks run in {how}")
    results = list(failures)
    for check in checks:
        result = run_check(check, owners.get(check.name, ""), config)
        _progress(f"{check.name}: {result.status} ({result.seconds:.1f} s) {result.reason[:160]}")
        results.append(result)
    if strict:
        results = [apply_strict(r) for r in results]
    document = {
        "schema": SCHEMA,
        "host": config.get("host") or socket.gethostname(),
        "level": level,
        "strict": strict,
        "started": started.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - begin, 3),
        "versions": versions,
        "results": [r.to_dict() for r in results],
    }
    sys.stdout.write(json.dumps(document, default=str) + "\n")
    sys.stdout.flush()
    if args.textfile:
        write_textfile(args.textfile, validation_textfile(document["host"], document["results"], time.time()))
    return 1 if any(r.status == FAIL for r in results) else 0
