"""`invoke rollout` on a real Slurm cluster (Debian's slurm-wlm 22.05 in the lab): the operator's six scenarios of
issue 20, on one fleet of four L40S hosts and a controller, run once each and in order (each leaves the fleet idle,
undrained and on one stack for the next):

1. a busy fleet moves to a new driver branch without killing a job (idle hosts first, busy ones wait);
2. (with 3) an interrupted rollback resumes from its journal, and no host is upgraded twice;
3. (with 2) rolling back to the previous lock puts every host on the old stack, validated;
4. (with 6) an admin's drain is never lifted and counts against --max-unavailable;
5. (with 4) a job longer than --wait-jobs skips its host, named, and `rollout --status` says what it waits for;
6. a host that fails validation after its upgrade stays drained with the reason in Slurm, and the rollout stops.

What is judged comes from Slurm (sinfo, scontrol show job), dpkg on the hosts and the lock files: never from
gpuprov's own view of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT
from labutil import copy_inventory, invoke, on_host, slurm_fleet, wait_for

from gpuprov.lab import slurm
from gpuprov.lab.faults import injected

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts

NODES = [f"gpuprov-lab-0{i}" for i in range(1, 5)]
CHECKS = "host.gpus,host.pcie"
# the installed versions of the package every NVIDIA driver branch has (nvidia-kernel-common or -common-580)
DRIVER = "dpkg-query -W -f '${db:Status-Abbrev}${Version}\\n' 'nvidia-kernel-common*' | sed -n 's/^[hi]i *//p'"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Four L40S hosts on the older of the lab's driver branches, under the group lock `gpu`; a Slurm controller."""
    from gpuprov.lab.profiles import load_profiles
    from gpuprov.lab.standins import lab_stacks

    with slurm_fleet(["l40s"] * len(NODES)) as state:
        folder = tmp_path_factory.mktemp("rollout")
        env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
        branches = [s["driver"]["branch"] for s in lab_stacks([load_profiles()["l40s"]])]
        old = branches[1]

        def pin(document):
            for name in NODES:
                document["hosts"][name].setdefault("vars", {})["stack"] = {"driver": old}

        pinned = copy_inventory(state, folder, edit=pin)
        invoke("stack.lock", "--group", "gpu", "--inventory", str(pinned), env=env)
        invoke("provision", "--group", "gpu", env=env)
        yield state, env, folder, branches


def rollout(env: dict, *args: str, check_code: int | None = 0) -> dict:
    """`invoke rollout ... --json`: the report."""
    proc = invoke("rollout", *args, "--json", check_code=check_code, env=env)
    return json.loads(proc.stdout)


def by_host(report: dict) -> dict:
    return {entry["host"]: entry for entry in report["hosts"]}


def branch_of(state, node: str) -> str:
    """The driver branch installed on the host, as dpkg has it (`580.95.05-1` -> 580; two: both, comma-joined)."""
    return ",".join(sorted({line.split(".", 1)[0] for line in on_host(state, node, DRIVER).split()}))


def lock_branch(folder: Path) -> str:
    return yaml.safe_load((folder / "locks" / "gpu.lock.yaml").read_text())["stack"]["driver"]["branch"]


def journal_of(folder: Path, report: dict) -> dict:
    return json.loads((folder / "reports" / f"rollout-journal-{report['run_id']}.json").read_text())


def states(journal: dict, node: str) -> list[str]:
    return [item["state"] for item in journal["hosts"][node]["history"]]


def first(journal: dict, node: str, state: str) -> str:
    return next(item["at"] for item in journal["hosts"][node]["history"] if item["state"] == state)



def test_a_busy_fleet_moves_to_a_new_branch_without_killing_a_job(fleet):
    """Each busy host's job ends (by itself, exit 0) only once the rollout is seen waiting for it: no wall time
    decides what the test sees."""
    state, env, folder, branches = fleet
    new, old = branches[0], branches[1]
    assert {branch_of(state, n) for n in NODES} == {old}
    sooner = slurm.submit_job(state, NODES[2], 600, release=True)   # busy hosts: the sooner free goes first
    later = slurm.submit_job(state, NODES[3], 1200, release=True)
    wait_for(lambda: slurm.job_state(state, later) == "RUNNING", 30, "the jobs run")
    args = ["--group", "gpu", "--update-lock", "--batch", "1", "--max-unavailable", "50%", "--checks", CHECKS]
    errors = folder / "busy-rollout.stderr"
    with errors.open("w") as stderr:
        run = subprocess.Popen([sys.executable, "-m", "invoke", "rollout", *args, "--json"], cwd=REPO_ROOT,
                               env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=stderr, text=True)
        try:
            for node, job in ((NODES[2], sooner), (NODES[3], later)):
                wait_for(lambda node=node, job=job: waiting(folder, node, job), 600, f"{node} waiting for job {job}")
                assert slurm.node_state(state, node)[0] == "draining", "drained while its job runs"
                slurm.release_job(state, node, job)
            out, _ = run.communicate(timeout=900)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode == 0, out[-3000:] + errors.read_text()[-3000:]
    report = json.loads(out)
    journal = journal_of(folder, report)
    assert [by_host(report)[n]["state"] for n in NODES] == ["resumed"] * 4
    drained = [first(journal, n, "draining") for n in NODES]
    assert drained == sorted(drained), "idle hosts first, then the busy ones by the time their jobs have left"
    assert [slurm.job_state(state, job) for job in (sooner, later)] == ["COMPLETED"] * 2
    assert states(journal, NODES[0]) == ["draining", "drained", "upgrading", "rebooting", "validating", "resumed"]
    assert {branch_of(state, n) for n in NODES} == {new} and lock_branch(folder) == new
    assert [slurm.node_state(state, n) for n in NODES] == [("idle", "")] * 4
    assert len(list((folder / "locks" / "history").glob("gpu.*.lock.yaml"))) == 1, "the old lock kept"
    metric = on_host(state, NODES[0], "cat /var/lib/prometheus/node-exporter/gpuprov_rollout.prom")
    assert f'gpuprov_rollout_state{{run="{report["run_id"]}",state="resumed"}} 1.0' in metric.splitlines()


def second_host_validating(journals: Path) -> Path | None:
    """The rollback's journal once its first host is resumed and its second is validating."""
    for path in journals.glob("rollout-journal-*.json"):
        data = json.loads(path.read_text())
        if data["arguments"]["to_lock"] == "previous":
            hosts = data["hosts"]
            if hosts[NODES[0]]["state"] == "resumed" and hosts[NODES[1]]["state"] == "validating":
                return path
    return None


def waiting(folder: Path, node: str, job: int) -> bool:
    """Whether a rollout's journal shows `node` draining while it waits for `job`."""
    for path in (folder / "reports").glob("rollout-journal-*.json"):
        entry = json.loads(path.read_text())["hosts"].get(node) or {}
        if entry.get("state") == "draining" and entry.get("detail", "").startswith(f"waits for job {job} (root, "):
            return True
    return False


def test_an_interrupted_rollback_resumes_and_upgrades_no_host_twice(fleet):
    state, env, folder, branches = fleet
    old = branches[1]
    args = ["--group", "gpu", "--to-lock", "previous", "--batch", "1", "--max-unavailable", "50%", "--checks",
            CHECKS]
    command = [sys.executable, "-m", "invoke", "rollout", *args]
    killed = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    journals = folder / "reports"
    try:
        path = wait_for(lambda: second_host_validating(journals), 400, "the second host validating", every=0.2)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)      # the controller dies mid-batch, the host drained and upgraded
        killed.wait()
    dpkg_lines = {n: int(on_host(state, n, "wc -l < /var/log/dpkg.log")) for n in NODES}

    interrupted = json.loads(path.read_text())
    assert interrupted["status"] == "running"
    assert slurm.node_state(state, NODES[1])[0] == "drained"
    report = rollout(env, *args)
    assert report["run_id"] == interrupted["run_id"], "the rerun continued the same rollout"
    hosts = by_host(report)
    assert [hosts[n]["state"] for n in NODES] == ["resumed"] * 4
    for node in NODES[:2]:     # finished, and upgraded but not validated, when the run was killed
        assert int(on_host(state, node, "wc -l < /var/log/dpkg.log")) == dpkg_lines[node], f"{node} upgraded twice"
        assert states(json.loads(path.read_text()), node).count("upgrading") == 1
    assert {branch_of(state, n) for n in NODES} == {old} and lock_branch(folder) == old
    assert [slurm.node_state(state, n) for n in NODES] == [("idle", "")] * 4
    checked = json.loads(invoke("stack.check", "--group", "gpu", "--json", env=env).stdout)
    assert all(checked[n]["mismatches"] == [] for n in NODES), checked


def test_an_admins_drain_is_respected_and_waiting_is_explained(fleet):
    state, env, folder, branches = fleet
    busy, drained = NODES[2], NODES[3]
    slurm.run_on_controller(state, ["scontrol", "update", f"nodename={drained}", "state=drain",
                                    "reason=bad fan, ticket 42"])
    job = slurm.submit_job(state, busy, 900)
    try:
        wait_for(lambda: slurm.job_state(state, job) == "RUNNING", 30, "the job runs")
        base = ["--host", f"{busy},{drained}", "--update-lock", "--wait-jobs", "30s", "--validate", "none"]
        blocked = invoke("rollout", *base, "--max-unavailable", "50%", check_code=1, env=env)
        assert (f"blocked: max-unavailable 50% (1 host) used by 1 host drained or down outside this rollout: "
                f"{drained} (drained: bad fan, ticket 42)") in blocked.stderr
        assert slurm.node_state(state, busy)[0] in ("allocated", "mixed"), "nothing started"
        report = rollout(env, *base, "--max-unavailable", "100%", check_code=1)
        hosts = by_host(report)
        assert hosts[busy]["state"] == "skipped" and f"job {job} (root, " in hosts[busy]["reason"]
        assert hosts[drained]["state"] == "skipped" and "bad fan, ticket 42" in hosts[drained]["reason"]
        assert slurm.job_state(state, job) == "RUNNING", "nothing was killed"
        assert slurm.node_state(state, busy)[0] in ("allocated", "mixed"), "the rollout's drain was lifted"
        assert slurm.node_state(state, drained) == ("drained", "bad fan, ticket 42")
        status = invoke("rollout", *base, "--status", env=env).stdout
        assert f"{busy}: skipped, still running job {job} (root, " in status
        assert branch_of(state, busy) == branches[1] and branch_of(state, drained) == branches[1]
    finally:
        slurm.run_on_controller(state, ["scancel", str(job)])
        slurm.run_on_controller(state, ["scontrol", "update", f"nodename={drained}", "state=resume"])


def test_a_host_that_fails_validation_stays_drained_and_stops_the_rollout(fleet):
    state, env, folder, branches = fleet
    faulty, next_host = NODES[0], NODES[1]
    with injected(state.host(faulty), "pcie-x8"):
        report = rollout(env, "--host", f"{faulty},{next_host}", "--update-lock", "--batch", "1", "--checks",
                         "host.pcie", check_code=1)
        hosts = by_host(report)
        assert hosts[faulty]["state"] == "failed"
        [failed] = hosts[faulty]["failed_checks"]
        assert failed["check"] == "host.pcie" and failed["figures"], failed
        assert hosts[next_host]["state"] == "selected", "the rollout stopped before the next batch"
        node, reason = slurm.node_state(state, faulty)
        assert node.startswith("drain") and reason.startswith(f"gpuprov rollout {report['run_id']}: failed")
        assert "host.pcie" in reason
        assert branch_of(state, next_host) == branches[1], "the next host was not touched"
