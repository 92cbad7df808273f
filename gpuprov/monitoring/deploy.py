"""Monitoring's host jobs on the fleet runtime (gpuprov.core.runtime): `monitoring.deploy` (DeployJob: the facts,
the exporters' and timers' changes applied in one batch, then each exporter's /metrics read on the monitoring
address) and the monitoring host's `monitoring.server` and `monitoring.targets --server` (ServerJob)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from gpuprov.core.errors import GpuprovError
from gpuprov.core.runtime import HostJob, HostRecord, Say, error_line
from gpuprov.monitoring import dcgm_data, exporters, server, timers
from gpuprov.monitoring.policy import MonitoringPolicy, build_policy
from gpuprov.monitoring.variables import VARIABLES

# what each exporter's /metrics must hold to count as serving (a line that starts so)
SERVES = {"node-exporter": "node_", "dcgm-exporter": "DCGM_FI_"}


@dataclass
class MonitoringRecord(HostRecord):
    """A host's monitoring run, beside the common fields: the address its exporters (or Prometheus) listen on, how
    dcgm-exporter runs there and each exporter's state as read after the run."""

    plan: list[dict] = field(default_factory=list)   # the planned changes (change_dict each), [] until planned
    address: str = ""
    dcgm_exporter: str = ""        # container | service | none ("" on the Prometheus host's runs)
    endpoints: dict[str, str] = field(default_factory=dict)   # exporter -> "serving" or what is wrong

    def details(self) -> dict:
        return {"address": self.address, "dcgm_exporter": self.dcgm_exporter, "endpoints": self.endpoints}


def managed_files(policy: MonitoringPolicy) -> tuple[str, ...]:
    """The files deploy may change (their contents come back with the facts)."""
    release_files = tuple(dict.fromkeys(r.dropin for r in dcgm_data.releases()))
    return (exporters.NODE_DEFAULTS, exporters.COUNTERS, exporters.CONTAINER_ARGS, *release_files,
            *timers.managed_files(policy))


def context(host, facts: dict):
    from gpuprov.core.operations import OpContext

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


class MonitoringJob(HostJob):
    """What monitoring's host jobs share: the record and the table (with each exporter's state)."""

    columns = ("host", "status", "changes", "exporters", "detail")

    def new_record(self, host) -> MonitoringRecord:
        return MonitoringRecord(host.name, address=host.address)

    def row(self, entry: dict) -> dict:
        endpoints = entry.get("endpoints") or {}
        exporters_cell = ", ".join(f"{name} {state}" for name, state in endpoints.items()) or "-"
        detail = error_line(entry) or (f"dcgm-exporter: {entry['dcgm_exporter']}" if entry.get("dcgm_exporter")
                                       else "")
        return {"host": entry["host"], "status": entry.get("status", "failed"),
                "changes": str(len(entry.get("plan") or [])), "exporters": exporters_cell, "detail": detail}


class DeployJob(MonitoringJob):
    """`invoke monitoring.deploy`: node_exporter and dcgm-exporter on the host's monitoring address (checked to be
    its own first), the drift and idle-GPU validation timers; then each exporter's /metrics read there. A host
    whose exporter does not serve is not where the operator asked (exit 1)."""

    kind = "monitoring-deploy"
    task = "monitoring.deploy"
    variables = (*dict.fromkeys(spec.name.split(".")[0] for spec in VARIABLES), "hardware", "validate")

    def new_record(self, host) -> MonitoringRecord:
        return MonitoringRecord(host.name, address=build_policy(host).address)

    def managed_files(self, host) -> tuple[str, ...]:
        return managed_files(build_policy(host))

    def gather(self, conn, record: HostRecord) -> dict:
        """The monitoring address checked first (nothing is gathered for a host that could not serve there),
        then the facts with the managed files and the textfile folder's state."""
        policy = build_policy(conn.host)
        check_address(conn, policy)
        return {**super().gather(conn, record), "textfile_dir": textfile_dir_state(conn, policy)}

    def plan(self, conn, record: MonitoringRecord) -> list:
        from gpuprov.core.operations import change_dict

        policy = build_policy(conn.host)
        ctx = context(conn.host, record.facts_before)
        record.dcgm_exporter = exporters.dcgm_mode(ctx, policy)
        changes = plan_changes(ctx, policy)
        record.plan = [change_dict(change) for change in changes]
        return changes

    def verify(self, conn, record: MonitoringRecord, say: Say) -> None:
        say("read the exporters")
        record.endpoints = check_endpoints(conn, endpoints(build_policy(conn.host), record.dcgm_exporter))

    def failing(self, entry: dict) -> bool:
        """An exporter that does not serve its metrics on the monitoring address."""
        return any(state != "serving" for state in (entry.get("endpoints") or {}).values())


class ServerJob(MonitoringJob):
    """The monitoring host: `invoke monitoring.server` (prometheus=True: Prometheus with gpuprov's configuration,
    rules and the targets, listening on the host's monitoring address, checked to be its own before anything
    changes) or `invoke monitoring.targets --server` (the targets only, which Prometheus reloads by itself)."""

    variables = ("monitoring_address", "monitoring")

    def __init__(self, targets: dict[str, list[dict]], prometheus: bool, dry_run: bool = False):
        super().__init__(dry_run)
        self.targets, self.prometheus = targets, prometheus
        self.kind = "monitoring-server" if prometheus else "monitoring-targets"
        self.task = "monitoring.server" if prometheus else "monitoring.targets --server"

    def managed_files(self, host) -> tuple[str, ...]:
        return server.managed_files()

    def gather(self, conn, record: HostRecord) -> dict:
        """With Prometheus to listen on the monitoring address: that address checked first, then the facts."""
        if self.prometheus:
            check_address(conn, build_policy(conn.host))
        return super().gather(conn, record)

    def plan(self, conn, record: MonitoringRecord) -> list:
        from gpuprov.core.operations import change_dict

        ctx = context(conn.host, record.facts_before)
        changes = list(server.server_changes(ctx, self.targets, build_policy(conn.host)) if self.prometheus
                       else server.target_changes(ctx, self.targets))
        record.plan = [change_dict(change) for change in changes]
        return changes
