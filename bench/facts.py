"""Benchmark `facts` on 1, 8 and 32 lab hosts, against plain OpenSSH as the peer measured in the same run.

For each size it measures:
- gpuprov: `invoke facts --json` as a whole process (start-up included), wall time;
- the SSH exec requests gpuprov sends per host (counted at paramiko's Channel.exec_command, in-process);
- plain ssh: one `ssh host sh -s < facts-script` process per host (the script names the managed files), all at
  once (the floor).
It prints a table with the ratios gpuprov / ssh and 32 hosts / 1 host and writes
bench/results/facts-<UTC timestamp>.json. Run by hand: `python bench/facts.py [--plot]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = (1, 8, 32)
REPEAT = 3


def gpuprov_cli(hosts: list[str]) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "invoke", "facts", "--json", "--host", ",".join(hosts)], cwd=ROOT,
                   check=True, capture_output=True)
    return time.monotonic() - started


def exec_requests_per_host(inventory, hosts: list[str]) -> Counter:
    """Run facts in-process and count SSH exec requests per host."""
    import paramiko

    from gpuprov.core.executor import Settings, run_on_hosts
    from gpuprov.facts.gather import gather
    from gpuprov.provision.ops import MANAGED_FILES

    counts: Counter = Counter()
    original = paramiko.Channel.exec_command

    def counting(channel, command):
        counts[channel.get_transport().getpeername()[1]] += 1
        return original(channel, command)

    paramiko.Channel.exec_command = counting
    try:
        selected = inventory.select(hosts=hosts, groups=[], all_=False)
        settings = Settings(known_hosts=inventory.known_hosts, parallel=32)
        outcomes = run_on_hosts(selected, lambda conn: gather(conn, MANAGED_FILES), settings)
        assert all(o.ok for o in outcomes), [str(o.error) for o in outcomes if not o.ok]
    finally:
        paramiko.Channel.exec_command = original
    return counts


def plain_ssh(inventory, hosts: list[str]) -> float:
    from gpuprov.facts.gather import facts_script
    from gpuprov.provision.ops import MANAGED_FILES

    script = facts_script(MANAGED_FILES).encode()
    started = time.monotonic()
    procs = []
    for name in hosts:
        host = inventory.hosts[name]
        procs.append(subprocess.Popen(
            ["ssh", "-i", host.identity_file, "-p", str(host.port), "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={inventory.known_hosts}", "-o", "StrictHostKeyChecking=yes",
             f"{host.user}@{host.address}", "sh", "-s"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for proc in procs:
        proc.stdin.write(script)
        proc.stdin.close()
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"plain ssh failed: {proc.stderr.read().decode()}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", action="store_true",
                        help="draw the ratios as a PNG beside the JSON result (matplotlib; bench/plots.py)")
    args = parser.parse_args()
    import gpuprov.lab as lab
    from gpuprov.inventory import load_inventory

    state = lab.up(max(SIZES), progress=lambda line: print(line, file=sys.stderr))
    inventory = load_inventory(state.paths.inventory)
    names = sorted(inventory.hosts)
    rows = []
    for size in SIZES:
        hosts = names[:size]
        gp = statistics.median(gpuprov_cli(hosts) for _ in range(REPEAT))
        ssh = statistics.median(plain_ssh(inventory, hosts) for _ in range(REPEAT))
        counts = exec_requests_per_host(inventory, hosts)
        rows.append((size, gp, ssh, max(counts.values()), len(counts)))
    one = rows[0][1]
    print(f"{'hosts':>5} {'gpuprov s':>10} {'ssh s':>8} {'gpuprov/ssh':>12} {'vs 1 host':>10} {'cmds/host':>10}")
    for size, gp, ssh, per_host, answered in rows:
        print(f"{size:>5} {gp:>10.2f} {ssh:>8.2f} {gp / ssh:>12.2f} {gp / one:>10.2f} {per_host:>10}"
              + ("" if answered == size else f"  (only {answered} hosts counted)"))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = ROOT / "bench" / "results" / f"facts-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"started_at": stamp, "cpus": os.cpu_count(), "repeat": REPEAT, "rows": [
        {"hosts": size, "gpuprov_s": round(gp, 3), "ssh_s": round(ssh, 3), "exec_requests_per_host": per_host,
         "hosts_counted": answered} for size, gp, ssh, per_host, answered in rows]}, indent=1) + "\n",
        encoding="utf-8")
    print(f"results: {out.relative_to(ROOT)}")
    if args.plot:
        from plots import plot_result

        print(f"figure: {plot_result(out)}")


if __name__ == "__main__":
    main()
