"""Benchmark `invoke rollout` (issue 20, scenario 1) against the same hosts moved one by one by hand.

Four L40S lab hosts in a real Slurm cluster (`gpuprov.lab.up(..., slurm=True)`), all on the older of the lab's
driver branches under the group lock `gpu`, jobs running on two of them (`--jobs 80,150`: one `sleep` job per
busy host). Both arms move all four hosts to the newest stack, in the same run, from the same start:

- gpuprov: `python -m invoke rollout --group gpu --update-lock --batch 1 --max-unavailable 50% --validate quick
  --checks host.gpus,host.pcie`;
- by hand, as an operator would script it, one host at a time, idle hosts first, then the busy ones, soonest
  free first: `scontrol update nodename=X state=drain reason=...` on the controller, `squeue -h -w X` every 5 s
  until empty, `invoke provision --host X --update-lock` (it reboots when needed), `invoke validate --host X
  --only host.gpus,host.pcie`, `scontrol update nodename=X state=resume`.

Before each arm (not measured) the fleet goes back to the old stack: a fresh locks folder holding the saved old
lock, `invoke provision --group gpu` (the lock is installed exactly, downgrades allowed), then the same jobs are
submitted and the arm starts once they run. Measured: wall time from the arm's start until every host is done;
each host's wait for its jobs, from its drain to its node drained with no job left (gpuprov: the journal's first
`draining` and `drained` entries, whole seconds; by hand: the same moments on this machine's clock); the time
without the waits (wall less the waits: both arms move one host at a time, so that is all the rest, each tool's own
start, plans, polls and resumes included); and drained -> resumed summed over the hosts (the journal's `drained`
and `resumed`; by hand: from squeue empty to the resume).
Judged from outside both tools after each arm: every job COMPLETED (scontrol), every node idle without a reason
(sinfo), the newest driver branch installed (dpkg on the hosts), the group lock file moved to it, and
`invoke stack.check --group gpu` without a mismatch. Writes bench/results/rollout-<UTC timestamp>.json.

Run by hand under the lab lock: `flock /tmp/gpuprov-lab.lock env GPUPROV_KEEP_LAB=1 python bench/rollout.py
[--jobs 80,150] [--repeat N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

HOSTS = 4
PROFILE = "l40s"
GROUP = "gpu"
CHECKS = "host.gpus,host.pcie"
POLL_S = 5.0                 # the hand-written script's squeue poll, as gpuprov's own
RUN_TIMEOUT_S = 3600
IDLE_TIMEOUT_S = 180         # a node's wait to be idle again in Slurm after a reset or an arm (not measured)
# the driver packages NVIDIA's branches install: nvidia-driver-<br>[-open] up to 580, nvidia-driver from 590
DRIVER = "dpkg-query -W -f '${db:Status-Abbrev}|${Package}|${Version}\\n' 'nvidia-driver*' 2>/dev/null || true"


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ArmFailed(Exception):
    """A command of an arm failed: its text is what the command said."""


def invoke(env: dict, *args: str, codes: tuple[int, ...] = (0,)) -> str:
    """`python -m invoke ARGS` from the repository root; its stdout, ArmFailed with its output when its exit code
    is not one of `codes`."""
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env={**os.environ, **env},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode not in codes:
        raise ArmFailed(f"`invoke {' '.join(args)}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                        f"{proc.stderr[-3000:]}")
    return proc.stdout


def on_host(state, name: str, command: str) -> str:
    """A shell command inside a lab host (the bench's own view, not gpuprov's)."""
    proc = subprocess.run(["docker", "exec", state.host(name).container_id, "sh", "-c", command],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise ArmFailed(f"{name}: `{command}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def branch_of(state, name: str) -> str:
    """The driver branch dpkg has installed (nvidia-driver-580-open `580.95.05-1` -> 580), or every branch found
    joined with `+` when the host holds more than one."""
    found = set()
    for line in on_host(state, name, DRIVER).splitlines():
        status, _package, version = line.split("|")
        if status[1:2] == "i":
            found.add(version.split(".", 1)[0])
    return "+".join(sorted(found)) or "none"


def folders(work: Path, label: str, old_lock: Path) -> dict:
    """A fresh locks folder holding only the old group lock, and a fresh reports folder: the env of one arm."""
    base = work / label
    shutil.rmtree(base, ignore_errors=True)
    (base / "locks").mkdir(parents=True)
    shutil.copyfile(old_lock, base / "locks" / f"{GROUP}.lock.yaml")
    return {"INVOKE_GPUPROV_LOCKS": str(base / "locks"), "INVOKE_GPUPROV_REPORTS": str(base / "reports")}


def settle(state, nodes: list[str]) -> dict[str, list[str]]:
    """{node: [Slurm state, reason]} once every node is idle with no reason, or as they are after
    IDLE_TIMEOUT_S (not measured)."""
    from gpuprov.lab import slurm

    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        seen = {n: list(slurm.node_state(state, n)) for n in nodes}
        if all(s == ["idle", ""] for s in seen.values()) or time.monotonic() > deadline:
            return seen
        time.sleep(1)


def submit(state, jobs: dict[str, int]) -> dict[str, int]:
    """{node: job id} of one `sleep` job per busy node, returned once all run."""
    from gpuprov.lab import slurm

    ids = {node: slurm.submit_job(state, node, seconds, name="bench-rollout") for node, seconds in jobs.items()}
    deadline = time.monotonic() + 60
    while not all(slurm.job_state(state, job) == "RUNNING" for job in ids.values()):
        if time.monotonic() > deadline:
            raise ArmFailed(f"the jobs do not run within 60 s: {ids}")
        time.sleep(1)
    return ids


def reset(state, env: dict, nodes: list[str], old: str) -> None:
    """The fleet back on the old lock's stack, idle (not measured)."""
    started = time.monotonic()
    invoke(env, "provision", "--group", GROUP)
    wrong = {n: b for n in nodes if (b := branch_of(state, n)) != old}
    checked = json.loads(invoke(env, "stack.check", "--group", GROUP, "--json", codes=(0, 1)))
    off = {n: len(checked.get(n, {}).get("mismatches", ["not checked"])) for n in nodes}
    if wrong or any(off.values()):
        raise ArmFailed(f"the reset left hosts off the old stack: branches {wrong}, stack.check mismatches {off}")
    seen = settle(state, nodes)
    if any(s != ["idle", ""] for s in seen.values()):
        raise ArmFailed(f"nodes not idle {IDLE_TIMEOUT_S} s after the reset: {seen}")
    log(f"reset: {len(nodes)} hosts on branch {old} in {time.monotonic() - started:.0f} s")


# ---------------------------------------------------------------- the arms


def arm_gpuprov(state, env: dict, nodes: list[str]) -> dict:
    """`invoke rollout`: wall time of the process; per host, drained -> resumed from its journal."""
    started = time.monotonic()
    out = invoke(env, "rollout", "--group", GROUP, "--update-lock", "--batch", "1", "--max-unavailable", "50%",
                 "--validate", "quick", "--checks", CHECKS, "--json")
    wall = time.monotonic() - started
    report = json.loads(out)
    journal = json.loads((Path(env["INVOKE_GPUPROV_REPORTS"]) / f"rollout-journal-{report['run_id']}.json")
                         .read_text(encoding="utf-8"))
    hosts = {}
    for node in nodes:
        history = journal["hosts"][node]["history"]
        at = {item["state"]: _epoch(item["at"]) for item in history}   # the last entry of each state
        first = {}
        for item in history:
            first.setdefault(item["state"], _epoch(item["at"]))
        hosts[node] = {"state": journal["hosts"][node]["state"], "order": None,
                       "wait_s": first["drained"] - first["draining"], "work_s": at["resumed"] - first["drained"],
                       "draining_at": first["draining"]}
    for index, node in enumerate(sorted(nodes, key=lambda n: hosts[n]["draining_at"])):
        hosts[node]["order"] = index + 1
        del hosts[node]["draining_at"]
    return {"wall_s": wall, "hosts": hosts, "run_id": report["run_id"]}


def arm_by_hand(state, env: dict, order: list[str]) -> dict:
    """One host at a time: drain, wait for squeue to be empty, provision, validate, resume."""
    from gpuprov.lab import slurm

    started = time.monotonic()
    hosts = {}
    for index, node in enumerate(order):
        begun = time.monotonic()
        slurm.run_on_controller(state, ["scontrol", "update", f"nodename={node}", "state=drain",
                                        "reason=bench by hand: driver upgrade"])
        while slurm.run_on_controller(state, ["squeue", "-h", "-w", node]).strip():
            time.sleep(POLL_S)
        idle = time.monotonic()
        invoke(env, "provision", "--host", node, "--update-lock")
        invoke(env, "validate", "--host", node, "--only", CHECKS)
        slurm.run_on_controller(state, ["scontrol", "update", f"nodename={node}", "state=resume"])
        done = time.monotonic()
        hosts[node] = {"state": "resumed", "order": index + 1, "wait_s": idle - begun, "work_s": done - idle}
        log(f"by hand: {node} waited {idle - begun:.0f} s, provision + validate + resume {done - idle:.0f} s")
    return {"wall_s": time.monotonic() - started, "hosts": hosts}


def judge(state, env: dict, nodes: list[str], job_ids: dict[str, int], new: str) -> dict:
    """What Slurm, dpkg and stack.check say after an arm; `ok` when all is as it must be."""
    from gpuprov.lab import slurm

    jobs = {str(job): slurm.job_state(state, job) for job in job_ids.values()}
    nodes_state = settle(state, nodes)
    branches = {n: branch_of(state, n) for n in nodes}
    checked = json.loads(invoke(env, "stack.check", "--group", GROUP, "--json", codes=(0, 1)))  # 1: mismatches
    mismatches = {n: checked.get(n, {}).get("mismatches", ["not checked"]) for n in nodes}
    lock = yaml.safe_load((Path(env["INVOKE_GPUPROV_LOCKS"]) / f"{GROUP}.lock.yaml").read_text(encoding="utf-8"))
    ok = (all(s == "COMPLETED" for s in jobs.values()) and all(s == ["idle", ""] for s in nodes_state.values())
          and set(branches.values()) == {new} and not any(mismatches.values())
          and lock["stack"]["driver"]["branch"] == new)
    return {"ok": ok, "jobs": jobs, "nodes": nodes_state, "driver_branches": branches,
            "stack_check_mismatches": mismatches, "lock_branch": lock["stack"]["driver"]["branch"]}


def _epoch(stamp: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


# ---------------------------------------------------------------- main


def setup(work: Path):
    """Four fresh L40S hosts with Slurm; the old group lock (saved), the fleet on it, validate warmed up."""
    import gpuprov.lab
    from gpuprov.lab.profiles import load_profiles
    from gpuprov.lab.standins import lab_stacks

    started = time.monotonic()
    state = gpuprov.lab.up(HOSTS, [PROFILE] * HOSTS, progress=log, fresh=True, slurm=True)
    nodes = sorted(h.name for h in state.hosts if h.profile == PROFILE)
    branches = [s["driver"]["branch"] for s in lab_stacks([load_profiles()[PROFILE]])]
    new, old = branches[0], branches[1]
    document = yaml.safe_load(state.inventory.read_text(encoding="utf-8"))
    document["known_hosts"] = str(state.known_hosts)
    for name in nodes:
        document["hosts"][name].setdefault("vars", {})["stack"] = {"driver": old}
    pinned = work / "inventory-old.yaml"
    pinned.write_text(yaml.safe_dump(document), encoding="utf-8")
    seed = work / "seed"
    env = {"INVOKE_GPUPROV_LOCKS": str(seed / "locks"), "INVOKE_GPUPROV_REPORTS": str(seed / "reports")}
    invoke(env, "stack.lock", "--group", GROUP, "--inventory", str(pinned))
    old_lock = work / "old.lock.yaml"
    shutil.copyfile(seed / "locks" / f"{GROUP}.lock.yaml", old_lock)
    invoke(env, "provision", "--group", GROUP)
    invoke(env, "validate", "--group", GROUP, "--only", CHECKS)     # the suite's venv on every host, as in use
    log(f"setup: {HOSTS} hosts, Slurm, old branch {old} locked and provisioned, validate warm, "
        f"in {time.monotonic() - started:.0f} s")
    return state, nodes, old, new, old_lock


def run_arm(name: str, state, work: Path, label: str, old_lock: Path, nodes: list[str], jobs: dict[str, int],
            old: str, new: str) -> dict:
    env = folders(work, label, old_lock)
    reset(state, env, nodes, old)
    ids = submit(state, jobs)
    log(f"{name}: jobs {ids} running; start")
    try:
        if name == "gpuprov":
            result = arm_gpuprov(state, env, nodes)
        else:
            order = sorted(nodes, key=lambda n: (jobs.get(n, 0), n))    # idle first, then soonest free
            result = arm_by_hand(state, env, order)
    except ArmFailed as exc:
        log(f"{name}: FAILED\n{exc}")
        try:
            judged = judge(state, env, nodes, ids, new)
        except ArmFailed as again:
            judged = {"ok": False, "failed": str(again)}
        return {"failed": str(exc), "judged": judged}
    result["work_s"] = sum(h["work_s"] for h in result["hosts"].values())
    # one host at a time in both arms: the wall time less the hosts' waits for jobs is all the rest (the tool's own
    # start, plans, polls, resumes), which drained -> resumed leaves out
    result["active_s"] = result["wall_s"] - sum(h["wait_s"] for h in result["hosts"].values())
    result["judged"] = judge(state, env, nodes, ids, new)
    log(f"{name}: {result['wall_s']:.0f} s wall, {result['work_s']:.0f} s work, ok={result['judged']['ok']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="80,150", help="seconds of each busy host's job, comma list (<= 4)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of both arms (order alternates)")
    parser.add_argument("--plot", action="store_true",
                        help="draw the ratios as a PNG beside the JSON result (matplotlib; bench/plots.py)")
    args = parser.parse_args()
    seconds = [int(s) for s in args.jobs.split(",") if s.strip()]
    if not 1 <= len(seconds) < HOSTS or min(seconds) < 1 or args.repeat < 1:
        parser.error(f"--jobs: 1 to {HOSTS - 1} whole seconds >= 1; --repeat >= 1")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    work = Path(tempfile.mkdtemp(prefix="gpuprov-bench-rollout-"))
    try:
        state, nodes, old, new, old_lock = setup(work)
        jobs = dict(zip(nodes[HOSTS - len(seconds):], seconds, strict=True))       # the last hosts are the busy ones
        rounds = []
        for index in range(args.repeat):
            arms = ("gpuprov", "by_hand") if index % 2 == 0 else ("by_hand", "gpuprov")
            found = {arm: run_arm(arm, state, work, f"{arm}-{index}", old_lock, nodes, jobs, old, new)
                     for arm in arms}
            found["first"] = arms[0]
            if "failed" not in found["gpuprov"] and "failed" not in found["by_hand"]:
                found["wall_ratio"] = found["gpuprov"]["wall_s"] / found["by_hand"]["wall_s"]
                found["work_ratio"] = found["gpuprov"]["work_s"] / found["by_hand"]["work_s"]
                found["active_ratio"] = found["gpuprov"]["active_s"] / found["by_hand"]["active_s"]
            rounds.append(found)
    except BaseException:
        log(f"kept for a look: {work} (each arm's locks and reports)")
        raise
    ok = all(r[a].get("judged", {}).get("ok") for r in rounds for a in ("gpuprov", "by_hand"))
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"not all as it must be: kept for a look: {work} (each arm's locks and reports)")
    result = {"stamp": stamp, "hosts": nodes, "profile": PROFILE, "branches": {"old": old, "new": new},
              "jobs": jobs, "checks": CHECKS, "repeat": args.repeat, "rounds": rounds}
    ratios = [r["wall_ratio"] for r in rounds if "wall_ratio" in r]
    if ratios:
        result["median_wall_ratio"] = statistics.median(ratios)
        result["median_work_ratio"] = statistics.median(r["work_ratio"] for r in rounds if "work_ratio" in r)
        result["median_active_ratio"] = statistics.median(r["active_ratio"] for r in rounds if "active_ratio" in r)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"rollout-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    print(f"written {path.relative_to(ROOT)}")
    if args.plot:
        from plots import plot_result

        print(f"figure: {plot_result(path)}")
    if os.environ.get("GPUPROV_KEEP_LAB") != "1":
        import gpuprov.lab

        gpuprov.lab.down()
    return 0 if ok and ratios else 1


def table(result: dict) -> str:
    lines = [f"{HOSTS} x {PROFILE}, driver {result['branches']['old']} -> {result['branches']['new']}, jobs "
             + ", ".join(f"{n}: {s} s" for n, s in result["jobs"].items()),
             f"{'round':>5} {'arm':<8} {'wall s':>7} {'wait s':>7} {'active s':>8} {'work s':>7} {'ok':>3}  order"]
    for index, found in enumerate(result["rounds"]):
        for arm in ("gpuprov", "by_hand"):
            r = found[arm]
            if "failed" in r:
                lines.append(f"{index + 1:>5} {arm:<8} FAILED: {r['failed'].splitlines()[0]}")
                continue
            order = sorted(r["hosts"], key=lambda n: r["hosts"][n]["order"])
            wait = sum(h["wait_s"] for h in r["hosts"].values())
            lines.append(f"{index + 1:>5} {arm:<8} {r['wall_s']:>7.1f} {wait:>7.1f} {r['active_s']:>8.1f} "
                         f"{r['work_s']:>7.1f} "
                         f"{'yes' if r['judged']['ok'] else 'NO':>3}  {' '.join(n[-2:] for n in order)}")
        if "wall_ratio" in found:
            lines.append(f"{index + 1:>5} gpuprov/by hand: wall {found['wall_ratio']:.2f}x, without the waits for "
                         f"jobs {found['active_ratio']:.2f}x, drained -> resumed {found['work_ratio']:.2f}x")
    if "median_wall_ratio" in result:
        lines.append(f"median gpuprov/by hand: wall {result['median_wall_ratio']:.2f}x, without the waits "
                     f"{result['median_active_ratio']:.2f}x, drained -> resumed {result['median_work_ratio']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
