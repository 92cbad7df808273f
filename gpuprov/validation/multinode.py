"""`invoke validate --multi-node`: one all-reduce across every selected host with torchrun and a c10d
rendezvous at the first host's cluster address (the per-host `cluster_address` variable, default the
inventory address), NCCL on GPUs and gloo on CPUs.

First every host proves it can join: each checks that its cluster address is one of its own (a host whose
address is not is named at once, and not waited for); then the first host listens on the rendezvous port of
its cluster address and every other host connects to it and says its name, so a host that cannot join is
named, with why (its cluster address is not its own, the rendezvous is unreachable from it, it did not answer
SSH, its suite environment failed). Only when every host joined does torchrun start on all of them at once;
the all-reduce result is checked (an exact sum) and the bus bandwidth reported. Each host gets a
`multinode.allreduce` result.

On GPUs the run records, per host, the network NCCL used between the hosts (`nccl_network`: IB or Socket, from its
NCCL_DEBUG=INFO lines, subsystems INIT and NET) and the host's RDMA devices (/sys/class/infiniband): a host with
InfiniBand or RoCE devices it can open (/dev/infiniband/uverbs*) whose NCCL fell back to sockets fails the run
(unless NCCL_IB_DISABLE=1 there). With --image, such a host gives /dev/infiniband and IPC_LOCK to the container.

torchrun's c10d store is unauthenticated and its dynamic rendezvous unpickles what the store holds, so: the
workers run as an unprivileged system user (gpuprov-validate, created on each host, in the video/render group
where the GPU device files belong to one), and for the run the rendezvous host drops connections to the
rendezvous port from every address but the joined hosts' (seen by its listener) with an nftables table of its
own, added before torchrun starts and removed when it ends, also on failure. A rendezvous host without a working
nft is refused (fail closed): the run does not start there.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
from importlib import resources

from gpuprov.core.errors import GpuprovError
from gpuprov.validation import LAYOUT, Layout

CHECK = "multinode.allreduce"
MARK = "GPUPROV-MULTINODE "
JOIN_SECONDS = 30
RUN_TIMEOUT = {"quick": 600, "burn-in": 1800}
SIZE_MIB = {"cuda": 256, "cpu": 16}
ITERS = {"quick": 10, "burn-in": 100}
WORKER_USER = "gpuprov-validate"
DEVICE_GROUPS = ("video", "render")
NO_FIREWALL = 97   # the rendezvous host's exit status when the rendezvous port could not be firewalled

LISTENER = r"""
import json, socket, sys, time
addr, port, timeout, expected = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), set(sys.argv[4:])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((addr, port))
except OSError as exc:
    print(json.dumps({"error": "cannot listen on %s:%d: %s" % (addr, port, exc.strerror or exc)}))
    sys.exit(0)
s.listen(64)
joined, deadline = {}, time.monotonic() + timeout
while set(joined) < expected and time.monotonic() < deadline:
    s.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        c, peer = s.accept()
    except OSError:
        break
    try:
        c.settimeout(5)
        data = b""
        while not data.endswith(b"\n") and len(data) < 512:
            chunk = c.recv(512)
            if not chunk:
                break
            data += chunk
        name = data.decode(errors="replace").strip()
        c.sendall(b"ok\n")
        c.recv(1)
        if name in expected:
            joined[name] = peer[0]
    except OSError:
        pass
    finally:
        c.close()
s.close()
print(json.dumps({"joined": joined}))
"""

OWN_ADDRESS = r"""
import json, socket, sys
own = sys.argv[1]
try:
    probe = socket.socket(socket.AF_INET6 if ":" in own else socket.AF_INET, socket.SOCK_STREAM)
    probe.bind((own, 0))
    probe.close()
except OSError as exc:
    print(json.dumps({"error": "its cluster_address %s is not an address of this host (%s)"
                      % (own, exc.strerror or exc)}))
    sys.exit(0)
print(json.dumps({"own": True}))
"""

CONNECTOR = r"""
import json, socket, sys, time
addr, port, name, own, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
try:
    probe = socket.socket(socket.AF_INET6 if ":" in own else socket.AF_INET, socket.SOCK_STREAM)
    probe.bind((own, 0))
    probe.close()
except OSError as exc:
    print(json.dumps({"joined": False, "error": "its cluster_address %s is not an address of this host (%s)"
                      % (own, exc.strerror or exc)}))
    sys.exit(0)
deadline, error = time.monotonic() + timeout, "no answer"
while time.monotonic() < deadline:
    try:
        with socket.create_connection((addr, port), timeout=5) as c:
            c.sendall(name.encode() + b"\n")
            c.settimeout(5)
            reply = c.recv(16)
        if reply.startswith(b"ok"):
            print(json.dumps({"joined": True}))
            sys.exit(0)
        error = "unexpected answer %r" % reply
    except OSError as exc:
        error = str(exc) or type(exc).__name__
    time.sleep(1)
print(json.dumps({"joined": False, "error": "cannot reach the rendezvous at %s:%d within %ds: %s"
                  % (addr, port, timeout, error)}))
"""

# NCCL's INFO lines of the INIT and NET subsystems name the network it uses; each host says which RDMA devices it
# has (and whether IB was turned off) before torchrun starts. With --image, the RDMA devices go to the container.
NCCL_LOG = "export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
RDMA_MARK = "GPUPROV-RDMA "
RDMA_PROBE = (f"printf '{RDMA_MARK}%s|%s|%s\\n' \"$(ls /sys/class/infiniband 2>/dev/null | tr '\\n' ' ')\" "
              "\"$(ls /dev/infiniband 2>/dev/null | grep -c '^uverbs')\" \"${NCCL_IB_DISABLE:-}\"")
RDMA_FLAGS = ("RDMA=; if ls /dev/infiniband 2>/dev/null | grep -q '^uverbs'; then "
              "RDMA='--device=/dev/infiniband --cap-add=IPC_LOCK'; fi")

# The interface that carries the cluster address, for gloo's and NCCL's sockets (unless the operator set them).
IFACE = ("IFACE=$(ip -o addr show 2>/dev/null | awk -v a={addr} '{{split($4, p, \"/\"); if (p[1] == a) "
         "{{print $2; exit}}}}'); if [ -n \"$IFACE\" ]; then export GLOO_SOCKET_IFNAME=${{GLOO_SOCKET_IFNAME:-$IFACE}} "
         "NCCL_SOCKET_IFNAME=${{NCCL_SOCKET_IFNAME:-$IFACE}}; fi")


@dataclasses.dataclass(frozen=True)
class Node:
    """One host of the group: where it meets the others, and how many processes it starts."""

    name: str
    cluster_address: str
    nproc: int
    device: str          # "cuda" | "cpu"
    ready: bool          # its suite environment is in place (the validation run reached the suite)
    problem: str = ""    # why it cannot join, when not ready
    ulimits: dict | None = None   # its validate.image_ulimits (with --image)


def worker_user_script(user: str = WORKER_USER) -> str:
    """Root, on each node: the workers' system user (created once), in the video/render group where the GPU
    device files belong to one, and setpriv to switch to it."""
    q = shlex.quote
    groups = "|".join(DEVICE_GROUPS)
    return "\n".join([
        "set -e",
        "command -v setpriv >/dev/null || { echo 'setpriv (util-linux) is missing' >&2; exit 1; }",
        f"id -u {q(user)} >/dev/null 2>&1 || useradd --system --user-group --no-create-home "
        f"--home-dir /nonexistent --shell /usr/sbin/nologin {q(user)}",
        f"for g in $(stat -c %G /dev/nvidia* /dev/dri/* 2>/dev/null | sort -u); do case $g in {groups}) "
        f"id -nG {q(user)} | tr ' ' '\\n' | grep -qx \"$g\" || usermod -aG \"$g\" {q(user)};; esac; done",
    ])


FIREWALL_CHECK = "command -v nft >/dev/null && nft list tables >/dev/null"


def firewall_table(port: int) -> str:
    return f"gpuprov_rdzv_{port}"


def firewall_rules(port: int, allowed: list[str]) -> str:
    """The rendezvous host's nftables table for the run: connections to `port` only from `allowed` (the joined
    hosts' addresses as its listener saw them) and from the host itself; replaces a table left by an earlier run."""
    table = firewall_table(port)
    bare = sorted({address.split("%", 1)[0].removeprefix("::ffff:") for address in allowed})
    v4, v6 = [a for a in bare if ":" not in a], [a for a in bare if ":" in a]
    lines = [f"table inet {table}", f"delete table inet {table}", f"table inet {table} {{", "  chain input {",
             "    type filter hook input priority -5; policy accept;", '    iifname "lo" accept']
    if v4:
        lines.append(f"    ip saddr {{ {', '.join(v4)} }} tcp dport {port} accept")
    if v6:
        lines.append(f"    ip6 saddr {{ {', '.join(v6)} }} tcp dport {port} accept")
    return "\n".join([*lines, f"    tcp dport {port} drop", "  }", "}"]) + "\n"


def firewall_prefix(port: int, rules: str) -> str:
    """Shell: load `rules` (or exit NO_FIREWALL), and remove the table when the shell exits, also on a signal."""
    q = shlex.quote
    table = firewall_table(port)
    return (f"printf '%s' {q(rules)} | nft -f - || {{ echo 'gpuprov: cannot firewall the rendezvous port {port} "
            f"(nft failed)' >&2; exit {NO_FIREWALL}; }}; trap 'nft delete table inet {table} 2>/dev/null' EXIT; "
            "trap 'exit 143' HUP INT TERM")


def worker_source() -> str:
    return resources.files("gpuprov.validation").joinpath("allreduce_worker.py").read_text(encoding="utf-8")


def _py(code: str, *args) -> str:
    return "python3 -c " + " ".join(shlex.quote(str(a)) for a in (code, *args))


def torchrun_command(node: Node, nodes: list[Node], *, port: int, rdzv_id: str, level: str,
                     image: str | None = None, layout: Layout = LAYOUT, user: str = WORKER_USER,
                     firewall: str | None = None) -> str:
    """The torchrun command for one node: c10d rendezvous at the first node's cluster address, which hosts the
    store (is_host), each node advertising its own cluster address (--local-addr); the workers run as `user`.
    `firewall`: the rules the rendezvous host loads first (firewall_rules), removed when torchrun ends."""
    q = shlex.quote
    first = nodes[0]
    endpoint = f"[{first.cluster_address}]:{port}" if ":" in first.cluster_address else \
        f"{first.cluster_address}:{port}"
    run = ["-m", "torch.distributed.run", f"--nnodes={len(nodes)}", f"--nproc_per_node={node.nproc}",
           "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={rdzv_id}",
           f"--rdzv_conf=join_timeout={JOIN_SECONDS * 2},read_timeout={JOIN_SECONDS * 2},"
           f"is_host={1 if node is first else 0}",
           f"--local_addr={node.cluster_address}", "--max_restarts=0", "allreduce_worker.py",
           "--inventory-name", node.name, "--size-mib", str(SIZE_MIB[node.device]), "--iters", str(ITERS[level])]
    iface = IFACE.format(addr=q(node.cluster_address))
    run += ["--expect-device", node.device]
    start = "" if firewall is None else firewall_prefix(port, firewall) + "; "
    launch = "" if firewall is not None else "exec "
    if image is None:
        setpriv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--no-new-privs", "env",
                   "HOME=/nonexistent", layout.python, "-E", "-s", "-B"]
        return (f"cd {q(layout.multinode)} || exit 1; {iface}; {NCCL_LOG}; {RDMA_PROBE}; {start}{launch}"
                + " ".join(q(a) for a in [*setpriv, *run]))
    from gpuprov.validation.suite import DOCKER_FLAGS, ulimit_flags

    ids = (f"U=$(id -u {q(user)}) && G=$(id -g {q(user)}) && "
           f"GA=$(for g in $(id -G {q(user)}); do printf ' --group-add %s' \"$g\"; done) || exit 1")
    docker = ["docker", "run", "--rm", *DOCKER_FLAGS, "--network", "host", *ulimit_flags(node.ulimits),
              "-v", f"{layout.multinode}:{layout.multinode}:ro", "-w", layout.multinode,
              "-e", "GLOO_SOCKET_IFNAME", "-e", "NCCL_SOCKET_IFNAME", "-e", "NCCL_DEBUG", "-e", "NCCL_DEBUG_SUBSYS",
              "-e", "HOME=/tmp"]
    return (f"{ids}; {iface}; {NCCL_LOG}; {RDMA_PROBE}; {RDMA_FLAGS}; {start}{launch}"
            + " ".join(q(a) for a in docker) + ' --user "$U:$G" $GA $RDMA '
            + " ".join(q(a) for a in [image, "python3", "-B", *run]))


def parse_output(text: str) -> dict | None:
    """Rank 0's result line, checked (gpuprov.validation.document.ALLREDUCE: types, finite numbers, bounds), or
    None."""
    from gpuprov.validation.document import allreduce_document

    for line in reversed(text.splitlines()):
        if line.startswith(MARK):
            try:
                return allreduce_document(json.loads(line[len(MARK):]))
            except (ValueError, RecursionError):   # DocumentError is a ValueError: a malformed line is no result
                return None
    return None


def host_transport(output: str) -> dict:
    """One host's NCCL network (its ranks' info lines) and RDMA devices (its probe line), and whether IB was turned
    off there."""
    from gpuprov.smoke.perf_allreduce import nccl_network

    devices, reachable, disabled = [], False, False
    for line in output.splitlines():
        if line.startswith(RDMA_MARK):
            listed, _, rest = line[len(RDMA_MARK):].partition("|")
            verbs, _, ib_disable = rest.partition("|")
            devices, reachable = sorted(listed.split()), verbs.strip() not in ("", "0")
            disabled = ib_disable.strip() == "1"
    return {"nccl_network": nccl_network(output), "rdma_devices": devices, "rdma_reachable": reachable,
            "ib_disabled": disabled}


def _tail(text: str, lines: int = 3) -> str:
    useful = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(useful[-lines:])[:400]


def result(status: str, reason: str, figures: dict | None = None, nodes: int = 0) -> dict:
    return {"check": CHECK, "status": status, "reason": reason, "figures": figures or {},
            "thresholds": {"nodes": nodes}, "seconds": 0.0}


@dataclasses.dataclass
class _Run:
    """The fixed parts of one multi-node run, shared by its phases: the nodes and their inventory hosts (the
    first hosts the rendezvous), how to reach them, and where the workers run."""
    nodes: list[Node]
    hosts: list
    settings: object
    jump_of: object
    on_event: object
    run_on_hosts: object
    port: int
    layout: Layout
    user: str
    join_seconds: int
    by_name: dict[str, Node] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.by_name = {node.name: node for node in self.nodes}

    @property
    def first(self) -> Node:
        """The rendezvous node."""
        return self.nodes[0]

    def on(self, hosts: list, work) -> list:
        """`work` on `hosts`, all at once; their outcomes in the order of `hosts`."""
        return self.run_on_hosts(hosts, work, self.settings, jump_of=self.jump_of, on_event=self.on_event)


def run_multinode(nodes: list[Node], hosts: list, settings, *, jump_of, port: int, level: str,
                  image: str | None = None, layout: Layout = LAYOUT, on_event=lambda host, event: None,
                  run_on_hosts=None, join_seconds: int = JOIN_SECONDS, user: str = WORKER_USER) -> dict:
    """Join check, then torchrun on every node at once, its workers as `user`, the rendezvous port firewalled
    to the joined hosts. Returns {"results": {host: result}, "summary": {...}}. `hosts` are the inventory hosts
    of `nodes`, in the same order; the first one hosts the rendezvous."""
    if run_on_hosts is None:
        from gpuprov.core.executor import run_on_hosts
    settings = dataclasses.replace(settings, parallel=max(1, len(hosts)), max_fail=None)
    run = _Run(nodes, hosts, settings, jump_of, on_event, run_on_hosts, port, layout, user, join_seconds)
    endpoint = f"{run.first.cluster_address}:{port}"
    summary = {"rendezvous": endpoint, "hosts": [n.name for n in nodes], "not_joined": {}, "status": "fail"}
    not_joined = {n.name: n.problem or "its validation did not reach the suite" for n in nodes if not n.ready}
    seen = _join_check(run, not_joined)
    summary["not_joined"] = not_joined
    if not_joined:
        names = ", ".join(f"{name} ({why})" for name, why in not_joined.items())
        return _failed(nodes, summary, f"did not join the rendezvous at {endpoint}: {names}")
    rules = firewall_rules(port, list(seen.values()))
    summary["firewall"] = {"host": run.first.name, "table": f"inet {firewall_table(port)}",
                           "allowed": sorted(seen.values())}
    outcomes = _torchrun_everywhere(run, rules, level=level, image=image)
    return _torchrun_result(run, outcomes, summary)


def _failed(nodes: list[Node], summary: dict, reason: str) -> dict:
    """The run's answer when it failed for `reason`: every node fails with it."""
    summary["reason"] = reason
    return {"results": {n.name: result("fail", reason, nodes=len(nodes)) for n in nodes}, "summary": summary}


def _join_check(run: _Run, not_joined: dict[str, str]) -> dict[str, str]:
    """Phases 1 and 2 on the ready hosts, adding to `not_joined` (name: why) every host that cannot join.
    Returns {name: the address the rendezvous host saw it connect from}."""
    joining: list[Node] = []
    if run.first.ready:
        _own_phase(run, not_joined)
        joining = [n for n in run.nodes if n.ready and n.name not in not_joined]
    if run.first in joining and len(joining) > 1:
        # a host whose address is not its own cannot join: the rendezvous does not wait for it
        return _join_phase(run, joining, not_joined)
    return {}


def _own_phase(run: _Run, not_joined: dict[str, str]) -> None:
    """Phase 1 on every ready host: the worker file and its user in place, a working nft on the rendezvous
    host, and its cluster address really its own; a host where one is not is added to `not_joined`."""
    from gpuprov.validation.remote import Remote

    first = run.first

    def own(conn):
        node = run.by_name[conn.host.name]
        remote = Remote(conn, step="multi-node")
        remote.write_text(worker_source(), f"{run.layout.multinode}/allreduce_worker.py", step="multi-node")
        remote.run(worker_user_script(run.user), timeout=120, step="multi-node worker user")
        if node is first and remote.run(FIREWALL_CHECK, timeout=60, check=False).rc != 0:
            return {"error": f"cannot firewall the rendezvous port {run.port}: nft is missing or does not work "
                             "(install nftables; the rendezvous does not start unfirewalled)"}
        out = remote.run(_py(OWN_ADDRESS, node.cluster_address), sudo=False, timeout=60, step="multi-node join")
        return json.loads(out.stdout.strip().splitlines()[-1])

    for outcome in run.on([h for h in run.hosts if run.by_name[h.name].ready], own):
        if not outcome.ok:
            not_joined[outcome.host.name] = outcome.error.message
        elif outcome.value.get("error"):
            not_joined[outcome.host.name] = outcome.value["error"]


def _join_phase(run: _Run, joining: list[Node], not_joined: dict[str, str]) -> dict[str, str]:
    """Phase 2: the first host listens for the others, which connect and say their names; a host that did not
    join (or was not counted) is added to `not_joined`. Returns {name: address} as the listener saw them."""
    from gpuprov.validation.remote import Remote

    first = run.first

    def join(conn):
        node = run.by_name[conn.host.name]
        remote = Remote(conn, step="multi-node")
        if node is first:
            command = _py(LISTENER, first.cluster_address, run.port, run.join_seconds + min(15, run.join_seconds),
                          *[n.name for n in joining[1:]])
        else:
            command = _py(CONNECTOR, first.cluster_address, run.port, node.name, node.cluster_address,
                          run.join_seconds)
        out = remote.run(command, sudo=False, timeout=run.join_seconds + 60, step="multi-node join")
        return json.loads(out.stdout.strip().splitlines()[-1])

    outcomes = {o.host.name: o for o in run.on([h for h in run.hosts if run.by_name[h.name] in joining], join)}
    listener = outcomes[first.name]
    seen = dict(listener.value.get("joined") or {}) if listener.ok else {}
    if not listener.ok:
        not_joined[first.name] = f"the rendezvous host failed: {listener.error.message}"
    elif listener.value.get("error"):
        not_joined[first.name] = f"the rendezvous host {listener.value['error']}"
    for node in joining[1:]:
        outcome = outcomes[node.name]
        if not outcome.ok:
            not_joined[node.name] = outcome.error.message
        elif not outcome.value.get("joined"):
            not_joined[node.name] = outcome.value.get("error") or "did not join"
        elif listener.ok and not listener.value.get("error") and node.name not in listener.value["joined"]:
            not_joined[node.name] = f"connected, but the rendezvous host {first.name} did not count it"
    return seen


def _torchrun_everywhere(run: _Run, rules: str, *, level: str, image: str | None) -> list:
    """torchrun on every host at once, the rendezvous host's port firewalled by `rules`; the table is removed
    from here when the rendezvous host's run failed. Returns the outcomes, {"rc", "output"} each."""
    from gpuprov.validation.remote import Remote

    rdzv_id = f"gpuprov-{secrets.token_hex(4)}"

    def torchrun(conn):
        node = run.by_name[conn.host.name]
        command = torchrun_command(node, run.nodes, port=run.port, rdzv_id=rdzv_id, level=level, image=image,
                                   layout=run.layout, user=run.user, firewall=rules if node is run.first else None)
        out = Remote(conn, step="multi-node").run(command, timeout=RUN_TIMEOUT[level], check=False)
        return {"rc": out.rc, "output": out.stdout + "\n" + out.stderr}

    def unfirewall(conn):
        Remote(conn, step="multi-node").run(f"nft delete table inet {firewall_table(run.port)} 2>/dev/null || true",
                                            timeout=60)

    outcomes = run.on(run.hosts, torchrun)
    if not outcomes[0].ok:   # its shell may not have reached its exit trap: remove the table from here
        run.on(run.hosts[:1], unfirewall)
    return outcomes


def _torchrun_result(run: _Run, outcomes: list, summary: dict) -> dict:
    """The run's answer from the torchrun outcomes: a failure if any torchrun failed or none printed a valid
    all-reduce result, else the verdict on that result, its figures and each host's transport."""
    found = None
    failures = {}
    transports = {}
    for outcome in outcomes:
        if not outcome.ok:
            failures[outcome.host.name] = outcome.error.message
            continue
        found = found or parse_output(outcome.value["output"])
        transports[outcome.host.name] = host_transport(outcome.value["output"])
        if outcome.value["rc"] != 0:
            failures[outcome.host.name] = f"torchrun exit {outcome.value['rc']}: {_tail(outcome.value['output'])}"
    nodes = run.nodes
    if found is None or failures:
        why = "; ".join(f"{name}: {why}" for name, why in failures.items())
        return _failed(nodes, summary, f"torchrun failed: {why or 'no node printed a valid all-reduce result'}")
    summary["worker_uids"] = found.get("uids")
    if found["backend"] == "nccl":
        summary["transport"] = transports
    status, reason, figures = run_verdict(found, nodes, transports, run.user)
    summary.update(status=status, reason=reason, figures=figures)
    shown = ("nccl_network", "rdma_devices", "rdma_reachable") if found["backend"] == "nccl" else ()
    per_host = {n.name: {**figures, **{key: transports.get(n.name, {}).get(key) for key in shown}} for n in nodes}
    return {"results": {n.name: result(status, reason, per_host[n.name], len(nodes)) for n in nodes},
            "summary": summary}


def run_verdict(found: dict, nodes: list[Node], transports: dict, user: str) -> tuple[str, str, dict]:
    """(status, reason, figures) of the all-reduce every node's torchrun printed as `found`: the workers not root,
    every process there, every element right, no socket fallback where RDMA devices are."""
    world = sum(n.nproc for n in nodes)
    figures = {"nodes": len(found.get("nodes", [])), "world_size": found["world_size"], "backend": found["backend"],
               "busbw_gbs": found["busbw_gbs"], "algbw_gbs": found["algbw_gbs"], "size_bytes": found["size_bytes"],
               "wrong_elements": found["wrong_elements"]}
    missing = sorted({n.name for n in nodes} - set(found.get("nodes", [])))
    fallbacks = _socket_fallbacks(transports) if found["backend"] == "nccl" else {}
    if user != "root" and 0 in (found.get("uids") or [0]):
        status, reason = "fail", f"the workers ran as root, not as {user}"
    elif missing or found["world_size"] != world:
        status, reason = "fail", (f"{found['world_size']} of {world} processes took part; missing: "
                                  f"{', '.join(missing) or 'processes of joined hosts'}")
    elif found["wrong_elements"]:
        status, reason = "fail", (f"all-reduce over {len(nodes)} nodes gave {found['wrong_elements']} wrong elements "
                                  f"(expected every element {found['expected_sum']:g})")
    elif fallbacks:
        status, reason = "fail", ("NCCL fell back to sockets (NET/Socket) on hosts with RDMA devices: "
                                  + "; ".join(f"{name} ({why})" for name, why in fallbacks.items())
                                  + " (with --image: a container needs /dev/infiniband, IPC_LOCK and rdma-core's "
                                    "libibverbs; on the host check NCCL_IB_HCA and ibv_devinfo)")
    else:
        network = ",".join(sorted({t["nccl_network"] or "unknown" for t in transports.values()})) \
            if found["backend"] == "nccl" else None
        status, reason = "pass", (f"all-reduce over {len(nodes)} nodes ({world} processes, {found['backend']}"
                                  f"{f', NCCL network {network}' if network else ''}) correct; bus bandwidth "
                                  f"{found['busbw_gbs']:.2f} GB/s")
    return status, reason, figures


def _socket_fallbacks(transports: dict) -> dict[str, str]:
    """Hosts with RDMA devices whose NCCL used sockets (IB not turned off there): host -> what it had and used."""
    from gpuprov.smoke.perf_allreduce import transport_problem

    out = {}
    for name, seen in transports.items():
        if transport_problem(seen["nccl_network"], seen["rdma_devices"] if seen["rdma_reachable"] else [],
                             seen["ib_disabled"]):
            out[name] = f"RDMA devices {', '.join(seen['rdma_devices'])}, NCCL network {seen['nccl_network']}"
    return out


def nodes_for(runs: list, hosts: list, settings_of) -> list[Node]:
    """A Node for each host from its validation run (a ValidationRecord, or None when the host failed before the
    suite); `settings_of(host)` gives its ValidateVars (cluster address)."""
    out = []
    for host, run in zip(hosts, runs, strict=True):
        try:
            settings = settings_of(host)
            cluster = settings.cluster_address
        except GpuprovError as exc:
            out.append(Node(host.name, host.address, 1, "cpu", False, exc.message))
            continue
        if run is None or run.error is not None or not run.results:
            why = (run.error or {}).get("error") if run is not None and run.error else "its validation failed"
            out.append(Node(host.name, cluster, 1, "cpu", False, why))
            continue
        cuda = bool(run.versions.get("cuda")) and bool(run.config.get("gpus_visible"))
        count = (run.config.get("expect") or {}).get("count") or 1
        out.append(Node(host.name, cluster, int(count) if cuda else 1, "cuda" if cuda else "cpu", True,
                        ulimits=getattr(settings, "image_ulimits", None)))
    return out
