"""Benchmark `validate`'s quick suite on a provisioned lab host against the floor of any such run on that host.

The floor, measured in the same run on the same host: one SSH session (`ssh host true`) plus importing torch in
the suite's venv (`ssh host /opt/gpuprov/venv/bin/python -c 'import torch'`): what every run of a PyTorch suite
over SSH pays before it measures anything. Measured, REPEAT times each (the median kept), after one run of each
that is not measured (caches warm):
- validate: the CLI process `python -m invoke validate --host H --json --no-textfile` (the whole quick suite,
  start-up included), and the suite's own time on the host (`suite_seconds` of its report);
- the floor: `ssh host true` and `ssh host VENV_PYTHON -c 'import torch'`, one process each.
The figures are validate / floor and suite / floor; seconds are there for context only (lab hosts share this
machine's CPUs). Not measured: bringing up the host, provisioning it, building the suite's venv.
Run by hand: `python bench/validate.py [--profile hgx-h100] [--repeat 3]`; writes
bench/results/validate-<UTC timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

REPEAT = 3
RUN_TIMEOUT_S = 1800


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def timed(argv: list[str], env: dict | None = None) -> tuple[float, str]:
    """Wall time of one process run to completion (it must exit 0), and its stdout."""
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... exited {proc.returncode}:\n"
                         f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, proc.stdout


def invoke_argv(task: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "invoke", task, *args]


def ssh_argv(host, known_hosts: Path, *command: str) -> list[str]:
    return ["ssh", "-i", str(host.identity_file), "-p", str(host.port), "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
            f"{host.user}@{host.address}", *command]


def median_of(repeat: int, measure) -> float:
    measure()   # warm-up, not counted
    return statistics.median(measure() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="hgx-h100", help="the lab profile of the one host (default hgx-h100)")
    parser.add_argument("--repeat", type=int, default=REPEAT, help=f"measured runs of each (default {REPEAT})")
    args = parser.parse_args()

    import gpuprov.lab as lab
    from gpuprov.inventory import load_inventory
    from gpuprov.validation import Layout

    state = lab.up(1, [args.profile], progress=log)
    inventory = load_inventory(state.paths.inventory)
    [name] = sorted(inventory.hosts)
    host = inventory.hosts[name]
    work = Path(tempfile.mkdtemp(prefix="gpuprov-bench-validate-"))
    env = {**os.environ, "INVOKE_GPUPROV_LOCKS": str(work / "locks"), "INVOKE_GPUPROV_REPORTS": str(work / "reports")}
    where = ("--host", name, "--inventory", str(state.paths.inventory))
    log(f"bench: provisioning {name} and building the suite's venv (not measured)")
    timed(invoke_argv("provision", *where), env)
    timed(invoke_argv("validate", *where, "--only", "host.shm", "--no-textfile", "--json"), env)

    suite: list[float] = []

    def validate() -> float:
        wall, out = timed(invoke_argv("validate", *where, "--no-textfile", "--json"), env)
        [entry] = json.loads(out)["hosts"]
        if entry["error"] is not None or entry["level"] != "quick":
            raise SystemExit(f"validate on {name} did not run the quick suite: {entry['error']}")
        suite.append(entry["suite_seconds"])
        return wall

    known_hosts = inventory.known_hosts
    log(f"bench: validate's quick suite and the floor on {name}, {args.repeat} measured runs each")
    validate_s = median_of(args.repeat, validate)
    suite_s = statistics.median(suite[1:])
    ssh_s = median_of(args.repeat, lambda: timed(ssh_argv(host, known_hosts, "true"))[0])
    torch_s = median_of(args.repeat, lambda: timed(ssh_argv(host, known_hosts, Layout().python, "-c",
                                                             "'import torch'"))[0])
    floor_s = ssh_s + torch_s
    rows = [("validate, the whole quick suite (CLI)", validate_s), ("the suite on the host (suite_seconds)", suite_s),
            ("floor: ssh true + import torch", floor_s), ("  ssh host true", ssh_s), ("  import torch", torch_s)]
    print(f"\nquick suite on {name} ({args.profile}), median of {args.repeat}")
    print(f"{'what':<40} {'s':>8} {'/ floor':>8}")
    for what, seconds in rows:
        print(f"{what:<40} {seconds:>8.2f} {seconds / floor_s:>8.2f}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"validate-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps({
        "host": name, "profile": args.profile, "repeat": args.repeat, "cpus": os.cpu_count(),
        "validate_s": round(validate_s, 3), "suite_s": round(suite_s, 3), "floor_s": round(floor_s, 3),
        "ssh_true_s": round(ssh_s, 3), "import_torch_s": round(torch_s, 3),
        "validate_per_floor": round(validate_s / floor_s, 3), "suite_per_floor": round(suite_s / floor_s, 3),
    }, indent=1) + "\n", encoding="utf-8")
    print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
