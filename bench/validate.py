"""Benchmark `validate` on lab hosts: the first run on fresh hosts (cold) and the quick suite again (warm), each
against a peer measured in the same run on the same hosts.

Fresh lab hosts (`--hosts`, default 2, recreated from the image) are provisioned (not measured). Then:
- cold: `python -m invoke validate --all --json --no-textfile`, the first run: the wheels pushed over SFTP, the
  venv built, torch.compile's compiler installed from the lab mirror, the whole quick suite with TorchInductor's
  cache empty; per host its phases from the report (env: stage, upload, install; compiler; suite; the rest:
  connect, facts, probe, suite copy);
- warm: the same command again, REPEAT times (median), which must push, build and install nothing;
- the floor of any warm run, per host: `ssh host true` + `ssh host VENV_PYTHON -c 'import torch'` (median);
- the cold peer, per host and all hosts at once as validate does: what an operator does by hand with OpenSSH
  for the same environment: `scp` of the same wheels, `python3 -m venv` and pip installing them (pip's own
  byte-compiling), in a folder of its own (/root/gpuprov-bench-peer, removed afterwards).
The verdicts are ratios: cold / warm, the env phase / the peer, warm / floor. Seconds are there for context only
(lab hosts share this machine's CPUs). Run by hand: `python bench/validate.py [--profile hgx-h100] [--hosts 2]
[--repeat 3]`; writes bench/results/validate-<UTC timestamp>.json.
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


PEER_DIR = "/root/gpuprov-bench-peer"


def parallel(argvs: list[list[str]]) -> float:
    """Wall time of processes run all at once (each must exit 0)."""
    started = time.monotonic()
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    for argv, proc in zip(argvs, procs, strict=True):
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:6])} ... exited {proc.returncode}:\n{out[-2000:]}{err[-2000:]}")
    return time.monotonic() - started


def phases(entry: dict) -> dict:
    """Seconds of one host's validate run by phase, from its report entry."""
    env = entry["env"]
    found = {f"env_{name}": seconds for name, seconds in (env.get("seconds") or {}).items()}
    found["compiler"] = (env.get("compiler") or {}).get("seconds", 0.0)
    found["suite"] = entry["suite_seconds"]
    found["other"] = round(entry["seconds"] - sum(found.values()), 3)
    found["host_total"] = entry["seconds"]
    return found


def peer_argvs(hosts, known_hosts: Path, wheelhouse: Path, requirements: list[str]) -> tuple[list, list]:
    """(scp of the wheels, venv + pip install) per host, with OpenSSH, as an operator would by hand."""
    wheels = sorted(str(path) for path in wheelhouse.glob("*.whl"))
    pip = next(Path(w).name for w in wheels if Path(w).name.startswith("pip-"))
    copy, install = [], []
    for host in hosts:
        copy.append(["scp", "-q", "-i", str(host.identity_file), "-P", str(host.port), "-o", "BatchMode=yes",
                     "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes", *wheels,
                     f"{host.user}@{host.address}:{PEER_DIR}/"])
        install.append(ssh_argv(host, known_hosts, f"python3 -m venv --without-pip {PEER_DIR}/venv && "
                                f"{PEER_DIR}/venv/bin/python {PEER_DIR}/{pip}/pip install --no-index --quiet "
                                f"--disable-pip-version-check --find-links {PEER_DIR} {' '.join(requirements)}"))
    return copy, install


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="hgx-h100", help="the lab profile of the hosts (default hgx-h100)")
    parser.add_argument("--hosts", type=int, default=2, help="fresh lab hosts (default 2)")
    parser.add_argument("--repeat", type=int, default=REPEAT, help=f"measured warm runs (default {REPEAT})")
    parser.add_argument("--plot", action="store_true",
                        help="draw the ratios as a PNG beside the JSON result (matplotlib; bench/plots.py)")
    args = parser.parse_args()

    import gpuprov.lab as lab
    from gpuprov.inventory import load_inventory
    from gpuprov.validation import Layout

    state = lab.up(args.hosts, [args.profile] * args.hosts, progress=log, fresh=True)
    inventory = load_inventory(state.paths.inventory)
    names = sorted(inventory.hosts)
    hosts = [inventory.hosts[name] for name in names]
    known_hosts = inventory.known_hosts
    work = Path(tempfile.mkdtemp(prefix="gpuprov-bench-validate-"))
    env = {**os.environ, "INVOKE_GPUPROV_LOCKS": str(work / "locks"), "INVOKE_GPUPROV_REPORTS": str(work / "reports")}
    where = ("--all", "--inventory", str(state.paths.inventory))
    log(f"bench: provisioning {', '.join(names)} (not measured)")
    timed(invoke_argv("provision", *where), env)

    def run_validate() -> tuple[float, dict]:
        wall, out = timed(invoke_argv("validate", *where, "--no-textfile", "--json"), env)
        entries = {entry["host"]: entry for entry in json.loads(out)["hosts"]}
        for name, entry in entries.items():
            if entry["error"] is not None or entry["level"] != "quick":
                raise SystemExit(f"validate on {name} did not run the quick suite: {entry['error']}")
        return wall, entries

    log(f"bench: cold validate on {len(hosts)} fresh hosts")
    cold_s, cold = run_validate()
    for name, entry in cold.items():
        if not (entry["env"]["installed"] and entry["env"]["uploaded"]):
            raise SystemExit(f"the cold run on {name} built no venv: {entry['env']}")
    log(f"bench: warm validate, {args.repeat} measured runs")
    warm_runs = []
    for _ in range(args.repeat):
        wall, entries = run_validate()
        for name, entry in entries.items():
            compiler = entry["env"].get("compiler") or {}
            if entry["env"]["installed"] or entry["env"]["uploaded"] or compiler.get("installed"):
                raise SystemExit(f"the warm run on {name} pushed or installed something: {entry['env']}")
        warm_runs.append((wall, entries))
    warm_s = statistics.median(wall for wall, _ in warm_runs)
    warm_suite = {name: statistics.median(e[name]["suite_seconds"] for _, e in warm_runs) for name in names}

    first = hosts[0]
    ssh_s = median_of(args.repeat, lambda: timed(ssh_argv(first, known_hosts, "true"))[0])
    torch_s = median_of(args.repeat, lambda: timed(ssh_argv(first, known_hosts, Layout().python, "-c",
                                                             "'import torch'"))[0])
    floor_s = ssh_s + torch_s

    wheelhouse = ROOT / "build" / "wheelhouse" / cold[names[0]]["env"]["request"]
    requirements = json.loads((wheelhouse / "wheelhouse.json").read_text())["requirements"]
    log(f"bench: the peer (scp + venv + pip install by hand) on {len(hosts)} hosts at once")
    parallel([ssh_argv(h, known_hosts, f"rm -rf {PEER_DIR} && mkdir -p {PEER_DIR}") for h in hosts])
    copy, install = peer_argvs(hosts, known_hosts, wheelhouse, requirements)
    peer_copy_s = parallel(copy)
    peer_install_s = parallel(install)
    parallel([ssh_argv(h, known_hosts, f"rm -rf {PEER_DIR}") for h in hosts])
    peer_s = peer_copy_s + peer_install_s

    cold_phases = {name: phases(entry) for name, entry in cold.items()}
    env_s = max(sum(v for k, v in found.items() if k.startswith("env_")) for found in cold_phases.values())
    print(f"\nvalidate on {len(hosts)} fresh {args.profile} lab hosts ({os.cpu_count()} CPUs shared)")
    print(f"{'what':<58} {'s':>8} {'ratio':>8}")
    rows = [("cold: first validate, all hosts (CLI)", cold_s, cold_s / warm_s, "/ warm"),
            ("warm: validate again, all hosts (CLI, median)", warm_s, warm_s / floor_s, "/ floor"),
            ("floor: ssh true + import torch (one host)", floor_s, 1.0, ""),
            ("cold env (stage + upload + install), slowest host", env_s, env_s / peer_s, "/ peer"),
            ("peer: scp + venv + pip install by hand, all hosts", peer_s, 1.0, ""),
            ("  peer scp", peer_copy_s, peer_copy_s / peer_s, "/ peer"),
            ("  peer venv + pip install", peer_install_s, peer_install_s / peer_s, "/ peer")]
    for what, seconds, ratio, unit in rows:
        print(f"{what:<58} {seconds:>8.2f} {ratio:>8.2f} {unit}")
    print("\ncold run per host and phase (s): " + ", ".join(cold_phases[names[0]]))
    for name in names:
        print(f"  {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in cold_phases[name].items())
              + f"; warm suite {warm_suite[name]:.1f}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"validate-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps({
        "hosts": names, "profile": args.profile, "repeat": args.repeat, "cpus": os.cpu_count(),
        "cold_s": round(cold_s, 3), "warm_s": round(warm_s, 3), "floor_s": round(floor_s, 3),
        "ssh_true_s": round(ssh_s, 3), "import_torch_s": round(torch_s, 3), "cold_env_s": round(env_s, 3),
        "peer_s": round(peer_s, 3), "peer_scp_s": round(peer_copy_s, 3), "peer_install_s": round(peer_install_s, 3),
        "cold_per_warm": round(cold_s / warm_s, 3), "warm_per_floor": round(warm_s / floor_s, 3),
        "cold_env_per_peer": round(env_s / peer_s, 3), "cold_phases": cold_phases, "warm_suite_s": warm_suite,
        "cold_compiler": {name: entry["env"].get("compiler") for name, entry in cold.items()},
    }, indent=1) + "\n", encoding="utf-8")
    print(f"\nwritten: {out.relative_to(ROOT)}")
    if args.plot:
        from plots import plot_result

        print(f"figure: {plot_result(out)}")


if __name__ == "__main__":
    main()
