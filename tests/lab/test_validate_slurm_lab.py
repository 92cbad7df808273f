"""`invoke validate --via slurm` on the lab's real Slurm cluster (Debian's slurm-wlm 22.05): a node busy with a job
is validated once the job ends (the validation job waits PENDING in the queue meanwhile) and its report entry has the
same checks and statuses as an SSH run's; a job that cannot start within --start-deadline is cancelled and named,
with Slurm's pending reason.

The module brings up its own Slurm fleet (two GPU hosts and a controller, not provisioned: the check run here,
host.shm, needs no NVIDIA software) and builds the suite's venvs once over SSH. Slurm's reason for a job whose
requested node is drained is ReqNodeNotAvail (squeue(1), JOB REASON CODES).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
from labutil import ROOT, invoke, on_host, slurm_fleet, wait_for

from gpuprov.lab import slurm

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts

GPU_PROFILES = ["hgx-h100", "l40s"]
CONTROLLER = "gpuprov-lab-03"
NODES = ["gpuprov-lab-01", "gpuprov-lab-02"]
CHECKS = "host.shm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The Slurm fleet, the suite's venvs built on both nodes over SSH; (state, env)."""
    with slurm_fleet(GPU_PROFILES) as state:
        folder = tmp_path_factory.mktemp("validate-slurm")
        env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
        run = validate(state, env, "--group", "gpu", "--only", CHECKS)
        assert all(h["error"] is None and h["env"]["installed"] for h in run["hosts"]), run["hosts"]
        yield state, env


def command(state, env: dict, *args: str) -> tuple[list[str], dict]:
    """`invoke validate --inventory LAB ARGS --no-textfile --json` with its reports in a folder of its own."""
    reports = tempfile.mkdtemp(prefix="validate-", dir=env["INVOKE_GPUPROV_REPORTS"].rsplit("/", 1)[0])
    return (["validate", "--inventory", str(state.inventory), *args, "--no-textfile", "--json"],
            {**env, "INVOKE_GPUPROV_REPORTS": reports})


def validate(state, env: dict, *args: str, check_code: int | None = 0) -> dict:
    argv, run_env = command(state, env, *args)
    return json.loads(invoke(*argv, check_code=check_code, env=run_env).stdout)


def validation_jobs(state) -> list[str]:
    """`id|state|reason` of every gpuprov-validate job in the queue."""
    return on_host(state, CONTROLLER, "squeue -h -a -n gpuprov-validate -o '%i|%T|%r'").split()



def checks_of(entry: dict) -> dict[str, str]:
    return {r["check"]: r["status"] for r in entry["results"]}


def test_a_busy_node_is_validated_once_its_job_ends_and_reports_like_ssh(cluster):
    state, env = cluster
    node = NODES[0]
    over_ssh = validate(state, env, "--host", node, "--only", CHECKS)["hosts"][0]
    job = slurm.submit_job(state, node, 600, release=True)
    wait_for(lambda: slurm.job_state(state, job) == "RUNNING", 60, f"job {job} runs")
    argv, run_env = command(state, env, "--via", "slurm", "--host", node, "--only", CHECKS, "--start-deadline", "10m")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env={**os.environ, **run_env})
    try:
        pending = wait_for(lambda: [j for j in validation_jobs(state) if j.split("|")[1] == "PENDING"], 300,
                           "the validation job waits in the queue")
        assert len(pending) == 1, pending
        assert proc.poll() is None   # validate is still waiting for its job
        assert slurm.job_state(state, job) == "RUNNING"   # the running job was not touched
        time.sleep(5)   # the validation job stays pending while the node's job runs
        assert [j.split("|")[1] for j in validation_jobs(state)] == ["PENDING"]
        slurm.release_job(state, node, job)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"{out}\n{err}"
    assert slurm.job_state(state, job) == "COMPLETED"
    entry = json.loads(out)["hosts"][0]
    assert entry["error"] is None and entry["status"] == over_ssh["status"]
    assert checks_of(entry) == checks_of(over_ssh) == {"host.shm": "pass"}
    job_id = pending[0].split("|")[0]
    assert entry["slurm"]["job_id"] == job_id and entry["slurm"]["node"] == node
    assert entry["slurm"]["state"] == "COMPLETED" and entry["slurm"]["pending_s"] > 5
    print(f"the validation job {job_id} waited {entry['slurm']['pending_s']} s in the queue; validate took "
          f"{entry['seconds']} s")
    assert validation_jobs(state) == []


def test_a_job_that_cannot_start_is_cancelled_and_named_with_slurms_reason(cluster):
    state, env = cluster
    node = NODES[1]
    on_host(state, CONTROLLER, f"scontrol update nodename={node} state=drain reason='gpuprov lab test: validate'")
    try:
        run = validate(state, env, "--via", "slurm", "--host", node, "--only", CHECKS, "--start-deadline", "15s",
                       check_code=1)
    finally:
        on_host(state, CONTROLLER, f"scontrol update nodename={node} state=resume")
    entry = run["hosts"][0]
    assert entry["status"] == "error" and entry["error"]["step"] == "suite.slurm"
    job_id = entry["slurm"]["job_id"]
    message = entry["error"]["error"]
    print(f"the error: {message}")
    assert f"validation job {job_id} did not start within 15 s" in message
    assert "pending reason is ReqNodeNotAvail" in message and message.endswith("the job was cancelled")
    assert validation_jobs(state) == []
    assert slurm.job_state(state, int(job_id)) == "CANCELLED"


def test_bad_slurm_flags_are_refused_before_any_host(cluster):
    state, env = cluster
    for args, flag in ((("--via", "slurm", "--partition", "gpu,debug"), "--partition"),
                       (("--via", "slurm", "--nice", "-5"), "--nice"),
                       (("--via", "slurm", "--start-deadline", "soon"), "--start-deadline"),
                       (("--qos", "low"), "--qos"), (("--via", "pbs"), "--via")):
        argv, run_env = command(state, env, "--host", NODES[0], *args)
        proc = invoke(*argv, check_code=2, env=run_env)
        assert flag in proc.stderr


def test_a_two_node_all_reduce_through_srun(cluster):
    state, env = cluster
    run = validate(state, env, "--via", "slurm", "--group", "gpu", "--multi-node", "--only", CHECKS)
    summary = run["multi_node"]
    print(f"the all-reduce through srun: {summary}")
    assert summary["status"] == "pass", summary
    assert summary["via"] == "slurm" and summary["slurm"]["state"] == "COMPLETED"
    assert summary["slurm"]["nodes"] == NODES
    # the store at the allocation's first node (Slurm's order), as the lab inventory gives its cluster address
    assert summary["rendezvous"] == f"{NODES[0]} at {state.host(NODES[0]).internal_ip}:29400"   # rdzv_port default
    assert 0 not in summary["worker_uids"]   # the workers ran as gpuprov-validate, not root
    for entry in run["hosts"]:
        allreduce = next(r for r in entry["results"] if r["check"] == "multinode.allreduce")
        assert allreduce["status"] == "pass" and allreduce["figures"]["world_size"] == 2
        assert allreduce["figures"]["backend"] == "gloo" and allreduce["figures"]["wrong_elements"] == 0
    assert validation_jobs(state) == []
    # the batch script removed its firewall table when it exited
    assert "gpuprov_rdzv" not in on_host(state, NODES[0], "nft list tables 2>/dev/null || true")


def test_ctrl_c_cancels_the_pending_validation_job_and_leaves_the_running_one(cluster):
    import signal

    state, env = cluster
    node = NODES[1]
    job = slurm.submit_job(state, node, 600, release=True)
    wait_for(lambda: slurm.job_state(state, job) == "RUNNING", 60, f"job {job} runs")
    argv, run_env = command(state, env, "--via", "slurm", "--host", node, "--only", CHECKS)
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env={**os.environ, **run_env})
    try:
        wait_for(lambda: [j for j in validation_jobs(state) if j.split("|")[1] == "PENDING"], 300,
                 "the validation job waits in the queue")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert validation_jobs(state) == []
        assert slurm.job_state(state, job) == "RUNNING"   # the node's own job was not touched
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm.release_job(state, node, job)
    assert proc.returncode == 130, f"{out}\n{err}"
    entry = json.loads(out)["hosts"][0]
    assert entry["error"]["error"].startswith(f"interrupted (Ctrl-C): validation job {entry['slurm']['job_id']} "
                                              "cancelled")
    wait_for(lambda: slurm.job_state(state, job) == "COMPLETED", 60, f"job {job} ends by itself")
