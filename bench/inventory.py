"""Benchmark `inventory.check` on 1,000, 10,000 and 30,000 hosts, against PyYAML reading the same file.

For each size a native inventory is generated (a defaults block, three groups with hardware and stack
variables, and every host in block style with an address, a group and a free-form variable). Each run is a
fresh Python process, so that its peak memory is its own:
- gpuprov: the `inventory.check` task, in-process (interpreter start-up and imports not timed);
- peer: `yaml.load(text, Loader=yaml.CSafeLoader)` of the same file, as it is usually called (PyYAML's C
  loader: no positions, no checks);
- floor: the same with Python's garbage collector paused, as gpuprov pauses it while it reads an inventory
  (the collector's repeated full scans dominate the peer's time on large files).
It prints the seconds (median of REPEAT runs) and the peak resident memory (ru_maxrss, interpreter included)
of each, the ratios gpuprov / peer and gpuprov / floor, PASS/FAIL lines for the issue's targets at 30,000
hosts (under 5 s and 500 MB), and writes `bench/results/inventory-<UTC timestamp>.json`.
Run by hand: `python bench/inventory.py [--sizes 1000,10000,30000]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"

SIZES = (1_000, 10_000, 30_000)
REPEAT = 3
TARGET_SECONDS = 5.0
TARGET_MB = 500.0

# One measured run in a fresh interpreter: prints {"seconds": ..., "peak_mb": ...}.
CHILD = """
import contextlib, gc, io, json, resource, sys, time
kind, path = sys.argv[1], sys.argv[2]
if kind == "floor":
    gc.disable()
if kind == "gpuprov":
    from invoke import Context
    from gpuprov.tasks.inventory import check
    run = lambda: check(Context(), inventory=path)
else:
    import yaml
    run = lambda: yaml.load(open(path, encoding="utf-8").read(), Loader=yaml.CSafeLoader)
with contextlib.redirect_stdout(io.StringIO()):
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_inventory(folder: Path, hosts: int) -> Path:
    """A native inventory of `hosts` hosts in three groups."""
    lines = ["defaults:", "  user: gpuadmin", "  sudo: {password_env: GPU_SUDO_PASSWORD}", "  vars:",
             '    stack: {cuda: "12.8", driver: "570"}', "groups:"]
    groups = {"hgx": "{gpu: H100-SXM, count: 8, nvswitch: true}", "l40s": "{gpu: L40S, count: 4}",
              "a100": "{gpu: A100-SXM4-80GB, count: 8, nvswitch: true}"}
    for name, hardware in groups.items():
        lines += [f"  {name}:", "    vars:", f"      hardware: {hardware}"]
    lines.append("hosts:")
    names = list(groups)
    for i in range(hosts):
        lines += [f"  gpu{i:05d}:", f"    address: 10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}",
                  f"    groups: [{names[i % len(names)]}]", f"    vars: {{rack: r{i // 40:04d}}}"]
    path = folder / f"fleet-{hosts}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(kind: str, path: Path) -> dict:
    """Median seconds and largest peak memory of REPEAT fresh processes."""
    runs = []
    for _ in range(REPEAT):
        proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(path)], cwd=ROOT, capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{kind} on {path} failed:\n{proc.stderr}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"seconds": statistics.median(r["seconds"] for r in runs), "peak_mb": max(r["peak_mb"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="host counts, comma separated")
    parser.add_argument("--plot", action="store_true",
                        help="draw the ratios as a PNG beside the JSON result (matplotlib; bench/plots.py)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-inventory-") as folder:
        for size in sizes:
            path = write_inventory(Path(folder), size)
            rows.append({"hosts": size, "bytes": path.stat().st_size,
                         **{kind: measure(kind, path) for kind in ("gpuprov", "peer", "floor")}})
    print(f"{'hosts':>6} {'MiB':>5} {'gpuprov s':>10} {'peer s':>7} {'floor s':>8} {'x peer':>7} {'x floor':>8} "
          f"{'gpuprov MB':>11} {'peer MB':>8} {'floor MB':>9} {'mem x floor':>12}")
    for row in rows:
        gp, peer, floor = row["gpuprov"], row["peer"], row["floor"]
        print(f"{row['hosts']:>6} {row['bytes'] / 2**20:>5.1f} {gp['seconds']:>10.2f} {peer['seconds']:>7.2f} "
              f"{floor['seconds']:>8.2f} {gp['seconds'] / peer['seconds']:>7.1f} "
              f"{gp['seconds'] / floor['seconds']:>8.1f} {gp['peak_mb']:>11.0f} {peer['peak_mb']:>8.0f} "
              f"{floor['peak_mb']:>9.0f} {gp['peak_mb'] / floor['peak_mb']:>12.1f}")
    largest = rows[-1]
    targets = {f"{largest['hosts']} hosts in under {TARGET_SECONDS:g} s":
               largest["gpuprov"]["seconds"] < TARGET_SECONDS,
               f"{largest['hosts']} hosts in under {TARGET_MB:g} MB": largest["gpuprov"]["peak_mb"] < TARGET_MB}
    for name, ok in targets.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = RESULTS_DIR / f"inventory-{stamp}.json"
    out.write_text(json.dumps({"started_at": stamp, "machine": platform.platform(), "python": platform.python_version(),
                               "repeat": REPEAT, "results": rows, "targets": targets}, indent=2) + "\n")
    print(f"results: {out.relative_to(ROOT)}")
    if args.plot:
        from plots import plot_result

        print(f"figure: {plot_result(out)}")


if __name__ == "__main__":
    main()
