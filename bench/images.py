"""Benchmark `invoke images.build` on the lab matrix (the `base: local` specs), against a plain `docker build` of
the same rendered contexts measured in the same run, on the same engine and the same layer cache.

It measures, each as a whole CLI process (start-up, spec reading, rendering and, for every image it builds, the
read-back of torch's versions and the labels included):
- the no-change rebuild of the lab matrix: every step of every image must be a cache hit, and no container is
  started to read torch's versions again (the image IDs are those verified before); with images.build's default
  of two images at a time, and with `--parallel 1`, one after another as the peer builds them;
- `--changed-only` after no change: it must build nothing;
- `--changed-only` after one spec changed (an environment variable added to lab-pytorch-cpu-infer, restored
  afterwards): it must build exactly that image;
and the peer, `DOCKER_BUILDKIT=0 docker build` of every rendered context (what a CI without change detection
runs), no-change and after the same kind of change (the variable given another value, so that both start from the
same layer cache). Figures that matter are the ratios gpuprov / docker build, paired: each no-change rebuild is
divided by the peer's run of the same round (the rounds alternate which runs first, so that a drift of the
machine's load touches both alike), and the median of those ratios is reported with their spread and the load
average beside each round; seconds are for context. It works in a scratch copy of the checkout (the specs there
may change; the wheelhouse is hard-linked; gpuprov's modules compiled to bytecode once, as pip does when it
installs, since PYTHONDONTWRITEBYTECODE would otherwise make every run compile them again), so the checkout is
never touched. Needs the lab's Debian base image (built here through gpuprov.lab.images when missing). Run by hand
as root on Debian: `python bench/images.py [ROUNDS]` (default 7, at least 5); writes
bench/results/images-<UTC timestamp>.json.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAB_IMAGES = ("lab-pytorch-cpu", "lab-pytorch-cpu-infer")
CHANGED = "lab-pytorch-cpu-infer"
REPEAT = 7


def scratch_copy() -> Path:
    """A copy of the checkout to build from: its files without git, caches and outputs; the wheelhouse linked."""
    copy = Path(tempfile.mkdtemp(prefix="gpuprov-bench-images-")) / "checkout"
    shutil.copytree(ROOT, copy, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".lab", "build", "reports", "locks", "__pycache__", ".ruff_cache", ".benchmarks", ".pytest_cache"))
    wheelhouse = ROOT / "build" / "wheelhouse"
    if wheelhouse.is_dir():
        shutil.copytree(wheelhouse, copy / "build" / "wheelhouse", copy_function=os.link)
    compileall.compile_dir(copy / "gpuprov", quiet=1)
    compileall.compile_file(copy / "tasks.py", quiet=1)
    return copy


def gpuprov_build(*flags: str, env: dict, cwd: Path) -> tuple[float, dict]:
    """`invoke images.build --name <lab matrix> FLAGS --json` in `cwd`: (seconds, its JSON document)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "invoke", "images.build", "--name", ",".join(LAB_IMAGES), *flags,
                           "--json"], cwd=cwd, capture_output=True, text=True, env=env, check=False)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"images.build failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout)


def docker_build(contexts: list[Path]) -> float:
    """The peer: one plain `docker build` (the classic builder, as the SDK's) per context, one after another."""
    started = time.monotonic()
    for context in contexts:
        subprocess.run(["docker", "build", "-q", "-t", f"gpuprov-bench/{context.name}:peer", str(context)],
                       env={**os.environ, "DOCKER_BUILDKIT": "0"}, check=True, capture_output=True)
    return time.monotonic() - started


def change(spec: Path, original: str) -> None:
    """The spec with one more environment variable, of a value no build has seen."""
    spec.write_text(original.replace("env:\n", f"env:\n  GPUPROV_BENCH: \"{time.time_ns()}\"\n", 1), encoding="utf-8")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def load() -> float:
    """The machine's load average over the last minute."""
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="?", type=int, default=REPEAT, help=f"paired rounds (default {REPEAT})")
    parser.add_argument("--plot", action="store_true",
                        help="draw the ratios as a PNG beside the JSON result (matplotlib; bench/plots.py)")
    args = parser.parse_args()
    rounds = args.rounds
    if rounds < 5:
        raise SystemExit("give at least 5 rounds: the median of fewer paired ratios says little")
    from gpuprov.lab.engine import ensure_engine
    from gpuprov.lab.images import ensure_base_image

    client = ensure_engine(lambda line: print(line, file=sys.stderr))
    ensure_base_image(client, lambda line: print(line, file=sys.stderr))
    copy = scratch_copy()
    try:
        results = measure(copy, rounds)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    print(f"{'round':>5} {'load':>5} {'docker s':>9} {'gpuprov s':>10} {'ratio':>6} {'--parallel 1 s':>15} "
          f"{'ratio':>6}")
    for number, row in enumerate(results["rebuild_no_change"]["rounds"], 1):
        print(f"{number:>5} {row['load']:>5.2f} {row['docker_build_s']:>9.2f} {row['gpuprov_s']:>10.2f} "
              f"{row['ratio']:>6.2f} {row['gpuprov_one_at_a_time_s']:>15.2f} {row['ratio_one_at_a_time']:>6.2f}")
    print(f"{'measure':<32} {'gpuprov s':>10} {'docker s':>9} {'ratio':>6}  checks")
    rebuild = results["rebuild_no_change"]
    rows = [("rebuild_no_change", rebuild, ("all_cache_hits", "no_container_started")),
            ("rebuild_no_change --parallel 1", {**rebuild, "gpuprov_s": rebuild["gpuprov_one_at_a_time_s"],
                                                "ratio": rebuild["ratio_one_at_a_time"]},
             ("all_cache_hits", "no_container_started")),
            ("changed_only_no_change", results["changed_only_no_change"], ("built_nothing",)),
            ("changed_only_one_change", results["changed_only_one_change"], ("built_exactly_one", "verified"))]
    for key, row, checks in rows:
        print(f"{key:<32} {row['gpuprov_s']:>10.2f} {row['docker_build_s']:>9.2f} {row['ratio']:>6.2f}  "
              + ", ".join(f"{'PASS' if row[check] else 'FAIL'} {check}" for check in checks))
    for key in ("ratio", "ratio_one_at_a_time"):
        spread = rebuild[f"{key}_spread"]
        print(f"no-change {key}: median of {rounds} paired ratios {rebuild[key]:.2f} (spread {spread[0]:.2f}-"
              f"{spread[1]:.2f}; load {rebuild['load'][0]:.2f}-{rebuild['load'][1]:.2f}): "
              f"{'PASS' if rebuild[key] <= 1.2 else 'FAIL'} <= 1.2")
    out = ROOT / "bench" / "results" / f"images-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps({"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                               "rounds": rounds, "images": list(LAB_IMAGES), "results": results}, indent=2) + "\n")
    print(f"results: {out}")
    if args.plot:
        from plots import plot_result

        print(f"figure: {plot_result(out)}")


def measure(copy: Path, rounds: int = REPEAT) -> dict:
    """The figures, from builds in the scratch copy `copy`."""
    env = {**os.environ, "PYTHONPATH": str(copy), "INVOKE_GPUPROV_REPORTS": str(copy / "reports")}
    contexts = [copy / "build" / "images" / name for name in LAB_IMAGES]
    first, _ = gpuprov_build(env=env, cwd=copy)        # warm: builds what is missing (not a figure)
    docker_build(contexts)
    rebuilds, serial, peers, loads = [], [], [], []
    for number in range(rounds):     # paired, the order alternated, so that a drift of the load touches each alike
        loads.append(load())
        runs = [lambda: peers.append(docker_build(contexts)),
                lambda: rebuilds.append(gpuprov_build(env=env, cwd=copy)),
                lambda: serial.append(gpuprov_build("--parallel", "1", env=env, cwd=copy))]
        for run in runs if number % 2 == 0 else runs[::-1]:
            run()
    ratios = [seconds / peer for (seconds, _), peer in zip(rebuilds, peers, strict=True)]
    serial_ratios = [seconds / peer for (seconds, _), peer in zip(serial, peers, strict=True)]
    rounds_seen = [{"load": round(load_now, 2), "docker_build_s": round(peer, 3), "gpuprov_s": round(one[0], 3),
                    "ratio": round(ratio, 3), "gpuprov_one_at_a_time_s": round(two[0], 3),
                    "ratio_one_at_a_time": round(serial_ratio, 3)}
                   for load_now, peer, one, ratio, two, serial_ratio
                   in zip(loads, peers, rebuilds, ratios, serial, serial_ratios, strict=True)]
    peer = median(peers)
    rebuild = median([seconds for seconds, _ in rebuilds])
    one_at_a_time = median([seconds for seconds, _ in serial])
    hits = [(entry["image"], entry["cache_hits"], len(entry["steps"]) - 1) for _, doc in rebuilds + serial
            for entry in doc["images"]]
    reads = [entry["verification"]["versions_read"] for _, doc in rebuilds + serial for entry in doc["images"]]
    unchanged = [gpuprov_build("--changed-only", env=env, cwd=copy) for _ in range(rounds)]
    nothing = median([seconds for seconds, _ in unchanged])
    built_nothing = [[e["image"] for e in doc["images"] if not e["skipped"]] for _, doc in unchanged]

    # the same change twice, with another value each time, so that each tool starts from the same layer cache
    spec = copy / "gpuprov" / "images" / "specs" / f"{CHANGED}.yaml"
    original = spec.read_text(encoding="utf-8")
    change(spec, original)
    one, changed_doc = gpuprov_build("--changed-only", env=env, cwd=copy)
    change(spec, original)
    subprocess.run([sys.executable, "-m", "invoke", "images.render", "--name", CHANGED], cwd=copy, env=env,
                   check=True, capture_output=True)
    peer_changed = docker_build(contexts)
    built_one = [e["image"] for e in changed_doc["images"] if not e["skipped"]]
    verified = [e["verification"]["versions_read"] for e in changed_doc["images"] if not e["skipped"]]
    spec.write_text(original, encoding="utf-8")         # the image tags back on the spec's own build (not a figure)
    gpuprov_build("--changed-only", env=env, cwd=copy)
    subprocess.run(["docker", "rmi", *(f"gpuprov-bench/{context.name}:peer" for context in contexts)],
                   capture_output=True, check=False)
    return {
        "rebuild_no_change": {"gpuprov_s": rebuild, "docker_build_s": peer,
                              # the median of the paired ratios, and their least and greatest
                              "ratio": median(ratios), "ratio_spread": [min(ratios), max(ratios)],
                              "gpuprov_one_at_a_time_s": one_at_a_time, "ratio_one_at_a_time": median(serial_ratios),
                              "ratio_one_at_a_time_spread": [min(serial_ratios), max(serial_ratios)],
                              "load": [min(loads), max(loads)], "rounds": rounds_seen,
                              # of which the SDK builds themselves, one after another (the rest: start-up, spec
                              # reading, render, verification)
                              "gpuprov_builds_one_at_a_time_s": median([sum(e["seconds"] for e in doc["images"])
                                                                        for _, doc in serial]),
                              "cache_hits": hits,
                              "all_cache_hits": all(got == steps for _, got, steps in hits),
                              "versions_read": sorted(set(reads)),
                              "no_container_started": set(reads) == {"recorded for this image ID"}},
        "changed_only_no_change": {"gpuprov_s": nothing, "docker_build_s": peer, "ratio": nothing / peer,
                                   "built": built_nothing, "built_nothing": all(not b for b in built_nothing)},
        "changed_only_one_change": {"gpuprov_s": one, "docker_build_s": peer_changed, "ratio": one / peer_changed,
                                    "built": built_one, "built_exactly_one": built_one == [CHANGED],
                                    # the changed image is a new image ID: its versions read in a container again
                                    "verified": verified == ["in a container"]},
        "first_build_s": first,
    }


if __name__ == "__main__":
    main()
