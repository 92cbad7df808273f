"""`invoke health.deploy`: the passive health check installed on each Slurm GPU node and wired into Slurm, as a host
job on the fleet runtime (gpuprov.core.runtime).

On every selected node, root-owned and only where it differs: the rendered program (/usr/local/sbin/gpuprov-health,
0755), its Epilog wrapper (/usr/local/sbin/gpuprov-health-epilog, 0755), its settings (/etc/gpuprov/health.json:
the GPU count and NVLink from the inventory's `hardware`, Slurm mode, the breaker's share, the textfile folder), the
textfile folder itself root:root 0755 as monitoring.deploy keeps it (gpuprov.monitoring.exporters), and
gpuprov's block in slurm.conf (HealthCheckProgram, HealthCheckInterval, HealthCheckNodeState, Epilog) between two
marker lines. The controller named by the nodes' `scheduler.controller` gets the same block (and the node's files when
it is a Slurm node too), and when any slurm.conf changed, `scontrol reconfigure` runs there after every host is done,
only when every host succeeded (else it is held back, and said so). Configless Slurm (SlurmctldParameters with
enable_configless) is refused: every node, installed or not, would read gpuprov's Epilog from the controller. The
block is the same text everywhere, so every copy of slurm.conf stays identical where it was. A key of the block set
outside it (an admin's Epilog) is refused, never overwritten.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gpuprov.core.controller import controller_name
from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.core.runtime import HostJob, HostRecord, error_line

PROGRAM = "/usr/local/sbin/gpuprov-health"
EPILOG = "/usr/local/sbin/gpuprov-health-epilog"
CONFIG = "/etc/gpuprov/health.json"
SLURM_CONF = "/etc/slurm/slurm.conf"
BEGIN = "# BEGIN gpuprov health (invoke health.deploy writes this block; edits inside it are replaced)"
END = "# END gpuprov health"
# the keys the block sets: set outside it too, Slurm would take one of the two (refused instead)
BLOCK_KEYS = ("HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState", "Epilog")
NODE_STATE = "ANY,CYCLE"   # every node state, and spread over the interval (slurm.conf(5), 22.05)
DEFAULT_INTERVAL_S = 300
DEFAULT_MAX_DRAINED_PCT = 10.0
MIN_PYTHON = (3, 9)
_PATH = re.compile(r"/[A-Za-z0-9._/-]+")


def render_block(interval: int, epilog: bool) -> str:
    """gpuprov's lines of slurm.conf, between the markers."""
    lines = [BEGIN, f"HealthCheckProgram={PROGRAM}", f"HealthCheckInterval={interval}",
             f"HealthCheckNodeState={NODE_STATE}"]
    if epilog:
        lines.append(f"Epilog={EPILOG}")
    return "\n".join([*lines, END]) + "\n"


def _key(line: str) -> str:
    """The first key of a slurm.conf line ('' for a comment or a blank), in lowercase (Slurm ignores case)."""
    text = line.split("#", 1)[0].strip()
    return text.split("=", 1)[0].strip().lower() if "=" in text else ""


def merge_block(current: str, block: str, where: str) -> str:
    """slurm.conf with gpuprov's block put in place of the old one (or appended). GpuprovError when the markers are
    broken (one without the other, twice, in the wrong order) or when a key of the block is set outside it."""
    lines = current.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.rstrip("\n") == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\n") == END]
    if len(begins) > 1 or len(ends) > 1 or len(begins) != len(ends) or (begins and begins[0] > ends[0]):
        raise GpuprovError(f"{where}: gpuprov's marker lines are broken ({len(begins)} BEGIN, {len(ends)} END)",
                           step="slurm.conf", hint=f"leave exactly one `{BEGIN}` line and one `{END}` line after it "
                                                   "(or remove both), then run health.deploy again")
    inside = range(begins[0], ends[0] + 1) if begins else range(0)
    managed = {k.lower(): k for k in BLOCK_KEYS if k in block}
    for number, line in enumerate(lines):
        if number not in inside and _key(line) in managed:
            raise GpuprovError(f"{where}:{number + 1}: {managed[_key(line)]} is set outside gpuprov's block: "
                               f"{literal(line.strip())}", step="slurm.conf",
                               hint="remove that line (or, for your own Epilog, run health.deploy --no-epilog and "
                                    f"call {EPILOG} from your Epilog), then run health.deploy again")
    if begins:
        return "".join(lines[: begins[0]]) + block + "".join(lines[ends[0] + 1:])
    separator = "" if not current or current.endswith("\n") else "\n"
    return current + separator + block


def _values(current: str, key: str) -> list[str]:
    """The values of `key` (any case) on slurm.conf's lines, comments left out: `NodeName=gpu[01-04] CPUs=4` ->
    `gpu[01-04]` for NodeName."""
    out = []
    for line in current.splitlines():
        for word in line.split("#", 1)[0].split():
            name, equals, value = word.partition("=")
            if equals and name.lower() == key.lower():
                out.append(value)
    return out


def configless(current: str) -> bool:
    """Whether slurm.conf runs Slurm configless (SlurmctldParameters holds enable_configless): the nodes then read
    the controller's slurm.conf, with gpuprov's Epilog in it, even the nodes health.deploy never installed."""
    return any("enable_configless" in (p.strip().lower() for p in value.split(","))
               for value in _values(current, "SlurmctldParameters"))


def _hostlist(expression: str) -> list[str]:
    """The names of a Slurm host list with at most one bracket per name (`gpu[01-03,07],ctl` -> gpu01, gpu02, gpu03,
    gpu07, ctl); a form it cannot expand stays as written."""
    names = []
    for word in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)?", expression):
        match = re.fullmatch(r"([^\[\]]*)\[([0-9,-]+)\]([^\[\]]*)", word)
        if not match:
            names.append(word)
            continue
        for part in match[2].split(","):
            low, _, high = part.partition("-")
            if low.isdigit() and (high or low).isdigit() and int(high or low) - int(low) < 100000:
                names += [f"{match[1]}{i:0{len(low)}d}{match[3]}" for i in range(int(low), int(high or low) + 1)]
    return names


def slurm_node(host, current: str) -> bool:
    """Whether the host is a Slurm node too: the inventory's slurm: source lists it (slurm_state), or a NodeName
    line of its slurm.conf names it (scheduler.node, else the host's name)."""
    name = (host.vars.get("scheduler") or {}).get("node") or host.name
    return "slurm_state" in host.vars or any(name in _hostlist(v) for v in _values(current, "NodeName"))


def parse_share(value: str | float | None) -> float:
    """--max-drained: a share of a partition, `10%` or `10` (0 to 100); InputError otherwise."""
    if value is None:
        return DEFAULT_MAX_DRAINED_PCT
    text = str(value).strip().removesuffix("%").strip()
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 100 or text.lower() in ("nan", "inf"):
        raise InputError(f"--max-drained {value!r}: expected a share of a partition from 0% to 100% (such as 10%)",
                         step="health.deploy")
    return share


def check_path(flag: str, path: str) -> str:
    """An absolute path of plain characters (it goes to a shell and into slurm.conf)."""
    if not _PATH.fullmatch(path) or "/../" in f"{path}/":
        raise InputError(f"{flag} {path!r}: expected an absolute path of letters, digits, '.', '_', '-' and '/'",
                         step="health.deploy")
    return path


@dataclass(frozen=True)
class Options:
    interval: int = DEFAULT_INTERVAL_S
    max_drained_pct: float = DEFAULT_MAX_DRAINED_PCT
    epilog: bool = True
    slurm_conf: str = SLURM_CONF


@dataclass
class HealthRecord(HostRecord):
    """A host's deploy: its role (node or controller) and, on the controller, how `scontrol reconfigure` went."""

    plan: list[dict] = field(default_factory=list)
    role: str = "node"
    reconfigure: str = ""

    def details(self) -> dict:
        return {"role": self.role, "reconfigure": self.reconfigure}


def host_settings(host, textfile_dir: str, max_pct: float) -> dict:
    """/etc/gpuprov/health.json for a node: expected_gpus from hardware.count, expect_nvlink from hardware.nvswitch
    or an SXM model of the catalog with more than one GPU (a host whose links are all down looks like one without
    NVLink, so it must be told)."""
    from gpuprov import catalog

    hardware = host.vars.get("hardware") or {}
    settings: dict = {"slurm": True, "max_drained_pct": max_pct, "textfile_dir": textfile_dir}
    count = hardware.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        settings["expected_gpus"] = count
    model = catalog.find(str(hardware.get("gpu") or ""))
    sxm = model is not None and model.form_factor == "sxm" and (count or 0) > 1
    settings["expect_nvlink"] = bool(hardware.get("nvswitch")) or sxm
    return settings


def textfile_dir(host) -> str:
    """node_exporter's textfile folder, as monitoring and validate use it (validate.textfile_dir, else Debian's)."""
    from gpuprov.monitoring.policy import TEXTFILE_DIR

    return check_path("validate.textfile_dir", (host.vars.get("validate") or {}).get("textfile_dir") or TEXTFILE_DIR)


def probe_command() -> str:
    """Prints `python3 X.Y` (or `python3 none`)."""
    return ("v=$(python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null || echo none); "
            "echo \"python3 $v\"")


def folder_policy(host):
    """The monitoring policy of the textfile folder alone (what gpuprov.monitoring.exporters reads of it)."""
    from gpuprov.monitoring.policy import MonitoringPolicy

    return MonitoringPolicy(host=host.name, address=host.address, textfile_dir=textfile_dir(host))


def textfile_changes(host, facts: dict) -> list:
    """The textfile folder made or kept root:root 0755 as monitoring.deploy does (gpuprov.monitoring.exporters: on
    Debian its package folder /var/lib/prometheus kept root's by a dpkg-statoverride too), from the folder's state
    in the facts (`textfile_dir`: exporters.parse_state's). A link, a file or a shared folder there is a
    GpuprovError naming the host, the step and the path."""
    from gpuprov.core.operations import OpContext
    from gpuprov.monitoring import exporters

    policy = folder_policy(host)
    ctx = OpContext(host.name, facts, stack={}, repo=None, host_vars=host.vars)
    debian = (facts.get("os") or {}).get("family") == "debian"
    return [*(exporters.package_dir(ctx, policy) if debian else ()), *exporters.textfile_dir(ctx, policy)]


class HealthDeployJob(HostJob):
    """`invoke health.deploy` on the selected Slurm nodes and their controller."""

    kind = "health-deploy"
    task = "health.deploy"
    columns = ("host", "role", "status", "changes", "detail")
    variables = ("hardware", "scheduler", "validate")

    def __init__(self, options: Options, controller: str, dry_run: bool = False):
        super().__init__(dry_run)
        self.options, self.controller = options, controller
        self.block = render_block(options.interval, options.epilog)

    def new_record(self, host) -> HealthRecord:
        return HealthRecord(host.name, role="controller" if host.name == self.controller else "node")

    def managed_files(self, host) -> tuple[str, ...]:
        """The node's files; the controller's too, as it may be a node as well (slurm_node)."""
        return (PROGRAM, EPILOG, CONFIG, self.options.slurm_conf)

    def gather(self, conn, record: HealthRecord) -> dict:
        facts = dict(super().gather(conn, record))
        current = (facts.get("files") or {}).get(self.options.slurm_conf) or ""
        if record.role == "node" or slurm_node(conn.host, current):
            from gpuprov.monitoring.deploy import textfile_dir_state

            probe = dict(line.split(" ", 1) for line in conn.run(probe_command(), timeout=60).stdout.splitlines()
                         if " " in line)
            facts["health_probe"] = probe
            facts["textfile_dir"] = textfile_dir_state(conn, folder_policy(conn.host))
        return facts

    def plan(self, conn, record: HealthRecord) -> list:
        from gpuprov.core.operations import change_dict, managed_file
        from gpuprov.health.codes import render_program

        host, files = conn.host, record.facts_before.get("files") or {}
        current = files.get(self.options.slurm_conf)
        if current is None:
            raise GpuprovError(f"{self.options.slurm_conf} is not there: {host.name} is no Slurm "
                               f"{'controller' if record.role == 'controller' else 'node'} with its slurm.conf there",
                               host=host.name, step="slurm.conf",
                               hint="install Slurm first, or give --slurm-conf PATH where this cluster keeps it")
        if configless(current):
            raise GpuprovError(f"{host.name}:{self.options.slurm_conf} runs Slurm configless (SlurmctldParameters "
                               "has enable_configless): every node reads the controller's slurm.conf, so each node "
                               "health.deploy did not install would get an Epilog it lacks and be drained after "
                               "every job", host=host.name, step="slurm.conf",
                               command=f"grep -i SlurmctldParameters {self.options.slurm_conf}",
                               hint="health.deploy does not wire configless Slurm: give every node of the cluster "
                                    f"{PROGRAM} and {EPILOG} first, then add HealthCheckProgram and Epilog to the "
                                    "controller's slurm.conf yourself")
        changes = []
        if record.role == "controller" and slurm_node(host, current):
            record.role = "controller+node"
        if record.role != "controller":
            probe = record.facts_before["health_probe"]
            version = probe.get("python3", "none")
            if version == "none" or tuple(int(p) for p in version.split(".")) < MIN_PYTHON:
                raise GpuprovError(f"gpuprov-health needs python3 {'.'.join(map(str, MIN_PYTHON))} or newer on "
                                   f"{host.name}, found {version}", host=host.name, step="python3",
                                   hint="install python3 (Debian: apt-get install python3-minimal)")
            folder = textfile_dir(host)
            settings = host_settings(host, folder, self.options.max_drained_pct)
            changes += textfile_changes(host, record.facts_before)
            changes += [c for c in (
                managed_file("health", PROGRAM, files.get(PROGRAM), render_program(), "the passive health check",
                             mode="0755", owner="root:root"),
                managed_file("health", EPILOG, files.get(EPILOG), f"#!/bin/sh\nexec {PROGRAM} --epilog\n",
                             "Slurm's Epilog: the deeper check after a failed job", mode="0755", owner="root:root"),
                managed_file("health", CONFIG, files.get(CONFIG), json.dumps(settings, indent=1, sort_keys=True)
                             + "\n", "the health check's settings", owner="root:root"),
            ) if c is not None]
        merged = merge_block(current, self.block, f"{host.name}:{self.options.slurm_conf}")
        change = managed_file("slurm.conf", self.options.slurm_conf, current, merged, "gpuprov's health block",
                              owner="root:root")
        if change is not None:
            changes.append(change)
        record.plan = [change_dict(c) for c in changes]
        return changes

    def finish(self, fleet, records: list, entries: list[dict]) -> dict:
        """`scontrol reconfigure` on the controller when any slurm.conf changed and every host is done (held back,
        and said so, when a host failed or was skipped: its program may be missing where slurm.conf names it)."""
        changed = [r.host for r in records if r is not None and r.status in ("changed", "planned")
                   and any(step.get("component") == "slurm.conf" for step in r.plan)]
        differing = self._copies_differ(records)
        notices = [f"slurm.conf differs between {', '.join(differing)}: Slurm wants the same file everywhere"] \
            if differing else []
        if self.dry_run or not changed:
            return {"reconfigure": "not needed" if not self.dry_run else "planned" if changed else "not needed",
                    "notices": notices}
        unfinished = [e["host"] for e in entries if e.get("status") not in ("changed", "unchanged")]
        if unfinished:
            outcome = (f"held back: health.deploy did not finish on {', '.join(unfinished)}, so Slurm is not told "
                       f"of the new slurm.conf on {', '.join(changed)} (its HealthCheckProgram and Epilog would be "
                       "missing there); fix those hosts and run health.deploy again")
            self._set_reconfigure(entries, outcome)
            return {"reconfigure": outcome, "notices": [*notices, f"scontrol reconfigure {outcome}"]}
        from gpuprov.core.controller import controller_runner

        runner = controller_runner(fleet, self.controller)
        try:
            rc, out, err = runner(["scontrol", "reconfigure"], admin=True)
            outcome = "done" if rc == 0 else f"failed: exit {rc}: {(err or out).strip()[:300]}"
        except GpuprovError as exc:
            outcome = f"failed: {exc}"
        finally:
            runner.close()
        self._set_reconfigure(entries, outcome)
        return {"reconfigure": outcome, "notices": notices}

    def _set_reconfigure(self, entries: list[dict], outcome: str) -> None:
        for entry in entries:
            if entry["host"] == self.controller:
                entry["reconfigure"] = outcome

    def _copies_differ(self, records: list) -> list[str]:
        """The hosts whose slurm.conf (as left by this run) is not the same text, [] when all agree."""
        texts = {}
        for record in records:
            if record is not None and record.facts_after:
                text = (record.facts_after.get("files") or {}).get(self.options.slurm_conf)
                if text is not None:
                    texts[record.host] = text
        return sorted(texts) if len(set(texts.values())) > 1 else []

    def failing(self, entry: dict) -> bool:
        return str(entry.get("reconfigure", "")).startswith(("failed", "held back"))

    def row(self, entry: dict) -> dict:
        detail = error_line(entry) or (f"scontrol reconfigure: {entry['reconfigure']}" if entry.get("reconfigure")
                                       else "")
        return {"host": entry["host"], "role": entry.get("role", ""), "status": entry.get("status", "failed"),
                "changes": str(len(entry.get("plan") or [])), "detail": detail}

    def report_fields(self) -> dict:
        return {"dry_run": self.dry_run, "interval_s": self.options.interval,
                "max_drained_pct": self.options.max_drained_pct, "epilog": self.options.epilog,
                "slurm_conf": self.options.slurm_conf, "controller": self.controller}


def controller_of(hosts) -> str:
    """The one `scheduler.controller` the selected nodes name (a selected host that is that controller is no node);
    InputError (exit 2) otherwise."""
    named = {(h.vars.get("scheduler") or {}).get("controller") for h in hosts}
    nodes = [h for h in hosts if h.name not in named]
    if not nodes:
        raise InputError("health.deploy: no Slurm node among the selected hosts", step="health.deploy",
                         hint="select the GPU nodes (their controller is added by itself)")
    return controller_name(nodes, "health.deploy", "health.deploy",
                           "set scheduler.controller to the inventory host that runs slurmctld")


def run_deploy(c, fleet_args: dict, options: Options, dry_run: bool) -> int:
    """Open the fleet (the selected nodes, then their controller), run the job; the exit code."""
    from gpuprov.core.runtime import run_fleet
    from gpuprov.tasks._common import check_sudo_passwords, open_fleet

    fleet = open_fleet(c, **fleet_args)
    controller = controller_of(fleet.hosts)
    if controller not in {h.name for h in fleet.hosts}:
        extra = fleet.inventory.host(controller)
        check_sudo_passwords([extra])
        fleet.hosts = [*fleet.hosts, extra]
    return run_fleet(fleet, HealthDeployJob(options, controller, dry_run=dry_run))
