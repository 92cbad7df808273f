"""`invoke health.deploy` on the lab's real Slurm cluster (Debian's slurm-wlm 22.05): four L40S nodes (the driver
provisioned, so that the simulated nvidia-smi answers and takes the lab's faults) and a controller. slurmctld runs
gpuprov-health every few seconds; a simulated fault drains a node with a `gpuprov:<code>` reason, clearing it
resumes the node, an admin's drain stays, and the circuit breaker keeps gpuprov's drains to a quarter of the
partition, also when three nodes fail in the same instant. Every wait is a poll with a deadline of a few intervals."""

from __future__ import annotations

import json
import threading
import time

import pytest
from labutil import invoke, on_host, slurm_fleet, wait_for

from gpuprov.lab import slurm
from gpuprov.lab.faults import clear_faults, set_faults

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts

NODES = [f"gpuprov-lab-0{i}" for i in range(1, 5)]
CONTROLLER = "gpuprov-lab-05"
INTERVAL_S = 5
DEADLINE_S = 8 * INTERVAL_S      # a few intervals: slurmctld starts the runs from its background loop
MAX_DRAINED = "25%"              # of 4 nodes: one (slurm.conf's breaker share, rounded up)
LAST = "/var/lib/gpuprov-health/last.json"
TEXTFILE = "/var/lib/prometheus/node-exporter/gpuprov_health.prom"
TEXT = f"cat {TEXTFILE}"
FILES = ("/etc/slurm/slurm.conf /usr/local/sbin/gpuprov-health /usr/local/sbin/gpuprov-health-epilog "
         "/etc/gpuprov/health.json")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_fleet(["l40s"] * len(NODES)) as state:
        folder = tmp_path_factory.mktemp("health")
        env = {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}
        invoke("provision", "--group", "gpu", "--only", "sources,driver", env=env)
        yield state, env


def deploy(env: dict, *args: str) -> dict:
    return json.loads(invoke("health.deploy", "--group", "gpu", "--interval", str(INTERVAL_S), "--max-drained",
                             MAX_DRAINED, *args, "--json", env=env).stdout)


def files(state, name: str) -> str:
    """Owner, mode and checksum of each file deploy manages (`-` for one that is not there)."""
    return on_host(state, name, f"for f in {FILES}; do [ -e $f ] && echo $f $(stat -c '%U %a' $f) "
                                f"$(sha256sum < $f) || echo $f -; done")



def last_run(state, node: str) -> dict | None:
    text = on_host(state, node, f"cat {LAST} 2>/dev/null || true")
    return json.loads(text) if text.strip() else None


def run_after(state, node: str, since: float) -> dict:
    """The node's first health check result that started after `since` (this machine's clock: the lab's hosts
    share it)."""
    return wait_for(lambda: (r if (r := last_run(state, node)) and r["time"] > since else None),
                    DEADLINE_S, f"{node} runs its health check after {since:.1f}", every=0.5)


def drained_by_gpuprov(state) -> list[str]:
    return [n for n in NODES if slurm.node_state(state, n)[1].startswith("gpuprov:")]


def settled(state, nodes: list[str]) -> None:
    """Wait for two runs on each node that start after now (the second after every drain of the first settled)."""
    mark = time.time()
    for node in nodes:
        first = run_after(state, node, mark)
        run_after(state, node, first["time"] + 0.001)


def test_dry_run_changes_nothing(cluster):
    state, env = cluster
    before = {name: files(state, name) for name in [*NODES, CONTROLLER]}
    config = slurm.run_on_controller(state, ["scontrol", "show", "config"])
    report = deploy(env, "--dry-run")
    assert {h["host"]: h["status"] for h in report["hosts"]} == {**dict.fromkeys(NODES, "planned"),
                                                                 CONTROLLER: "planned"}
    assert report["reconfigure"] == "planned"
    assert {name: files(state, name) for name in [*NODES, CONTROLLER]} == before
    assert slurm.run_on_controller(state, ["scontrol", "show", "config"]).split("\n")[1:] == config.split("\n")[1:]


def test_deploy_installs_the_program_and_wires_slurm(cluster):
    state, env = cluster
    report = deploy(env)
    assert {h["host"]: h["status"] for h in report["hosts"]} == {**dict.fromkeys(NODES, "changed"),
                                                                 CONTROLLER: "changed"}
    assert report["reconfigure"] == "done"
    for node in NODES:
        listing = files(state, node).splitlines()
        assert [line.split()[:3] for line in listing] == [
            ["/etc/slurm/slurm.conf", "root", "644"], ["/usr/local/sbin/gpuprov-health", "root", "755"],
            ["/usr/local/sbin/gpuprov-health-epilog", "root", "755"], ["/etc/gpuprov/health.json", "root", "644"]]
        settings = json.loads(on_host(state, node, "cat /etc/gpuprov/health.json"))
        assert settings == {"expect_nvlink": False, "expected_gpus": 4, "max_drained_pct": 25.0, "slurm": True,
                            "textfile_dir": "/var/lib/prometheus/node-exporter"}   # l40s: 4 PCIe cards
    # one slurm.conf everywhere, as Slurm wants it
    confs = {on_host(state, name, "sha256sum < /etc/slurm/slurm.conf") for name in [*NODES, CONTROLLER]}
    assert len(confs) == 1
    config = slurm.run_on_controller(state, ["scontrol", "show", "config"])
    shown = dict(line.split("=", 1) for line in config.splitlines() if " = " in line)
    shown = {k.strip(): v.strip() for k, v in shown.items()}
    assert shown["HealthCheckProgram"] == "/usr/local/sbin/gpuprov-health"
    assert shown["HealthCheckInterval"] == f"{INTERVAL_S} sec"
    assert set(shown["HealthCheckNodeState"].split(",")) == {"ANY", "CYCLE"}
    assert shown["Epilog"] == "/usr/local/sbin/gpuprov-health-epilog"


def test_slurm_runs_the_check_on_every_node_with_its_name(cluster):
    state, _ = cluster
    mark = time.time()
    for node in NODES:
        result = run_after(state, node, mark)
        assert result["ok"] is True and result["slurm"]["node"] == node
        assert result["slurm"]["node_from"] == "SLURMD_NODENAME"    # slurmd 22.05 sets it for HealthCheckProgram
        assert "gpuprov_health_ok 1\n" in on_host(state, node, f"cat {TEXTFILE}")


def test_second_deploy_changes_nothing(cluster):
    state, env = cluster
    before = {name: files(state, name) for name in [*NODES, CONTROLLER]}
    report = deploy(env)
    assert {h["status"] for h in report["hosts"]} == {"unchanged"}
    assert report["reconfigure"] == "not needed"
    assert {name: files(state, name) for name in [*NODES, CONTROLLER]} == before


def test_a_fault_drains_the_node_and_clearing_it_resumes(cluster):
    state, _ = cluster
    node = NODES[0]
    set_faults(state.host(node), "pcie-x8")      # (ecc-uncorrectable did not drain an L40S node in a first run)
    try:
        wait_for(lambda: slurm.node_state(state, node)[0] == "drained", DEADLINE_S, f"{node} is drained", every=0.5)
        assert slurm.node_state(state, node)[1].startswith("gpuprov:PCIE_DEGRADED PCIe link x8 of x16 ")
        # the run writes its textfile after the breaker's recount, a couple of seconds after the drain shows
        wait_for(lambda: 'gpuprov_health_fault{code="PCIE_DEGRADED"' in (text := on_host(state, node, TEXT))
                 and "gpuprov_health_drained 1\n" in text, DEADLINE_S, f"{node}'s textfile says it is drained",
                 every=0.5)
    finally:
        clear_faults(state.host(node))
    wait_for(lambda: slurm.node_state(state, node) == ("idle", ""), DEADLINE_S, f"{node} is resumed", every=0.5)


def test_an_admins_drain_is_never_resumed(cluster):
    state, _ = cluster
    node = NODES[1]
    slurm.run_on_controller(state, ["scontrol", "update", f"nodename={node}", "state=drain",
                                    "reason=admin: fan replaced, watching it"])
    try:
        set_faults(state.host(node), "pcie-x8")
        result = run_after(state, node, time.time())
        assert [f["code"] for f in result["faults"] if f["severity"] == "fatal"] == ["PCIE_DEGRADED"]
        assert result["slurm"]["why"] == "drained by someone else: left as it is"
        clear_faults(state.host(node))
        settled(state, [node])     # two passing runs after the fault cleared
        assert last_run(state, node)["ok"] is True
        assert slurm.node_state(state, node) == ("drained", "admin: fan replaced, watching it")
    finally:
        clear_faults(state.host(node))
        slurm.run_on_controller(state, ["scontrol", "update", f"nodename={node}", "state=resume"])
    wait_for(lambda: slurm.node_state(state, node) == ("idle", ""), DEADLINE_S, f"{node} is idle again",
             every=0.5)


def test_the_breaker_drains_only_its_share_and_reports_the_rest(cluster):
    state, _ = cluster
    failing = NODES[:3]
    for node in failing:
        set_faults(state.host(node), "pcie-x8")
    try:
        settled(state, failing)
        assert len(drained_by_gpuprov(state)) == 1          # 25 % of 4
        held = [n for n in failing if n not in drained_by_gpuprov(state)]
        for node in held:
            result = last_run(state, node)
            assert result["slurm"]["held_back"] is True and "limit 25% = 1 nodes" in result["slurm"]["why"]
            assert "gpuprov_health_held_back 1\n" in on_host(state, node, f"cat {TEXTFILE}")
            assert slurm.node_state(state, node)[0] == "idle"
    finally:
        for node in failing:
            clear_faults(state.host(node))
    wait_for(lambda: not drained_by_gpuprov(state), DEADLINE_S, "every node is resumed", every=0.5)


def test_three_nodes_failing_in_the_same_instant_keep_one_drain(cluster):
    # the program run by hand on three nodes at the same moment (as Slurm does without CYCLE), beside Slurm's runs
    state, _ = cluster
    failing = NODES[1:]
    for node in failing:
        set_faults(state.host(node), "pcie-x8")
    start = time.time() + 2
    results: dict = {}

    def run(node: str) -> None:
        results[node] = on_host(state, node, f"python3 -c 'import time; time.sleep(max(0, {start} - time.time()))'"
                                             " && /usr/local/sbin/gpuprov-health --slurm --json --kernel-log none")

    threads = [threading.Thread(target=run, args=(node,)) for node in failing]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for node in failing:   # held back before the drain, or given up after the recount: both are correct
            part = json.loads(results[node])["slurm"]
            print(f"same-instant run on {node}: {part['action']}: {part.get('why', '')}")
        settled(state, failing)
        assert len(drained_by_gpuprov(state)) == 1
    finally:
        for node in failing:
            clear_faults(state.host(node))
    wait_for(lambda: not drained_by_gpuprov(state), DEADLINE_S, "every node is resumed", every=0.5)


def test_the_epilog_runs_the_deeper_check_only_after_a_failed_job(cluster):
    state, _ = cluster
    node = NODES[3]
    epilog_result = f"cat {LAST.replace('last.json', 'last-epilog.json')} 2>/dev/null || true"
    ok = slurm.run_on_controller(state, ["sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap",
                                         "exit 0"]).strip()
    wait_for(lambda: slurm.job_state(state, int(ok)) == "COMPLETED", DEADLINE_S, f"job {ok} completes", every=0.5)
    failed = slurm.run_on_controller(state, ["sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap",
                                             "exit 3"]).strip()
    wait_for(lambda: slurm.job_state(state, int(failed)) == "FAILED", DEADLINE_S, f"job {failed} fails", every=0.5)
    text = wait_for(lambda: on_host(state, node, epilog_result).strip(), DEADLINE_S, f"the epilog's check on {node}",
                    every=0.5)
    result = json.loads(text)
    # slurmd 22.05 gives the Epilog SLURM_JOB_EXIT_CODE2 (<exit>:<signal>); the job that passed left no result
    assert result["epilog"] == {"job": failed, "exit": "3:0"}
    assert result["checks"]["dcgm_diag"].startswith("skipped: dcgmi")   # no DCGM installed here
    assert result["ok"] is True and slurm.node_state(state, node) == ("idle", "")
