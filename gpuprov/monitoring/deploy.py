"""One host's `monitoring.deploy`: provisioning's facts, the exporters' and timers' changes, applied in one batch
through gpuprov.apply like provision's, then each exporter's /metrics read on the monitoring address."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuprov.errors import GpuprovError
from gpuprov.monitoring import dcgm_data, exporters, timers
from gpuprov.monitoring.policy import MonitoringPolicy, build_policy

# what each exporter's /metrics must hold to count as serving (a line that starts so)
SERVES = {"node-exporter": "node_", "dcgm-exporter": "DCGM_FI_"}


@dataclass
class DeployRun:
    """Everything that happened on one host, for the table and the JSON report."""

    host: str
    status: str = "unchanged"      # unchanged | planned | changed | failed
    address: str = ""
    dcgm_exporter: str = ""        # container | service | none ("" on the Prometheus host's runs)
    plan: list[dict] = field(default_factory=list)
    steps: list = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)   # exporter -> "serving" or what is wrong

    def to_dict(self) -> dict:
        return {"host": self.host, "status": self.status, "address": self.address,
                "dcgm_exporter": self.dcgm_exporter, "plan": self.plan,
                "steps": [s.to_dict() for s in self.steps], "endpoints": self.endpoints}


def managed_files(policy: MonitoringPolicy) -> tuple[str, ...]:
    """The files deploy may change (their contents come back with the facts)."""
    release_files = tuple(dict.fromkeys(r.dropin for r in dcgm_data.releases()))
    return (exporters.NODE_DEFAULTS, exporters.COUNTERS, exporters.CONTAINER_ARGS, *release_files,
            *timers.managed_files(policy))


def context(host, facts: dict):
    from gpuprov.ops.base import OpContext

    family = (facts.get("os") or {}).get("family")
    if family != "debian":
        raise GpuprovError(f"monitoring.deploy supports Debian and Ubuntu hosts, not {family or 'this OS'}",
                           host=host.name, step="plan",
                           hint="on RHEL-family hosts install node_exporter and dcgm-exporter by hand for now")
    # monitoring installs no NVIDIA stack: no stack and no NVIDIA repository to read
    return OpContext(host.name, facts, stack={}, repo=None, host_vars=host.vars)


def plan_changes(ctx, policy: MonitoringPolicy) -> list:
    return [*exporters.node_exporter(ctx, policy), *exporters.dcgm_exporter(ctx, policy),
            *timers.changes(ctx, policy)]


def endpoints(policy: MonitoringPolicy, mode: str) -> dict[str, str]:
    urls = {"node-exporter": f"http://{policy.node_exporter_listen}/metrics"}
    if mode != "none":
        urls["dcgm-exporter"] = f"http://{policy.dcgm_exporter_listen}/metrics"
    return urls


def probe_command(urls: dict[str, str], tries: int = 20) -> str:
    """A host command that prints `NAME LINES` per exporter: how many lines of /metrics start with its prefix,
    retried for a while (an exporter just restarted takes a moment); curl, wget or python3, whichever is there."""
    fetch = ('fetch() { if command -v curl >/dev/null 2>&1; then curl -fsS --max-time 5 "$1"; '
             'elif command -v wget >/dev/null 2>&1; then wget -q -T 5 -O - "$1"; '
             'else python3 -c "import sys, urllib.request as u; '
             'sys.stdout.write(u.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; fi; }')
    lines = [fetch]
    for name, url in urls.items():
        prefix = SERVES[name]
        lines.append(f"n=0; i=0; while [ $i -lt {tries} ]; do "
                     f"n=$(fetch {shlex.quote(url)} 2>/dev/null | grep -c {shlex.quote('^' + prefix)}); "
                     f"[ \"$n\" -gt 0 ] && break; i=$((i+1)); sleep 1; done; echo {shlex.quote(name)} \"$n\"")
    return "\n".join(lines)


def address_check_command(address: str) -> str:
    """A host command that prints the host's own addresses the monitoring address resolves to (none: the
    exporters could not listen there; 127.x: only the host itself could reach them)."""
    return (f"for a in $(getent ahosts {shlex.quote(address)} | awk '{{print $1}}' | sort -u); do "
            "ip -o addr show | awk '{print $4}' | cut -d/ -f1 | grep -qxF \"$a\" && echo \"$a\"; done; true")


def check_address(conn, policy: MonitoringPolicy) -> None:
    """The monitoring address must be one of the host's own, and not loopback: the exporters listen there."""
    own = conn.run("sh -c " + shlex.quote(address_check_command(policy.address)), timeout=60).stdout.split()
    usable = [a for a in own if not a.startswith("127.") and a != "::1"]
    if not usable:
        found = f"it is {'only loopback (' + ', '.join(own) + ')' if own else 'not an address of this host'}"
        raise GpuprovError(f"the monitoring address {policy.address}: {found}, so the exporters could not listen "
                           "where Prometheus reaches them", host=policy.host, step="monitoring address",
                           command=address_check_command(policy.address),
                           hint="set monitoring_address for the host to its IP address on the network Prometheus "
                                "scrapes from")


def textfile_dir_state(conn, policy: MonitoringPolicy) -> dict[str, str | None]:
    """The textfile folder's state, and its package folder's (exporters.state_command), read as root."""
    return exporters.parse_state(conn.run(exporters.state_command(policy), sudo=True, timeout=60).stdout)


def check_endpoints(conn, urls: dict[str, str]) -> dict[str, str]:
    """Each exporter's state as read on the host from its monitoring address."""
    result = conn.run("sh -s", stdin=probe_command(urls), timeout=120)
    counts = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return {name: "serving" if counts.get(name, "0").strip() not in ("", "0")
            else f"no {SERVES[name]}* metrics at {url}" for name, url in urls.items()}


def deploy_host(conn, host, dry_run: bool = False, say: Callable[[str], None] = lambda what: None) -> DeployRun:
    """The whole job on one connected host. Raises GpuprovError with the run so far attached."""
    from gpuprov.apply import apply_changes
    from gpuprov.facts.gather import gather
    from gpuprov.plan import change_dict

    policy = build_policy(host)
    run = DeployRun(host.name, address=policy.address)
    try:
        say("facts")
        check_address(conn, policy)
        files = managed_files(policy)
        ctx = context(host, {**gather(conn, files), "textfile_dir": textfile_dir_state(conn, policy)})
        run.dcgm_exporter = exporters.dcgm_mode(ctx, policy)
        changes = plan_changes(ctx, policy)
        run.plan = [change_dict(c) for c in changes]
        if dry_run:
            run.status = "planned" if changes else "unchanged"
            return run
        if changes:
            say(f"apply {len(changes)} changes")
            run.steps, _ = apply_changes(conn, changes, managed_files=files, task="monitoring.deploy")
            run.status = "changed"
        say("read the exporters")
        run.endpoints = check_endpoints(conn, endpoints(policy, run.dcgm_exporter))
        return run
    except GpuprovError as exc:
        run.status = "failed"
        run.steps = getattr(exc, "steps", run.steps)
        exc.run = run
        raise
