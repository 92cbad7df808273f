"""Benchmark `provision` (first run from bare, then the no-op re-run) against Ansible, pyinfra and plain ssh.

For each size (1, 8, 32 lab hosts) and each tool, the lab hosts are recreated bare from the lab image
(not measured), then two runs are measured:
- first run: everything installed and configured from bare;
- no-op run: the same again, which must change nothing.

The tools, all doing the same steps (the ones gpuprov plans, see bench/README.md):
- gpuprov: the CLI process `python -m invoke provision --all --reboot never` (start-up included);
- ansible: `ansible-playbook bench/peers/playbook.yml`, forks = hosts, pipelining on;
- pyinfra: `pyinfra -y --parallel N inventory bench/peers/deploy.py`;
- ssh: the floor, one `ssh host bash -s < script` per host, all at once; the first run's script is every
  command of gpuprov's own dry-run plan for that host, the no-op script gpuprov's checks (the facts script
  with the managed files).
Wall time is from process start to exit; CPU time is user + system of the process tree the bench waits for
(`RUSAGE_CHILDREN` deltas), on this machine (the lab hosts' own work is not in it).

Nothing reboots: gpuprov runs with `--reboot never` and the peers never reboot, so all do the same work.
Ansible and pyinfra live in their own virtual environment (default /tmp/gpuprov-bench-venv, created with
pip when missing). Run by hand: `python bench/provision.py [--sizes 1,8,32] [--peers ansible,pyinfra,ssh]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = ROOT / "bench" / "peers"
RESULTS_DIR = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

PROFILES = ["hgx-h100", "l40s", "a100-pcie"]
TOOLS = ("gpuprov", "ansible", "pyinfra", "ssh")
DEFAULT_VENV = Path(os.environ.get("GPUPROV_BENCH_VENV", "/tmp/gpuprov-bench-venv"))
RUN_TIMEOUT_S = 3600
# Targets from the issue, checked at the largest size measured (32 hosts by default).
NOOP_VS_ANSIBLE = 10.0      # gpuprov no-op at least this many times faster than Ansible's
NOOP_VS_FLOOR = 0.9         # gpuprov no-op within this factor of plain ssh (issue 19; 1.5 before)
FIRST_VS_FLOOR = 1.1        # gpuprov first run within this factor of plain ssh (issue 19; 1.2 before)


@dataclass
class Measure:
    """One measured process (or, for the ssh floor, one set of parallel processes)."""

    wall_s: float
    cpu_s: float
    ok: bool
    detail: str = ""


@dataclass
class ToolResult:
    tool: str
    hosts: int
    first: Measure | None = None
    noop: Measure | None = None
    noop_changes: int | None = None       # what the tool itself reports as changed on the no-op run
    gpuprov_view: int | None = None       # changes gpuprov's dry run still plans after the tool's first run
    extra: dict = field(default_factory=dict)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def measured(argv: list[str], *, env: dict | None = None, cwd: Path = ROOT) -> tuple[Measure, str]:
    """Run one process to completion; wall time from start, CPU of its waited-for process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    output = proc.stdout + proc.stderr
    detail = "" if proc.returncode == 0 else f"exit {proc.returncode}: {output[-2000:]}"
    return Measure(wall, cpu, proc.returncode == 0, detail), output


# ---------------------------------------------------------------- lab


def bare_lab(size: int):
    """`size` lab hosts recreated from the image (bare), the inventory rewritten for exactly them."""
    import docker

    import gpuprov.lab as lab
    from gpuprov.inventory import load_inventory
    from gpuprov.lab.hosts import lab_containers
    from gpuprov.lab.removal import remove_container

    client = docker.from_env()
    started = time.monotonic()
    for container in lab_containers(client):
        remove_container(container)
    state = lab.up(size, profiles=PROFILES)
    without_engine(state.paths.inventory)
    log(f"lab: {size} bare hosts in {time.monotonic() - started:.0f} s")
    return state, load_inventory(state.paths.inventory)


def without_engine(inventory: Path) -> None:
    """The peers install no container engine, so gpuprov is not asked to either (same work for all)."""
    import yaml

    document = yaml.safe_load(inventory.read_text(encoding="utf-8"))
    for scope in [*(document.get("groups") or {}).values(), *(document.get("hosts") or {}).values()]:
        (scope.get("vars") or {}).pop("container_engine", None)
    inventory.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


# ---------------------------------------------------------------- what every tool must do


def host_data(host, inventory, keyring: Path) -> dict:
    """The work gpuprov does on a bare lab host, as data for the peers: exact packages from gpuprov's own
    resolver and the managed files' exact content from gpuprov's own operations."""
    from gpuprov.core.packages import Package
    from gpuprov.provision.ops import container_toolkit, kernel, pins, sources
    from gpuprov.stack import families
    from gpuprov.stack.resolve import PACKAGE_SECTIONS, resolve_for_host

    stack = resolve_for_host(host.vars, "debian-12", None).to_dict()
    mirror = host.vars["mirror"]
    components, pinned = [], {}
    for section in PACKAGE_SECTIONS:
        entry = stack.get(section)
        if entry is None:
            continue
        components.append({"name": section, "packages": [f"{p['name']}={p['version']}" for p in entry["packages"]]})
        pinned.update({p["name"]: Package(p["name"], p["version"]) for p in entry["packages"]})
    services = (["nvidia-fabricmanager"] if stack.get("fabricmanager") else []) + ["nvidia-dcgm", "nvidia-persistenced"]
    fingerprint = re.sub(r"\s+", "", mirror["fingerprint"]).upper()
    return {
        "bench_keyring_file": str(keyring),
        "bench_files": {
            "key_stamp": fingerprint + "\n",
            "apt_list": f"# {sources.HEADER}\ndeb [signed-by={sources.APT_KEYRING}] {mirror['url']} /\n",
            "nouveau": kernel.BLACKLIST_CONTENT,
            "udev": container_toolkit.DEV_CHAR_CONTENT,
            "preferences": pins.preferences([pinned[name] for name in sorted(pinned)], stack["driver"]["version"],
                                            mirror.get("label")),
            "unattended": families.unattended(),
        },
        # lab hosts are containers: they run this machine's kernel
        "bench_header_packages": [f"linux-headers-{os.uname().release}", "dkms"],
        "bench_components": components,
        "bench_services": services,
        "bench_holds": sorted(pinned),
    }


def dearmored_key(inventory, workdir: Path) -> Path:
    """The lab mirror's key as a binary keyring (what gpuprov installs), made here once."""
    mirror = next(iter(inventory.hosts.values())).vars["mirror"]
    out = workdir / "gpuprov-nvidia.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(out), mirror["key_file"]], check=True,
                   capture_output=True)
    return out


def write_ansible_inventory(inventory, workdir: Path, keyring: Path) -> Path:
    import yaml

    hosts = {}
    for name, host in sorted(inventory.hosts.items()):
        hosts[name] = {
            "ansible_host": host.address, "ansible_port": host.port, "ansible_user": host.user,
            "ansible_ssh_private_key_file": str(host.identity_file),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={inventory.known_hosts} -o StrictHostKeyChecking=yes",
            **host_data(host, inventory, keyring)}
    path = workdir / "ansible-inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}, sort_keys=False), encoding="utf-8")
    return path


def write_pyinfra_inventory(inventory, workdir: Path, keyring: Path) -> Path:
    hosts = []
    for name, host in sorted(inventory.hosts.items()):
        hosts.append((name, {
            "ssh_hostname": host.address, "ssh_port": host.port, "ssh_user": host.user,
            "ssh_key": str(host.identity_file), "ssh_known_hosts_file": str(inventory.known_hosts),
            "ssh_strict_host_key_checking": "yes", **host_data(host, inventory, keyring)}))
    path = workdir / "pyinfra_inventory.py"
    path.write_text(f"hosts = {hosts!r}\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- gpuprov


def gpuprov_argv(inventory_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "invoke", "provision", "--all", "--reboot", "never",
            "--inventory", str(inventory_path), *extra]


def gpuprov_report() -> dict:
    return json.loads((ROOT / "reports" / "provision-latest.json").read_text(encoding="utf-8"))


def gpuprov_planned_changes(inventory_path: Path) -> tuple[int, dict]:
    """Changes gpuprov's dry run plans now (over all hosts), and its report (not measured)."""
    subprocess.run(gpuprov_argv(inventory_path, "--dry-run", "--json"), cwd=ROOT, check=True, capture_output=True)
    report = gpuprov_report()
    return sum(len((h.get("plan") or {}).get("changes", [])) for h in report["hosts"]), report


def phase_times(report: dict) -> dict:
    """Per-host apply steps from gpuprov's report: the slowest host's total and its slowest steps."""
    totals = {}
    for run in report["hosts"]:
        steps = run.get("steps") or []
        totals[run["host"]] = (sum(s.get("duration_s") or 0 for s in steps), steps)
    if not totals:
        return {}
    host, (total, steps) = max(totals.items(), key=lambda item: item[1][0])
    slow = sorted(steps, key=lambda s: -(s.get("duration_s") or 0))[:4]
    return {"slowest_host": host, "apply_s": round(total, 2),
            "slowest_steps": [{"s": round(s.get("duration_s") or 0, 2),
                               "step": (s.get("summary") or s.get("command") or "")[:80]} for s in slow]}


def run_gpuprov(result: ToolResult, inventory_path: Path) -> dict[str, list[str]]:
    """First run from bare, then the same again timed as the no-op (it must report zero changes). Returns the
    commands the first run applied on each host (its steps: the plan, and what it applied once the packages were
    in), for the ssh floor to do the same work."""
    result.first, _ = measured(gpuprov_argv(inventory_path))
    report = gpuprov_report()
    applied = {run["host"]: [command for step in run.get("steps") or [] for command in step["commands"]]
               for run in report["hosts"]}
    result.extra["first_statuses"] = sorted({h["status"] for h in report["hosts"]})
    result.extra["first_phases"] = phase_times(report)
    result.noop, _ = measured(gpuprov_argv(inventory_path))
    report = gpuprov_report()
    result.noop_changes = sum(1 for h in report["hosts"] if h["status"] != "unchanged")
    return applied


# ---------------------------------------------------------------- peers


def ensure_venv(venv: Path) -> Path:
    if not (venv / "bin" / "ansible-playbook").exists() or not (venv / "bin" / "pyinfra").exists():
        log(f"peers: installing ansible-core and pyinfra into {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "ansible-core", "pyinfra"], check=True)
    return venv / "bin"


def versions(bin_dir: Path) -> dict:
    out = {}
    for tool, argv in (("ansible", ["ansible-playbook", "--version"]), ("pyinfra", ["pyinfra", "--version"])):
        proc = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True)
        out[tool] = (proc.stdout or proc.stderr).splitlines()[0].strip() if proc.returncode == 0 else "?"
    return out


def ansible_changed(output: str) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", output))


def run_ansible(result: ToolResult, inventory, bin_dir: Path, workdir: Path, keyring: Path) -> None:
    inv = write_ansible_inventory(inventory, workdir, keyring)
    argv = [str(bin_dir / "ansible-playbook"), "-i", str(inv), str(PEERS_DIR / "playbook.yml")]

    def env() -> dict:
        return {**os.environ, "ANSIBLE_CONFIG": str(PEERS_DIR / "ansible.cfg"), "ANSIBLE_FORKS": str(result.hosts),
                "ANSIBLE_HOME": str(workdir / "ansible-home"), "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-tmp"),
                # each run opens its own connections (none left from the run before)
                "ANSIBLE_SSH_CONTROL_PATH_DIR": tempfile.mkdtemp(prefix="cp-", dir=workdir),
                "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    result.first, out = measured(argv, env=env())
    result.extra["first_changed"] = ansible_changed(out)
    result.noop, out = measured(argv, env=env())
    result.noop_changes = ansible_changed(out)


def pyinfra_changed(output: str) -> int:
    """Hosts pyinfra reports as changed (its summary: `Changed: N` per host, or `No changes`)."""
    return sum(int(n) for n in re.findall(r"\bChanged:\s*(\d+)", output))


def run_pyinfra(result: ToolResult, inventory, bin_dir: Path, workdir: Path, keyring: Path) -> None:
    inv = write_pyinfra_inventory(inventory, workdir, keyring)
    argv = [str(bin_dir / "pyinfra"), "-y", "--parallel", str(result.hosts), str(inv), str(PEERS_DIR / "deploy.py")]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result.first, out = measured(argv, env=env, cwd=workdir)
    result.extra["first_changed"] = pyinfra_changed(out)
    result.noop, out = measured(argv, env=env, cwd=workdir)
    result.noop_changes = pyinfra_changed(out)
    result.extra["noop_tail"] = out[-600:]


# ---------------------------------------------------------------- the floor: plain ssh


def ssh_argv(host, inventory) -> list[str]:
    return ["ssh", "-i", str(host.identity_file), "-p", str(host.port), "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={inventory.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            f"{host.user}@{host.address}", "bash", "-s"]


def parallel_ssh(inventory, scripts: dict[str, str], workdir: Path) -> Measure:
    """One `ssh host bash -s < script` per host, all at once; their output kept in files."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    procs = {}
    for name, script in scripts.items():
        stdin = workdir / f"{name}.sh"
        stdin.write_text(script, encoding="utf-8")
        with open(stdin, "rb") as fin, open(workdir / f"{name}.out", "wb") as fout:
            procs[name] = subprocess.Popen(ssh_argv(inventory.hosts[name], inventory), stdin=fin, stdout=fout,
                                           stderr=subprocess.STDOUT)
    failed = [name for name, proc in procs.items() if proc.wait(timeout=RUN_TIMEOUT_S) != 0]
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    detail = "; ".join(f"{n}: {(workdir / f'{n}.out').read_text(errors='replace')[-500:]}" for n in failed)
    return Measure(wall, cpu, not failed, detail)


def block(commands: list[str]) -> str:
    """A script bash parses whole before it runs (so no command can read the rest of it from stdin)."""
    return "{\nset -e\n" + "\n".join(commands) + "\n} </dev/null\n"


def run_ssh(result: ToolResult, inventory, report: dict, applied: dict[str, list[str]], workdir: Path) -> None:
    """The first run's script per host: the commands gpuprov's first run applied there (`applied`), or, when
    gpuprov was not measured, its dry-run plan on these bare hosts (`report`), which lacks what gpuprov applies
    once the packages are in (the apt pins of every package of their release)."""
    from gpuprov.facts.gather import facts_command
    from gpuprov.provision.ops import MANAGED_FILES

    first, noop = {}, {}
    for run in report["hosts"]:
        name = run["host"]
        commands = applied.get(name) or [command for change in run["plan"]["changes"]
                                         for command in change["commands"]]
        first[name] = block(commands)
        # the checks gpuprov's no-op run makes: the facts script (the preflight probe runs only when
        # something is to be installed)
        noop[name] = "{\n" + facts_command(MANAGED_FILES) + "\n} </dev/null\n"
    result.first = parallel_ssh(inventory, first, Path(tempfile.mkdtemp(prefix="ssh-first-", dir=workdir)))
    result.noop = parallel_ssh(inventory, noop, Path(tempfile.mkdtemp(prefix="ssh-noop-", dir=workdir)))


# ---------------------------------------------------------------- table and targets


def fmt(value: float | None, width: int = 9, digits: int = 2) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def ratio(a: Measure | None, b: Measure | None) -> float | None:
    return a.wall_s / b.wall_s if a and b and a.ok and b.ok and b.wall_s else None


def print_table(size: int, results: dict[str, ToolResult]) -> None:
    gp = results.get("gpuprov")
    print(f"\n{size} host(s)  (no reboot for anyone: gpuprov --reboot never, the peers never reboot)")
    print(f"{'tool':<8} {'first s':>9} {'first cpu':>9} {'no-op s':>9} {'no-op cpu':>9} "
          f"{'peer/gp no-op':>13} {'gp/peer first':>13} {'no-op chg':>9} {'gp agrees':>9}")
    for tool in TOOLS:
        r = results.get(tool)
        if r is None:
            continue
        f, n = r.first, r.noop
        noop_ratio = ratio(n, gp.noop) if gp and tool != "gpuprov" else None
        first_ratio = ratio(gp.first, f) if gp and tool != "gpuprov" else None
        bad = [m.detail.splitlines()[0][:60] if m.detail else "failed" for m in (f, n) if m and not m.ok]
        print(f"{tool:<8} {fmt(f and f.wall_s)} {fmt(f and f.cpu_s)} {fmt(n and n.wall_s)} {fmt(n and n.cpu_s)} "
              f"{fmt(noop_ratio, 13)} {fmt(first_ratio, 13)} {'-' if r.noop_changes is None else r.noop_changes:>9} "
              f"{'-' if r.gpuprov_view is None else ('yes' if r.gpuprov_view == 0 else f'{r.gpuprov_view} left'):>9}"
              + (f"  FAILED: {'; '.join(bad)}" if bad else ""))


def targets(size: int, results: dict[str, ToolResult]) -> list[tuple[str, bool | None, str]]:
    gp = results.get("gpuprov")
    checks = []

    def add(name, peer, phase, limit, better):
        other = results.get(peer)
        if gp is None or other is None:
            return
        mine, theirs = getattr(gp, phase), getattr(other, phase)
        if not (mine and theirs and mine.ok and theirs.ok):
            checks.append((name, None, "not measured"))
            return
        checks.append((name, better(mine.wall_s, theirs.wall_s),
                       f"gpuprov {mine.wall_s:.2f} s, {peer} {theirs.wall_s:.2f} s "
                       f"(gpuprov/{peer} = {mine.wall_s / theirs.wall_s:.2f})"))

    add(f"no-op, {size} hosts: >= {NOOP_VS_ANSIBLE:g}x faster than Ansible", "ansible", "noop", None,
        lambda m, t: t >= NOOP_VS_ANSIBLE * m)
    add(f"no-op, {size} hosts: faster than pyinfra", "pyinfra", "noop", None, lambda m, t: m < t)
    add(f"no-op, {size} hosts: within {NOOP_VS_FLOOR:g}x the plain ssh floor", "ssh", "noop", None,
        lambda m, t: m <= NOOP_VS_FLOOR * t)
    add(f"first run, {size} hosts: within {FIRST_VS_FLOOR:g}x the plain ssh floor", "ssh", "first", None,
        lambda m, t: m <= FIRST_VS_FLOOR * t)
    return checks


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,8,32", help="comma list of host counts (default 1,8,32)")
    parser.add_argument("--peers", default="ansible,pyinfra,ssh", help="comma list of peers (ansible,pyinfra,ssh)")
    parser.add_argument("--keep-lab", action="store_true", help="leave the last run's hosts as they are (provisioned); "
                        "without it the hosts are recreated bare at the end")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                        help="virtual environment for ansible-core and pyinfra")
    parser.add_argument("--plot", action="store_true",
                        help="draw the ratios as a PNG beside the JSON result (matplotlib; bench/plots.py)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(peers) - set(TOOLS[1:])
    if unknown or not sizes or min(sizes) < 1:
        parser.error(f"peers must be among {', '.join(TOOLS[1:])}; sizes positive integers")
    bin_dir = ensure_venv(args.venv) if {"ansible", "pyinfra"} & set(peers) else None
    workroot = Path(tempfile.mkdtemp(prefix="gpuprov-bench-"))
    started_at = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    all_results: dict[int, dict[str, ToolResult]] = {}
    try:
        for size in sizes:
            results = all_results.setdefault(size, {})
            applied: dict[str, list[str]] = {}
            for tool in ("gpuprov", *peers):
                state, inventory = bare_lab(size)
                inventory_path = state.paths.inventory
                workdir = workroot / f"{size}-{tool}"
                workdir.mkdir()
                keyring = dearmored_key(inventory, workdir)
                result = results[tool] = ToolResult(tool, size)
                # the same unmeasured start for every tool: gpuprov's dry run (the ssh floor's script is its plan),
                # which also gives the freshly booted hosts the same time to settle
                _, bare_plan = gpuprov_planned_changes(inventory_path)
                log(f"{size} hosts: {tool} ...")
                if tool == "gpuprov":
                    applied = run_gpuprov(result, inventory_path)
                elif tool == "ansible":
                    run_ansible(result, inventory, bin_dir, workdir, keyring)
                elif tool == "pyinfra":
                    run_pyinfra(result, inventory, bin_dir, workdir, keyring)
                else:
                    run_ssh(result, inventory, bare_plan, applied, workdir)
                result.gpuprov_view, _ = gpuprov_planned_changes(inventory_path)
                log(f"{size} hosts: {tool}: first {result.first.wall_s:.2f} s, no-op {result.noop.wall_s:.2f} s"
                    + ("" if result.first.ok and result.noop.ok
                       else f"  FAILED {result.first.detail or result.noop.detail}"))
            print_table(size, results)
    finally:
        if all_results and not args.keep_lab:
            bare_lab(max(all_results))
        shutil.rmtree(workroot, ignore_errors=True)
    largest = max(all_results)
    checks = targets(largest, all_results[largest])
    print(f"\ntargets (at {largest} hosts; the issue sets them for 32):")
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL' if ok is False else 'N/A '}  {name}: {detail}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"provision-{started_at}.json"
    out.write_text(json.dumps({
        "started_at": started_at, "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release},
        "peers": versions(bin_dir) if bin_dir else {}, "reboot": "never (all tools)", "profiles": PROFILES,
        "results": {str(size): {tool: asdict(r) for tool, r in res.items()} for size, res in all_results.items()},
        "targets": [{"target": n, "pass": ok, "detail": d} for n, ok, d in checks]}, indent=2), encoding="utf-8")
    print(f"results: {out.relative_to(ROOT)}")
    if args.plot:
        from plots import plot_result

        print(f"figure: {plot_result(out)}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
