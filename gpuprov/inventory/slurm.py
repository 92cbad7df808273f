"""An inventory's `slurm:` source: the nodes, partitions, features, gres and states a Slurm controller reports,
merged below the YAML file's own hosts, groups and defaults.

    slurm:
      controller: ctl01      # an inventory host (its SSH settings) whose sinfo is read; `local`: run it here
      partitions: [gpu]      # optional: only the nodes of these partitions, only these groups

The file may list no hosts but the controller (none at all with `local`): Slurm's nodes are then its hosts, and
its defaults and groups give them their SSH settings. load_inventory reads the controller every time it loads
such a file (from_controller: one verified SSH connection, the known_hosts of the file, else of gpuprov's
settings), after the file alone is checked: a bad file is told before any host is contacted.

What is read: `sinfo --json` (Slurm 22.05, Debian bookworm's slurm-wlm 22.05.8; SchedMD's source at tag
slurm-22-05-8-1). There `sinfo --json` prints the openapi/v0.0.38 plugin's answer to GET /slurm/v0.0.38/nodes/
(src/sinfo/data.c dump_data; src/plugins/openapi/v0.0.38/nodes.c _dump_node), and "all other formatting and
filtering arguments will be ignored" (doc/man/man1/sinfo.1, --json), so the partition filter is applied here.
22.05's scontrol has no --json. Debian ships the plugins it needs (openapi_v0_0_38.so and serializer_json.so in
slurm-wlm-basic-plugins, which slurm-client depends on). From 23.02 sinfo --json prints the data_parser's answer,
read too (parse_sinfo_json). The answer is read whole: sinfo exits 0 even when slurmctld does not answer, with the
failure in `errors` (recorded from the lab: tests/fixtures/slurm/). JSON rather than `sinfo -O`: a drain reason is
free text, and in a line format a reason holding a line break could forge a node line; in JSON it is one string.
Older Slurm (before 21.08: no --json) is refused with a clear error, not read another way.

Each node becomes a host (its NodeName is the host name; its NodeAddr, else its NodeName, the address when the YAML
gives none; a node that is a file host of another name, by that host's address or scheduler.node, is refused: the
same machine would be two hosts); each partition a group; the gres and features hardware variables; the state facts:

    hardware: {gpu: H100-SXM, count: 8}   gpu: the gres type found in gpuprov's catalog, else left out; none at
                                          all for MIG slices (`gpu:nvidia_a100_3g.40gb:14`: slices, not GPUs)
    slurm_gres: "gpu:h100-sxm:8"          the node's gres as Slurm prints it
    slurm_features: [hgx, nvswitch]       the node's available features
    slurm_state: idle+drain               the base state, then `+flag` per flag, lower-cased (as sinfo's StateComplete,
                                          which gpuprov.rollout.slurm reads)
    slurm_reason: "..."                   the reason a node is drained or down ("" for none)
    scheduler: {kind: slurm, controller: ctl01}   what `rollout --drain slurm` drains it through (not with `local`)

Precedence, lowest first: what Slurm says, then the file's defaults, groups and host (gpuprov.inventory.merge): any
value written in the file wins. A node name or partition name that cannot be an inventory name, a partition the
filter names that Slurm lacks, no host at all, are errors located at the file's `slurm:` key. Node names never reach
a command line: the one command run is the fixed `sinfo --json`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gpuprov import catalog
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.levels import (
    GROUP_NAME,
    HOST_NAME,
    MAX_HOST_NAME,
    Level,
    Levels,
    as_mapping,
    group_name_ok,
    known_keys,
)
from gpuprov.inventory.located import Located
from gpuprov.inventory.model import is_valid_address

LOCAL = "local"
STEP = "inventory.slurm"
SOURCE_KEYS = ("controller", "partitions")
SINFO_JSON = ("sinfo", "--json")
COMMAND_TIMEOUT_S = 60
# run(argv, admin) -> (exit code, stdout, stderr), as gpuprov.core.controller.ControllerRunner
Runner = Callable[[list[str], bool], tuple[int, str, str]]
# (the file's slurm: block, the inventory the file alone makes) -> Slurm's nodes: what load_inventory is given
NodeReader = Callable[["SlurmSource", Any], list["SlurmNode"]]
# the base states (src/common/slurm_protocol_defs.c node_states[]), lower-cased
BASES = frozenset({"down", "idle", "allocated", "error", "mixed", "future", "unknown"})
# a gres entry (src/common/gres.c: name[:type][:count], an optional `(S:0-1)` socket list after it); the count is a
# uint64 (at most 20 digits)
_GRES = re.compile(r"(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?(?::(?P<count>[0-9]{1,20}))?(?:\(.*\))?")
# a MIG profile in a gres type: `3g.40gb`, AutoDetect=nvml's `nvidia_a100_3g.40gb`, `1g.10gb+me` (NVIDIA's MIG
# user guide names profiles <compute slices>g.<memory>gb): such a gpu gres counts slices, not GPUs
_MIG = re.compile(r"(?:^|[_-])\d+g\.\d+gb(?:\+\w+)?$", re.IGNORECASE)


class SlurmAnswerError(ValueError):
    """Slurm's answer is not what gpuprov reads (what is wrong, in words)."""


@dataclass(frozen=True)
class SlurmSource:
    """The file's `slurm:` block: the controller host (or LOCAL) and the partition filter (None: every one)."""

    controller: str
    partitions: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SlurmNode:
    """One node as Slurm reports it; the state and its flags lower-cased."""

    name: str
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    gres: str = ""
    state: str = "unknown"
    flags: tuple[str, ...] = ()
    reason: str = ""
    address: str = ""       # NodeAddr ("" when Slurm gives none)

    def state_complete(self) -> str:
        """`idle+drain`: the base state, then each flag (as sinfo's StateComplete)."""
        return "+".join((self.state, *self.flags))


def read_source(doc: Located, document: dict) -> SlurmSource | None:
    """The `slurm:` block of a native document (None when it has none); shape errors in `doc`."""
    if "slurm" not in document:
        return None
    body = as_mapping(doc, document["slurm"], ("slurm",), "slurm")
    if body is None:
        return None
    known_keys(doc, body, ("slurm",), SOURCE_KEYS, "slurm")
    controller = body.get("controller")
    if "controller" not in body:
        doc.error(("slurm",), f"slurm needs controller: an inventory host or {LOCAL!r}")
        return None
    if not isinstance(controller, str) or not controller:
        doc.error(("slurm", "controller"), f"controller must be an inventory host or {LOCAL!r}, not "
                                           f"{show(controller)}")
        return None
    partitions = body.get("partitions")
    if partitions is None:
        return SlurmSource(controller)
    if not isinstance(partitions, list) or not partitions:
        doc.error(("slurm", "partitions"), f"partitions must be a non-empty list of partition names, not "
                                           f"{show(partitions)}")
        return None
    names = [p for i, p in enumerate(partitions) if group_name_ok(doc, p, ("slurm", "partitions", i))]
    return SlurmSource(controller, tuple(names)) if len(names) == len(partitions) else None


def check_controller(doc: Located, source: SlurmSource, hosts: dict) -> None:
    """An error at `slurm.controller` unless it names an inventory host or LOCAL."""
    if source.controller != LOCAL and source.controller not in hosts:
        doc.error(("slurm", "controller"), f"unknown host {source.controller!r}{suggest(source.controller, hosts)}: "
                                           f"the controller is a host of this inventory, or {LOCAL!r}")


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """The nodes of `sinfo --json`: 22.05's openapi v0.0.38 answer, or the data_parser answer of 23.02 on (the node
    keys gpuprov reads are the same there, but `state` is a list of names and `features` a list: tag slurm-23-02-0-1
    src/plugins/data_parser/v0.0.39/parsers.c, PARSE_NODE); SlurmAnswerError for anything else."""
    try:
        answer = json.loads(text)
    except ValueError as exc:
        raise SlurmAnswerError(f"not JSON ({exc})") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("nodes"), list):
        raise SlurmAnswerError("no list of nodes: expected a mapping with nodes: [...]")
    errors = answer.get("errors") or []
    if errors:
        raise SlurmAnswerError(f"Slurm reported errors: {show(errors)}")
    return [_node(i, item) for i, item in enumerate(answer["nodes"])]


def _node(index: int, item: Any) -> SlurmNode:
    if not isinstance(item, dict):
        raise SlurmAnswerError(f"nodes[{index}] is {type_name(item)}, not a mapping")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise SlurmAnswerError(f"nodes[{index}] has no name")

    def text(key: str) -> str:
        value = item.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise SlurmAnswerError(f"node {show(name)}: {key} is {type_name(value)}, not text")
        return value

    def strings(key: str) -> tuple[str, ...]:
        value = item.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SlurmAnswerError(f"node {show(name)}: {key} is not a list of names")
        return tuple(value)

    if isinstance(item.get("state"), list):         # data_parser (23.02 on): ["IDLE", "DRAIN"], features a list
        names = [n.lower() for n in strings("state")]
        base = next((n for n in names if n in BASES), "unknown")
        state, flags = base, tuple(n for n in names if n != base)
        features = strings("features")
    else:                                            # openapi v0.0.38 (22.05): "idle", state_flags, "a,b"
        state, flags = text("state") or "unknown", tuple(f.lower() for f in strings("state_flags"))
        features = tuple(f for f in text("features").split(",") if f)
    gres = text("gres")
    try:
        gpu_gres(gres)
    except SlurmAnswerError as exc:
        raise SlurmAnswerError(f"node {show(name)}: {exc}") from None
    return SlurmNode(name=name, partitions=strings("partitions"), features=features, gres=gres, state=state,
                     flags=flags, reason=text("reason"), address=text("address"))


def gpu_gres(gres: str) -> tuple[str | None, int]:
    """(type, count) of the `gpu` entries of a node's gres (`gpu:h100-sxm:8(S:0-1),nvme:1`); the type is None when
    untyped or when the node has GPUs of more than one type. An entry without a count counts 1 (gres.conf's Count
    default); SlurmAnswerError for a `gpu` entry that is not of that form."""
    types, count = set(), 0
    for entry in filter(None, gres.split(",")):
        match = _GRES.fullmatch(entry)
        if not match and entry.split(":")[0].split("(")[0] == "gpu":
            raise SlurmAnswerError(f"gres entry {show(entry)} is not gpu[:type][:count]")
        if not match or match["name"] != "gpu":
            continue
        kind, number = match["type"], match["count"]
        if kind is not None and kind.isdigit() and number is None:   # gpu:8: the count, no type
            kind, number = None, kind
        types.add(kind)
        count += int(number) if number is not None else 1
    return (types.pop() if len(types) == 1 else None), count


def mig_types(gres: str) -> list[str]:
    """The MIG profile types among a node's `gpu` gres entries (`nvidia_a100_3g.40gb`), in order, [] for none."""
    out = []
    for entry in filter(None, gres.split(",")):
        match = _GRES.fullmatch(entry)
        if match and match["name"] == "gpu" and match["type"] and _MIG.search(match["type"]):
            out.append(match["type"])
    return out


def catalog_gpu(gres_type: str) -> str | None:
    """The catalog key of a gres type: a catalog key, alias or nvidia-smi name in any case (`h100-sxm`, the lab's
    form), or AutoDetect=nvml's form, the NVML name lower-cased with spaces as `_` (`nvidia_h100_80gb_hbm3`,
    src/plugins/gpu/nvml/gpu_nvml.c gpu_common_underscorify_tolower). None when the catalog has neither."""
    model = catalog.find(gres_type) or catalog.find(gres_type.replace("_", " "))
    return model.key if model else None


def host_vars(node: SlurmNode) -> dict:
    """The variables a node gives its host. A node with MIG slices in its gres gets no hardware: the slices are not
    its GPUs (a count of them would be the wrong expected GPU count)."""
    out: dict = {}
    kind, count = gpu_gres(node.gres)
    if count and not mig_types(node.gres):
        model = catalog_gpu(kind) if kind else None
        out["hardware"] = {**({"gpu": model} if model else {}), "count": count}
    out.update(slurm_gres=node.gres, slurm_features=list(node.features), slurm_state=node.state_complete(),
               slurm_reason=node.reason)
    return out


def unmapped_types(nodes: list[SlurmNode]) -> dict[str, list[str]]:
    """{gres type: nodes} for the GPU types the catalog does not know (those hosts get hardware.count only)."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        kind, count = gpu_gres(node.gres)
        if count and kind and catalog_gpu(kind) is None and not mig_types(node.gres):
            out.setdefault(kind, []).append(node.name)
    return out


def add_to_levels(doc: Located, levels: Levels, source: SlurmSource, nodes: list[SlurmNode]) -> dict[str, Level]:
    """Put Slurm's nodes and partitions into the file's levels: a partition the file lacks becomes a group, a node it
    lacks a host (the defaults apply), each node's partitions come before the groups the file lists for it. Returns
    each node's Slurm level, which merges below the file's defaults. Errors (and a warning for GPU types the
    catalog lacks) are located at `slurm:`; a node in none of the partitions read is left out."""
    where = ("slurm",)
    seen = {p for node in nodes for p in node.partitions}
    for i, name in enumerate(source.partitions or ()):
        if name not in seen:
            doc.error(("slurm", "partitions", i), f"sinfo --json on {_where(source)} lists no partition "
                                                  f"{name!r}{suggest(name, sorted(seen))}")
    wanted = set(source.partitions) if source.partitions is not None else seen
    file_hosts = dict(levels.hosts)
    below: dict[str, Level] = {}
    for node in nodes:
        parts = [p for p in node.partitions if p in wanted]
        if not parts or not _node_name_ok(doc, node.name, source):
            continue
        if not all(_partition_ok(doc, p, source) for p in parts) or not _one_machine(doc, file_hosts, node, source):
            continue
        for part in parts:
            levels.groups.setdefault(part, Level(f"group:{part}", where))
        host = levels.hosts.setdefault(node.name, Level("host", where))
        listed = {name for name, _ in host.links}
        host.links[:0] = [(p, where) for p in parts if p not in listed]
        values = host_vars(node)
        if source.controller != LOCAL:   # rollout --drain slurm drains the node through this host
            values["scheduler"] = {"kind": "slurm", "controller": source.controller}
        settings = _address(doc, file_hosts.get(node.name), node, source)
        below[node.name] = Level("slurm", where, settings=settings, vars={k: (v, where) for k, v in values.items()})
    for kind, names in unmapped_types([n for n in nodes if n.name in below]).items():
        doc.warn(where, f"gres type {show(kind)} ({', '.join(names)}) is not in gpuprov's catalog: those hosts get "
                        "hardware.count only; give their hardware.gpu in the file")
    mig = {n.name: mig_types(n.gres) for n in nodes if n.name in below and mig_types(n.gres)}
    if mig:
        doc.warn(where, f"MIG slices in the gres of {', '.join(mig)} "
                        f"({', '.join(sorted({t for types in mig.values() for t in types}))}): Slurm counts slices, "
                        "not GPUs, so those hosts get no hardware.count; give their hardware.count (the physical "
                        "GPUs) and hardware.gpu in the file")
    return below


def no_hosts_problem(source: SlurmSource, nodes: list[SlurmNode]) -> str:
    """Why an inventory made of a file without hosts and Slurm's answer has no host."""
    where = f"sinfo --json on {_where(source)}"
    if source.partitions is None:
        return f"no hosts: {where} lists no nodes, and the file lists no hosts"
    return (f"no hosts: {where} lists no nodes in {', '.join(source.partitions)} ({len(nodes)} node"
            f"{'s' if len(nodes) != 1 else ''} in all), and the file lists no hosts")


def _address(doc: Located, file_host: Level | None, node: SlurmNode, source: SlurmSource) -> dict:
    """The node's settings from Slurm: its NodeAddr as the address, where it is not the name. A NodeAddr that is no
    host name or IP address is an error at `slurm:` unless the file gives the host an address."""
    if not node.address or node.address == node.name:
        return {}
    if is_valid_address(node.address):
        return {"address": (node.address, ("slurm",))}
    if file_host is None or "address" not in file_host.settings:
        doc.error(("slurm",), f"Slurm node {show(node.name)} (sinfo --json on {_where(source)}) has the NodeAddr "
                              f"{show(node.address)}, which is not a host name or IP address: give the host's "
                              "address: in the file", at_key=True)
    return {}


def _one_machine(doc: Located, file_hosts: dict[str, Level], node: SlurmNode, source: SlurmSource) -> bool:
    """False, with an error at `slurm:`, when a file host of another name is this node: its address is the node's
    NodeAddr or name, or its scheduler.node names it (the same machine would be two hosts)."""
    for name, level in file_hosts.items():
        if name == node.name:
            continue
        address = level.settings.get("address", (name, None))[0]
        scheduler = level.vars.get("scheduler", ({}, None))[0]
        if isinstance(scheduler, dict) and scheduler.get("node") == node.name:
            why = f"its scheduler.node is {node.name}"
        elif address in (node.name, node.address):
            why = f"its address {address} is the node's {'NodeAddr' if address == node.address else 'name'}"
        else:
            continue
        doc.error(("slurm",), f"Slurm node {show(node.name)} (sinfo --json on {_where(source)}) is the file's host "
                              f"{name!r} ({why}): the same machine would be two hosts; name that host "
                              f"{node.name!r} in the file", at_key=True)
        return False
    return True


def _node_name_ok(doc: Located, name: str, source: SlurmSource) -> bool:
    if HOST_NAME.fullmatch(name) and len(name) <= MAX_HOST_NAME:
        return True
    doc.error(("slurm",), f"Slurm node {show(name)} (sinfo --json on {_where(source)}) cannot be an inventory "
                          "host name: use letters, digits, '.', '_', ':' and '-'", at_key=True)
    return False


def _partition_ok(doc: Located, name: str, source: SlurmSource) -> bool:
    if GROUP_NAME.fullmatch(name):
        return True
    doc.error(("slurm",), f"Slurm partition {show(name)} (sinfo --json on {_where(source)}) cannot be a group "
                          "name: use letters, digits, '.', '_' and '-'", at_key=True)
    return False


def read_nodes(source: SlurmSource, run: Runner) -> list[SlurmNode]:
    """`sinfo --json` on the controller, parsed; GpuprovError naming the command and the controller when it fails
    or prints what gpuprov cannot read."""
    argv = list(SINFO_JSON)
    where = _where(source)
    rc, out, err = run(argv, True)
    if rc != 0:
        output = "\n".join(part for part in (out.rstrip("\n"), err.rstrip("\n")) if part)
        raise GpuprovError(f"sinfo --json failed (exit {rc}, on the Slurm controller {where})", host=where,
                           step=STEP, command=shlex.join(argv), output=output[-4000:],
                           hint=f"check that slurmctld answers (scontrol ping on {where}) and that this Slurm has "
                                "sinfo --json (21.08 or later, with its serializer/json plugin)")
    try:
        return parse_sinfo_json(out)
    except SlurmAnswerError as exc:
        raise GpuprovError(f"sinfo --json on the Slurm controller {where} printed what gpuprov cannot read: {exc}",
                           host=where, step=STEP, command=shlex.join(argv), output=out[:4000],
                           hint=f"check that slurmctld answers (scontrol ping on {where}); gpuprov reads sinfo "
                                "--json of Slurm 22.05 (openapi v0.0.38) and later (data_parser)") from None


def _where(source: SlurmSource) -> str:
    return "this machine" if source.controller == LOCAL else source.controller


def run_local(argv: list[str], admin: bool) -> tuple[int, str, str]:
    """argv on this machine, without a shell. `admin` is not acted on: the command runs as this user (with
    PrivateData=nodes in slurm.conf a user who is neither root nor SlurmUser sees fewer nodes)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S,
                              check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{shlex.join(argv)}: no answer within {COMMAND_TIMEOUT_S} s"
    return done.returncode, done.stdout, done.stderr


def runner_for(source: SlurmSource, inventory, settings) -> Runner:
    """How to run the command: here for LOCAL, else over SSH to the controller host (the rollout's runner: one
    verified connection, sudo when its user is not root)."""
    if source.controller == LOCAL:
        return run_local
    from gpuprov.core.controller import ControllerRunner

    host = inventory.host(source.controller)
    return ControllerRunner(host, settings, jump=inventory.jump_host(host))


def nodes_via(settings) -> NodeReader:
    """The NodeReader that runs sinfo on the controller (runner_for) with these executor settings, closing its
    connection afterwards. A failure to reach the controller is a GpuprovError naming it, this step and the
    command; bad input met on the way (a broken known_hosts file, a sudo password variable not set) stays the
    InputError it is (exit 2)."""

    def read(source: SlurmSource, inventory) -> list[SlurmNode]:
        run = None
        try:
            run = runner_for(source, inventory, settings)
            return read_nodes(source, run)
        except GpuprovError as exc:
            if exc.step == STEP or isinstance(exc, InputError):
                raise
            raise GpuprovError(f"cannot read Slurm's nodes from the controller {source.controller}: {exc.message}",
                               host=source.controller, step=STEP, command=shlex.join(SINFO_JSON),
                               output=exc.output, hint=_reach_hint(source, inventory, settings, exc)) from None
        finally:
            close = getattr(run, "close", None)
            if close is not None:
                close()

    return read


def _reach_hint(source: SlurmSource, inventory, settings, exc: GpuprovError) -> str:
    """What to do when the controller cannot be reached: the inventory is read before any host task can run, so a
    host key is recorded by hand (--trust-new-hosts cannot reach this step)."""
    from gpuprov.core.connection import HostKeyError, known_hosts_name

    host = inventory.host(source.controller)
    then = ("every task that loads this inventory reads Slurm's nodes on that host first: fix the connection, or "
            "name another host with the Slurm client (or 'local') as slurm.controller")
    if isinstance(exc, HostKeyError) and exc.message.startswith("unknown host key"):
        name = known_hosts_name(host.address, host.port)
        return (f"check the key's fingerprint out of band, then add its line for {name} to {settings.known_hosts} "
                f"(ssh-keyscan -p {host.port} {shlex.quote(host.address)} prints it); {then}")
    return f"{exc.hint}; {then}" if exc.hint else then


def controller_settings(inventory, config):
    """Executor settings for the controller's one connection: the file's known_hosts, else gpuprov's; gpuprov's
    connect timeout and retries; never trusting a new host key (sinfo itself has COMMAND_TIMEOUT_S)."""
    from gpuprov.core.executor import Settings

    return Settings(known_hosts=inventory.known_hosts or config.known_hosts, parallel=1,
                    connect_timeout=config.connect_timeout, connect_retries=config.connect_retries)


def task_config():
    """gpuprov's settings as a task run in this folder reads them (the system's, the user's and this folder's
    invoke.yaml, INVOKE_RUNTIME_CONFIG, INVOKE_GPUPROV_*): load_inventory is called without the task's context.
    ConfigError (exit 2) for a bad one, as the task itself would raise."""
    from invoke import Config

    from gpuprov.core.config import settings

    config = Config(project_location=os.getcwd(), runtime_path=os.environ.get("INVOKE_RUNTIME_CONFIG"), lazy=True)
    config.load_base_conf_files()
    config.load_project(merge=False)
    config.load_runtime(merge=False)
    config.load_shell_env()
    return settings(SimpleNamespace(config=config))


def from_controller(source: SlurmSource, inventory) -> list[SlurmNode]:
    """load_inventory's NodeReader: sinfo --json on the controller, with controller_settings of task_config."""
    return nodes_via(controller_settings(inventory, task_config()))(source, inventory)
