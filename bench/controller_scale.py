"""One controller against plain OpenSSH on 64 and 128 sshd-only lab hosts (gpuprov.lab.light), and its first limit.

The same remote work on every host: the facts gather (`sh -s` with gpuprov's facts script on stdin, one SSH command
per host). Arms, each in a fresh worker process (so peak memory is its own), at the same width (hosts at once):
- gpuprov: `run_on_hosts` with `gather` (paramiko, host keys verified against the light known_hosts);
- ssh: one `ssh -i KEY -p PORT -o UserKnownHostsFile=... sh -s < script` per host from a pool of the same width.
Per run: wall, controller CPU (user+sys of the worker and its children), peak memory (gpuprov: the worker's VmHWM;
ssh: the worker's VmHWM plus the peak sum of its live ssh processes' PSS), peak open descriptors (ssh: the worker's
plus its ssh processes'), and per host in flight the memory and descriptors above the worker's start. Then the
limits: widths up to the host count, and gpuprov and ssh under a low `ulimit -n`. The measured figures per host are
set against gpuprov.core.shards.MEMORY_PER_CONNECTION and gpuprov.core.open_files.FDS_PER_HOST.

Run by hand as root: `python bench/controller_scale.py [--sizes 64,128]`. It holds the lab lock
(/tmp/gpuprov-lab.lock) for the whole run, removes its light hosts at the end, and writes
bench/results/controller_scale-<UTC timestamp>.json.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOCK = "/tmp/gpuprov-lab.lock"
SAMPLE_S = 0.005


def _status_kib(pid: str, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


def _fds(pid: str | int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU of this machine, from /proc/stat: the lab hosts' work is in it too."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _children() -> list[int]:
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as handle:
                pids += [int(p) for p in handle.read().split()]
        except OSError:
            continue
    return pids


class Sampler(threading.Thread):
    """Peak descriptors of this process (+ its children's) and peak PSS of its children, every SAMPLE_S."""

    def __init__(self, children: bool):
        super().__init__(daemon=True)
        self.children, self.stop = children, threading.Event()
        self.fds = self.child_kib = self.threads = 0

    def run(self) -> None:
        while not self.stop.is_set():
            fds = _fds("self")
            self.threads = max(self.threads, threading.active_count())
            if self.children:
                kids = _children()
                fds += sum(_fds(pid) for pid in kids)
                self.child_kib = max(self.child_kib, sum(_pss_kib(pid) for pid in kids))
            self.fds = max(self.fds, fds)
            time.sleep(SAMPLE_S)


def worker(arm: str, inventory_path: str, count: int, width: int) -> dict:
    """One measured run in this (fresh) process; its figures as a dict."""
    from gpuprov.core.executor import Settings, run_on_hosts
    from gpuprov.facts.gather import facts_script, gather
    from gpuprov.inventory import load_inventory

    inventory = load_inventory(Path(inventory_path))
    hosts = sorted(inventory.select(hosts=[], groups=["light"], all_=False), key=lambda h: h.name)[:count]
    script = facts_script().encode()
    import paramiko  # noqa: F401 - imported before the start figures: the import is no per-host cost

    from gpuprov.core import connection  # noqa: F401
    base_kib, base_fds = _status_kib("self", "VmRSS"), _fds("self")
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    sampler = Sampler(children=arm == "ssh")
    sampler.start()
    before_self, before_kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    machine_before = _machine_cpu()
    started = time.monotonic()
    notices: list[str] = []
    if arm == "gpuprov":
        outcomes = run_on_hosts(hosts, lambda conn: gather(conn), Settings(known_hosts=inventory.known_hosts,
                                                                           parallel=width), on_notice=notices.append)
        errors = [f"{o.host.name}: {str(o.error).splitlines()[0]}" for o in outcomes if not o.ok]
    else:
        def one(host) -> str | None:
            try:
                proc = subprocess.run(
                    ["ssh", "-i", host.identity_file, "-p", str(host.port), "-o", "BatchMode=yes",
                     "-o", f"UserKnownHostsFile={inventory.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                     f"{host.user}@{host.address}", "sh", "-s"], input=script, capture_output=True, check=False)
            except OSError as exc:
                return f"{host.name}: {exc}"
            return None if proc.returncode == 0 else f"{host.name}: exit {proc.returncode} {proc.stderr[-200:]!r}"

        with ThreadPoolExecutor(max_workers=width) as pool:
            errors = [e for e in pool.map(one, hosts) if e]
    wall = time.monotonic() - started
    machine_after = _machine_cpu()
    after_self, after_kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.stop.set()
    sampler.join()
    cpu_self = (after_self.ru_utime - before_self.ru_utime) + (after_self.ru_stime - before_self.ru_stime)
    cpu_kids = (after_kids.ru_utime - before_kids.ru_utime) + (after_kids.ru_stime - before_kids.ru_stime)
    hwm = _status_kib("self", "VmHWM")
    peak_kib = hwm + sampler.child_kib
    in_flight = min(width, len(hosts))
    if arm == "gpuprov":      # what the pool really ran at once: it fits the width to the open-files limit
        from gpuprov.core.open_files import fit_open_files

        in_flight = min(fit_open_files(width).parallel, len(hosts))
    return {"arm": arm, "hosts": len(hosts), "width": width, "nofile": soft, "wall_s": round(wall, 3),
            "cpu_s": round(cpu_self + cpu_kids, 3), "cpu_per_wall": round((cpu_self + cpu_kids) / wall, 2),
            "machine_busy": round((machine_after[0] - machine_before[0]) / max(1, machine_after[1] - machine_before[1]),
                                  2),
            "in_flight": in_flight, "start_rss_kib": base_kib, "peak_kib": peak_kib, "ssh_pss_kib": sampler.child_kib,
            "kib_per_host_in_flight": round((peak_kib - base_kib) / in_flight, 1),
            "start_fds": base_fds, "peak_fds": sampler.fds,
            "fds_per_host_in_flight": round((sampler.fds - base_fds) / in_flight, 2),
            "peak_threads": sampler.threads, "ok": len(hosts) - len(errors), "errors": errors[:5],
            "notices": notices}


def measure(arm: str, inventory: Path, count: int, width: int, nofile: int | None = None) -> dict:
    """`worker` in a fresh process (with `ulimit -n nofile` when given)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.run([sys.executable, __file__, "--worker", arm, "--inventory", str(inventory),
                           "--count", str(count), "--width", str(width)], capture_output=True, text=True,
                          cwd=ROOT, preexec_fn=limit if nofile else None, check=False)
    if proc.returncode != 0:
        return {"arm": arm, "hosts": count, "width": width, "nofile": nofile, "crashed": proc.returncode,
                "stderr": proc.stderr[-600:]}
    return json.loads(proc.stdout.splitlines()[-1])


def line(r: dict) -> str:
    if "crashed" in r:
        return (f"{r['arm']:>8} {r['hosts']:>5} {r['width']:>5} {r['nofile'] or '-':>6}  CRASHED rc={r['crashed']}: "
                + r["stderr"].strip().splitlines()[-1][:100])
    return (f"{r['arm']:>8} {r['hosts']:>5} {r['width']:>5} {r['nofile']:>6} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} "
            f"{r['cpu_per_wall']:>5.2f} {r['machine_busy']:>5.0%} {r['peak_kib'] / 1024:>8.1f} "
            f"{r['kib_per_host_in_flight']:>8.0f} "
            f"{r['peak_fds']:>6} {r['fds_per_host_in_flight']:>6.2f} {r['ok']:>4}"
            + (f"  {r['errors'][0][:80]}" if r["errors"] else "") + (f"  [{r['notices'][0][:90]}]" if r["notices"]
                                                                      else ""))


HEADER = (f"{'arm':>8} {'hosts':>5} {'width':>5} {'nofile':>6} {'wall s':>7} {'cpu s':>6} {'cpu/w':>5} {'mach':>5} "
          f"{'peak MiB':>8} {'KiB/host':>8} {'fds':>6} {'fd/h':>6} {'ok':>4}")


def main() -> None:
    from gpuprov.core.open_files import FDS_PER_HOST
    from gpuprov.core.shards import MEMORY_PER_CONNECTION
    from gpuprov.lab.engine import ensure_engine
    from gpuprov.lab.light import LightFiles, light_down, light_up
    from gpuprov.lab.state import LabPaths

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,128")
    parser.add_argument("--plot", action="store_true",
                        help="draw the ratios as a PNG beside the JSON result (matplotlib; bench/plots.py)")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = ensure_engine(lambda text: print(text, file=sys.stderr))
        paths = LabPaths.default()
        try:
            light_up(client, max(sizes), paths, progress=lambda text: print(text, file=sys.stderr))
            inventory = LightFiles.of(paths).inventory
            runs: list[dict] = []

            def run(arm: str, count: int, width: int, nofile: int | None = None) -> dict:
                result = measure(arm, inventory, count, width, nofile)
                print(line(result), flush=True)
                runs.append({**result, "phase": phase})
                return result

            print(HEADER)
            phase, ratios = "compare", []
            for count in sizes:
                for width in (32, count):      # gpuprov's default pool (32), and every host at once
                    for order in (("gpuprov", "ssh"), ("ssh", "gpuprov")):
                        pair = {arm: run(arm, count, width) for arm in order}
                        ratios.append({"hosts": count, "width": width, "first": order[0],
                                       "wall_gpuprov_over_ssh": round(pair["gpuprov"]["wall_s"]
                                                                      / pair["ssh"]["wall_s"], 2),
                                       "cpu_gpuprov_over_ssh": round(pair["gpuprov"]["cpu_s"]
                                                                     / pair["ssh"]["cpu_s"], 2),
                                       "memory_gpuprov_over_ssh": round(pair["gpuprov"]["peak_kib"]
                                                                        / pair["ssh"]["peak_kib"], 2)})
            phase, top = "limits", max(sizes)
            for width in (4, 8, 16, 64):
                run("gpuprov", top, width)
            for nofile in (256, 128):
                run("gpuprov", top, top, nofile)
                run("ssh", top, top, nofile)
        finally:
            light_down(client, paths, progress=lambda text: print(text, file=sys.stderr))
    print("\nratios (same run, same hosts):")
    for r in ratios:
        print(f"  {r['hosts']:>4} hosts, width {r['width']:>3}, {r['first']:>7} first: "
              f"wall {r['wall_gpuprov_over_ssh']:.2f}x  "
              f"cpu {r['cpu_gpuprov_over_ssh']:.2f}x  peak memory {r['memory_gpuprov_over_ssh']:.2f}x")
    measured = [r for r in runs if r["phase"] == "compare" and r["arm"] == "gpuprov"]
    kib = max(r["kib_per_host_in_flight"] for r in measured)
    fds = max(r["fds_per_host_in_flight"] for r in measured)
    widest = {r["hosts"]: r for r in measured if r["width"] == r["hosts"]}      # the last of each size
    small, large = min(widest), max(widest)
    if large > small:
        step = large - small
        marginal = {"kib": round((widest[large]["peak_kib"] - widest[small]["peak_kib"]) / step, 1),
                    "fds": round((widest[large]["peak_fds"] - widest[small]["peak_fds"]) / step, 2)}
        print(f"gpuprov marginal per host ({small} -> {large} hosts, all at once): {marginal['kib']:.0f} KiB, "
              f"{marginal['fds']:.2f} descriptors")
    print(f"gpuprov per host in flight: up to {kib:.0f} KiB (shards.MEMORY_PER_CONNECTION assumes "
          f"{MEMORY_PER_CONNECTION // 1024} KiB), up to {fds:.2f} descriptors (open_files.FDS_PER_HOST assumes "
          f"{FDS_PER_HOST})")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = ROOT / "bench" / "results" / f"controller_scale-{stamp}.json"
    out.write_text(json.dumps({"cpus": os.cpu_count(), "engine": client.version().get("Version"),
                               "memory_per_connection_kib": MEMORY_PER_CONNECTION // 1024,
                               "fds_per_host": FDS_PER_HOST, "marginal": marginal if large > small else None,
                               "ratios": ratios, "runs": runs}, indent=1) + "\n",
                   encoding="utf-8")
    print(f"wrote {out}")
    if args.plot:
        from plots import plot_result

        print(f"figure: {plot_result(out)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        options = argparse.ArgumentParser()
        options.add_argument("--worker")
        options.add_argument("--inventory")
        options.add_argument("--count", type=int)
        options.add_argument("--width", type=int)
        opts = options.parse_args()
        print(json.dumps(worker(opts.worker, opts.inventory, opts.count, opts.width)))
    else:
        main()
