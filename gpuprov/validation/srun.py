"""`invoke validate --multi-node --via slurm`: the all-reduce across the selected hosts' nodes in one Slurm allocation
(`sbatch --exclusive -N N -w NODES`), launched with `srun` (one task per node on CPU hosts, one per GPU on GPU hosts),
its rendezvous from Slurm's own environment: RANK, WORLD_SIZE and LOCAL_RANK from SLURM_PROCID, SLURM_NTASKS and
SLURM_LOCALID, the store at the first node of SLURM_JOB_NODELIST (`scontrol show hostnames`; rank 0 runs there).

What gpuprov.validation.multinode guarantees still holds: the workers run as the unprivileged gpuprov-validate
(created over SSH first, with the worker file), and the store's port on the first node accepts connections only from
the allocation's nodes (their cluster addresses) with an nftables table the batch script adds before srun and
removes when it exits; a first node where nft fails stops the job before srun (fail closed). On GPU hosts the
allocation asks for each node's GPUs (`--gres=gpu:N`) and the srun step for as many on each node as it starts tasks
there (`--gres=gpu:N`, not --gpus-per-task, which binds each task to one GPU it then sees as device 0 while the worker
takes device LOCAL_RANK): a cluster that confines devices (ConstrainDevices=yes) shows a job only the GPUs it was
allocated, and a step gets by default only the GRES its job asked for, not those --exclusive gives it (srun(1),
--gres). Each task's output goes to a root-owned file on its own node, read back over SSH; rank 0's result line is
judged as multinode judges it.
"""

from __future__ import annotations

import dataclasses
import shlex

from gpuprov.core.errors import GpuprovError
from gpuprov.validation import LAYOUT, Layout
from gpuprov.validation.multinode import (
    IFACE,
    ITERS,
    NCCL_LOG,
    RDMA_PROBE,
    RUN_TIMEOUT,
    SIZE_MIB,
    WORKER_USER,
    Node,
    firewall_prefix,
    firewall_rules,
    firewall_table,
    host_transport,
    parse_output,
    result,
    worker_source,
    worker_user_script,
)
from gpuprov.validation.slurm_jobs import END_MARGIN_S, SlurmJob, SlurmOptions, sbatch_multi_argv

FIRST_MARK = "GPUPROV-SRUN-FIRST "


@dataclasses.dataclass(frozen=True)
class Member:
    """One node of the allocation: its Slurm node name and the Node (inventory name, address, tasks, device)."""

    slurm_node: str
    node: Node


def batch_output(layout: Layout = LAYOUT) -> str:
    return f"{layout.run}/slurm-allreduce.batch.out"


def _case(members: list[Member], field, variable: str = "SLURMD_NODENAME") -> str:
    """A shell `case` on the node name in $variable that sets v to field(member); an unknown node exits 1."""
    arms = " ".join(f"{shlex.quote(m.slurm_node)}) v={shlex.quote(str(field(m)))};;" for m in members)
    return (f'case "${variable}" in {arms} *) echo "gpuprov: node ${variable} is not one of ours" >&2; exit 1;; '
            "esac")


def task_script(members: list[Member], *, port: int, level: str, layout: Layout = LAYOUT,
                user: str = WORKER_USER) -> str:
    """What each srun task runs (as root, by slurmstepd): its output into its node's file, torch.distributed's env://
    variables from Slurm's, the worker as `user`."""
    q = shlex.quote
    device = members[0].node.device
    setpriv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--no-new-privs", "env",
               "HOME=/nonexistent", layout.python, "-E", "-s", "-B", "allreduce_worker.py"]
    worker = ["--size-mib", str(SIZE_MIB[device]), "--iters", str(ITERS[level]), "--expect-device", device]
    return "; ".join([
        f'exec > {q(layout.run)}/slurm-allreduce.task-"$SLURM_LOCALID".out 2>&1',
        f"cd {q(layout.multinode)} || exit 1",
        _case(members, lambda m: m.node.name), "name=$v", _case(members, lambda m: m.node.cluster_address),
        "addr=$v",
        IFACE.format(addr='"$addr"'), NCCL_LOG, RDMA_PROBE,
        f'export MASTER_ADDR="$GPUPROV_FIRST_ADDR" MASTER_PORT={port} RANK="$SLURM_PROCID" '
        'WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID"',
        "exec " + " ".join(q(a) for a in setpriv) + ' --inventory-name "$name" ' + " ".join(q(a) for a in worker),
    ])


def batch_script(members: list[Member], *, port: int, level: str, layout: Layout = LAYOUT,
                 user: str = WORKER_USER) -> str:
    """The batch script, on the allocation's first node: the store's port firewalled to the allocation's nodes
    (multinode.firewall_prefix: exit NO_FIREWALL when nft fails, the table removed on exit), then srun."""
    q = shlex.quote
    rules = firewall_rules(port, [m.node.cluster_address for m in members])
    tasks = members[0].node.nproc
    gpus = gpus_per_node(members)
    gres = f"--gres=gpu:{gpus} " if gpus else ""
    return "\n".join([
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        '[ "$first" = "$SLURMD_NODENAME" ] || { echo "gpuprov: the batch script runs on $SLURMD_NODENAME, not on '
        'the first node $first" >&2; exit 1; }',
        _case(members, lambda m: m.node.cluster_address, "first"), 'export GPUPROV_FIRST_ADDR="$v"',
        f'echo "{FIRST_MARK}$first $GPUPROV_FIRST_ADDR"',
        firewall_prefix(port, rules),
        f"srun --kill-on-bad-exit=1 --ntasks-per-node={tasks} -N {len(members)} {gres}--export=ALL sh -c "
        + q(task_script(members, port=port, level=level, layout=layout, user=user)),
    ])


def gpus_per_node(members: list[Member]) -> int:
    """The GPUs the allocation asks for on each node: one per task on GPU hosts (same_tasks: the same on each), none
    on CPU hosts."""
    node = members[0].node
    return node.nproc if node.device == "cuda" else 0


def same_tasks(members: list[Member]) -> str | None:
    """Why srun cannot start the same number of tasks on every node (hosts with different GPU counts or devices),
    or None."""
    kinds = {(m.node.nproc, m.node.device) for m in members}
    if len(kinds) == 1:
        return None
    return ("srun starts one task per GPU, the same number on every node: these hosts differ ("
            + ", ".join(f"{m.node.name}: {m.node.nproc} {m.node.device}" for m in members) + ")")


def run_srun(members: list[Member], hosts: list, run_on, controller, options: SlurmOptions, *, port: int,
             level: str, stop, layout: Layout = LAYOUT, user: str = WORKER_USER) -> dict:
    """Prepare each host over SSH (worker file, worker user, old outputs removed), submit the allocation, wait for
    it, read every node's task output back. `run_on(hosts, work)` runs work(conn) on hosts (fleet.run);
    `controller`: (runner, name). Returns {"results": {host: result}, "summary": {...}} as multinode does."""
    from gpuprov.validation.multinode import run_verdict
    from gpuprov.validation.remote import Remote

    nodes = [m.node for m in members]
    summary: dict = {"rendezvous": f"first node of the Slurm allocation, port {port}", "hosts": [n.name for n in nodes],
                     "status": "fail", "via": "slurm"}

    def failed(reason: str) -> dict:
        summary["reason"] = reason
        return {"results": {n.name: result("fail", reason, nodes=len(nodes)) for n in nodes}, "summary": summary}

    not_ready = {n.name: n.problem or "its validation did not reach the suite" for n in nodes if not n.ready}
    if not_ready:
        return failed("not every host can take part: " + ", ".join(f"{k} ({v})" for k, v in not_ready.items()))
    why = same_tasks(members)
    if why:
        return failed(why)
    q = shlex.quote

    def prepare(conn):
        remote = Remote(conn, step="multi-node")
        remote.write_text(worker_source(), f"{layout.multinode}/allreduce_worker.py", step="multi-node")
        remote.run(worker_user_script(user), timeout=120, step="multi-node worker user")
        remote.run(f"rm -f {q(layout.run)}/slurm-allreduce.*.out", timeout=60, step="multi-node")

    problems = {o.host.name: o.error.message for o in run_on(hosts, prepare) if not o.ok}
    if problems:
        return failed("not prepared: " + "; ".join(f"{k}: {v}" for k, v in problems.items()))
    runner, where = controller
    job = SlurmJob(runner, where, nodes[0].name, stop=stop)
    seconds = RUN_TIMEOUT[level]
    try:
        job_id = job.submit(sbatch_multi_argv([m.slurm_node for m in members],
                                              batch_script(members, port=port, level=level, layout=layout, user=user),
                                              output=batch_output(layout), seconds=seconds, options=options,
                                              gpus=gpus_per_node(members)))
        summary["slurm"] = {"job_id": job_id, "nodes": [m.slurm_node for m in members], "controller": where}
        outcome = job.wait(options.start_deadline_s, seconds + END_MARGIN_S, options.poll_s)
    except GpuprovError as exc:
        return failed(exc.message)
    summary["slurm"].update(state=outcome.state, pending_s=outcome.pending_s)
    summary["firewall"] = {"table": f"inet {firewall_table(port)}",
                           "allowed": sorted(n.cluster_address for n in nodes)}

    def read(conn):
        return Remote(conn, step="multi-node").run(f"cat {q(layout.run)}/slurm-allreduce.*.out 2>/dev/null; true",
                                                   timeout=120).stdout

    outputs = {}
    for outcome_ in run_on(hosts, read):
        if not outcome_.ok:
            return failed(f"cannot read {outcome_.host.name}'s output: {outcome_.error.message}")
        outputs[outcome_.host.name] = outcome_.value
    for text in outputs.values():
        for line in text.splitlines():
            if line.startswith(FIRST_MARK):
                summary["rendezvous"] = line[len(FIRST_MARK):].replace(" ", " at ") + f":{port}"
    found = next((doc for doc in (parse_output(t) for t in outputs.values()) if doc), None)
    if found is None or outcome.state != "COMPLETED":
        tail = " | ".join(line for t in outputs.values() for line in t.splitlines()[-2:] if line.strip())[:400]
        return failed(f"the all-reduce job {job_id} ended {outcome.state}"
                      + ("" if found is None else " after printing its result") + f": {tail or 'no output'}")
    transports = {name: host_transport(text) for name, text in outputs.items()}
    summary["worker_uids"] = found.get("uids")
    status, reason, figures = run_verdict(found, nodes, transports, user)
    summary.update(status=status, reason=reason, figures=figures)
    return {"results": {n.name: result(status, reason, figures, len(nodes)) for n in nodes},
            "summary": summary}
