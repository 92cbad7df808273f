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
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
from importlib import resources

from gpuprov.errors import GpuprovError
from gpuprov.validation import LAYOUT, Layout

CHECK = "multinode.allreduce"
MARK = "GPUPROV-MULTINODE "
JOIN_SECONDS = 30
RUN_TIMEOUT = {"quick": 600, "burn-in": 1800}
SIZE_MIB = {"cuda": 256, "cpu": 16}
ITERS = {"quick": 10, "burn-in": 100}

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


def worker_source() -> str:
    return resources.files("gpuprov.validation").joinpath("allreduce_worker.py").read_text(encoding="utf-8")


def _py(code: str, *args) -> str:
    return "python3 -c " + " ".join(shlex.quote(str(a)) for a in (code, *args))


def torchrun_command(node: Node, nodes: list[Node], *, port: int, rdzv_id: str, level: str,
                     image: str | None = None, layout: Layout = LAYOUT) -> str:
    """The torchrun command for one node: c10d rendezvous at the first node's cluster address, which hosts the
    store (is_host), each node advertising its own cluster address (--local-addr)."""
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
    if image is None:
        return f"cd {q(layout.multinode)} || exit 1; {iface}; exec {q(layout.python)} " + " ".join(q(a) for a in run)
    from gpuprov.validation.suite import DOCKER_FLAGS, ulimit_flags

    docker = ["docker", "run", "--rm", *DOCKER_FLAGS, "--network", "host", *ulimit_flags(node.ulimits),
              "-v", f"{layout.multinode}:{layout.multinode}:ro", "-w", layout.multinode,
              "-e", "GLOO_SOCKET_IFNAME", "-e", "NCCL_SOCKET_IFNAME", image, "python3", *run]
    return f"{iface}; exec " + " ".join(q(a) for a in docker)


def parse_output(text: str) -> dict | None:
    """Rank 0's result line, or None."""
    for line in reversed(text.splitlines()):
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):])
            except ValueError:
                return None
    return None


def _tail(text: str, lines: int = 3) -> str:
    useful = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(useful[-lines:])[:400]


def result(status: str, reason: str, figures: dict | None = None, nodes: int = 0) -> dict:
    return {"check": CHECK, "status": status, "reason": reason, "figures": figures or {},
            "thresholds": {"nodes": nodes}, "seconds": 0.0}


def run_multinode(nodes: list[Node], hosts: list, settings, *, jump_of, port: int, level: str,
                  image: str | None = None, layout: Layout = LAYOUT, on_event=lambda host, event: None,
                  run_on_hosts=None, join_seconds: int = JOIN_SECONDS) -> dict:
    """Join check, then torchrun on every node at once. Returns {"results": {host: result}, "summary": {...}}.
    `hosts` are the inventory hosts of `nodes`, in the same order; the first one hosts the rendezvous."""
    from gpuprov.validation.remote import Remote

    if run_on_hosts is None:
        from gpuprov.executor import run_on_hosts
    settings = dataclasses.replace(settings, parallel=max(1, len(hosts)), max_fail=None)
    first = nodes[0]
    by_name = {node.name: node for node in nodes}
    endpoint = f"{first.cluster_address}:{port}"
    summary = {"rendezvous": endpoint, "hosts": [n.name for n in nodes], "not_joined": {}, "status": "fail"}

    def own(conn):
        """Phase 1 on every ready host: the worker file in place, and its cluster address really its own."""
        node = by_name[conn.host.name]
        remote = Remote(conn, step="multi-node")
        remote.write_text(worker_source(), f"{layout.multinode}/allreduce_worker.py", step="multi-node")
        out = remote.run(_py(OWN_ADDRESS, node.cluster_address), sudo=False, timeout=60, step="multi-node join")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def join(conn):
        """Phase 2: the first host listens for the others, which connect and say their names."""
        node = by_name[conn.host.name]
        remote = Remote(conn, step="multi-node")
        if node is first:
            command = _py(LISTENER, first.cluster_address, port, join_seconds + min(15, join_seconds),
                          *[n.name for n in joining[1:]])
        else:
            command = _py(CONNECTOR, first.cluster_address, port, node.name, node.cluster_address, join_seconds)
        out = remote.run(command, sudo=False, timeout=join_seconds + 60, step="multi-node join")
        return json.loads(out.stdout.strip().splitlines()[-1])

    ready = [n for n in nodes if n.ready]
    not_joined = {n.name: n.problem or "its validation did not reach the suite" for n in nodes if not n.ready}
    joining: list[Node] = []
    if first.ready:
        for outcome in run_on_hosts([h for h in hosts if by_name[h.name].ready], own, settings, jump_of=jump_of,
                                    on_event=on_event):
            if not outcome.ok:
                not_joined[outcome.host.name] = outcome.error.message
            elif outcome.value.get("error"):
                not_joined[outcome.host.name] = outcome.value["error"]
        joining = [n for n in ready if n.name not in not_joined]
    if first in joining and len(joining) > 1:
        # a host whose address is not its own cannot join: the rendezvous does not wait for it
        outcomes = {o.host.name: o for o in run_on_hosts([h for h in hosts if by_name[h.name] in joining], join,
                                                         settings, jump_of=jump_of, on_event=on_event)}
        listener = outcomes[first.name]
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
    summary["not_joined"] = not_joined
    if not_joined:
        names = ", ".join(f"{name} ({why})" for name, why in not_joined.items())
        reason = f"did not join the rendezvous at {endpoint}: {names}"
        summary["reason"] = reason
        return {"results": {n.name: result("fail", reason, nodes=len(nodes)) for n in nodes}, "summary": summary}

    rdzv_id = f"gpuprov-{secrets.token_hex(4)}"

    def torchrun(conn):
        node = by_name[conn.host.name]
        command = torchrun_command(node, nodes, port=port, rdzv_id=rdzv_id, level=level, image=image,
                                   layout=layout)
        out = Remote(conn, step="multi-node").run(command, timeout=RUN_TIMEOUT[level], check=False)
        return {"rc": out.rc, "output": out.stdout + "\n" + out.stderr}

    outcomes = run_on_hosts(hosts, torchrun, settings, jump_of=jump_of, on_event=on_event)
    found = None
    failures = {}
    for outcome in outcomes:
        if not outcome.ok:
            failures[outcome.host.name] = outcome.error.message
            continue
        found = found or parse_output(outcome.value["output"])
        if outcome.value["rc"] != 0:
            failures[outcome.host.name] = f"torchrun exit {outcome.value['rc']}: {_tail(outcome.value['output'])}"
    world = sum(n.nproc for n in nodes)
    if found is None or failures:
        reason = "torchrun failed: " + ("; ".join(f"{name}: {why}" for name, why in failures.items())
                                        or "no node printed the all-reduce result")
        summary["reason"] = reason
        return {"results": {n.name: result("fail", reason, nodes=len(nodes)) for n in nodes}, "summary": summary}
    figures = {"nodes": len(found.get("nodes", [])), "world_size": found["world_size"], "backend": found["backend"],
               "busbw_gbs": found["busbw_gbs"], "algbw_gbs": found["algbw_gbs"], "size_bytes": found["size_bytes"],
               "wrong_elements": found["wrong_elements"]}
    missing = sorted(set(by_name) - set(found.get("nodes", [])))
    if missing or found["world_size"] != world:
        status, reason = "fail", (f"{found['world_size']} of {world} processes took part; missing: "
                                  f"{', '.join(missing) or 'processes of joined hosts'}")
    elif found["wrong_elements"]:
        status, reason = "fail", (f"all-reduce over {len(nodes)} nodes gave {found['wrong_elements']} wrong elements "
                                  f"(expected every element {found['expected_sum']:g})")
    else:
        status, reason = "pass", (f"all-reduce over {len(nodes)} nodes ({world} processes, {found['backend']}) "
                                  f"correct; bus bandwidth {found['busbw_gbs']:.2f} GB/s")
    summary.update(status=status, reason=reason, figures=figures)
    return {"results": {n.name: result(status, reason, figures, len(nodes)) for n in nodes}, "summary": summary}


def nodes_for(runs: list, hosts: list, settings_of) -> list[Node]:
    """A Node for each host from its validation run (a HostValidation, or None when the host failed before the
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
