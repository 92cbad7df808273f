"""`invoke lab.up --slurm`: a real Slurm cluster (Debian's slurm-wlm) of two GPU hosts and a controller host. The
operator's view: sinfo lists the nodes with their GPUs, batch and 2-node jobs run, drain and resume work, and a
drained node that reboots comes back drained, with its reason."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml
from labutil import invoke, on_host, slurm_fleet, wait_for

import gpuprov.lab
from gpuprov.lab import slurm
from gpuprov.lab.profiles import load_profiles

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts

GPU_PROFILES = ["hgx-h100", "l40s"]
CONTROLLER = "gpuprov-lab-03"
NODES = ["gpuprov-lab-01", "gpuprov-lab-02"]


@pytest.fixture(scope="module")
def cluster():
    with slurm_fleet(GPU_PROFILES) as state:
        print(f"lab.up --slurm (fresh hosts): {state.timings}")
        yield state


def ctl(cluster, command: str) -> str:
    return on_host(cluster, CONTROLLER, command)


def node_line(cluster, node: str) -> str:
    """`NAME STATE|REASON` of a node, `*` after the state while it does not respond."""
    return ctl(cluster, f"sinfo -h -N -n {node} -o '%N %t|%E'").strip()



def test_the_controller_has_no_gpus_and_the_inventory_names_the_cluster(cluster):
    assert [h.name for h in cluster.hosts] == [*NODES, CONTROLLER]
    assert [h.profile for h in cluster.hosts] == [*GPU_PROFILES, "slurm-controller"]
    document = yaml.safe_load(cluster.inventory.read_text())
    assert document["hosts"][CONTROLLER]["groups"] == ["slurm_controllers"]
    assert "hardware" not in document["hosts"][CONTROLLER]["vars"]
    for node in NODES:
        assert "gpu" in document["hosts"][node]["groups"]
        assert document["hosts"][node]["vars"]["scheduler"] == {"kind": "slurm", "controller": CONTROLLER}
    invoke("inventory.check", "--inventory", str(cluster.inventory))
    assert on_host(cluster, CONTROLLER, "hostname").strip() == CONTROLLER


def test_sinfo_lists_both_nodes_idle_in_the_partition_with_their_gpus(cluster):
    profiles = load_profiles()
    expected = set()
    for node, profile in zip(NODES, GPU_PROFILES, strict=True):
        hardware = profiles[profile].hardware
        expected.add(f"{node} gpu:{hardware['gpu'].lower()}:{hardware['count']} idle")
    assert set(ctl(cluster, "sinfo -N -h -o '%N %G %T'").splitlines()) == expected
    assert ctl(cluster, "sinfo -h -o '%P %D %N'").split() == ["gpu*", "2", "gpuprov-lab-[01-02]"]
    for node in NODES:
        assert on_host(cluster, node, "stat -c '%t:%T' /dev/nvidia0").strip() == "c3:0"   # major 195, minor 0
        assert on_host(cluster, node, "stat -c '%U %a' /etc/munge/munge.key").strip() == "munge 400"


def test_a_batch_job_runs_to_completion_on_the_chosen_node(cluster):
    job = slurm.submit_job(cluster, NODES[1], 2)
    wait_for(lambda: slurm.job_state(cluster, job) == "COMPLETED", 60, f"job {job} completes")
    shown = ctl(cluster, f"scontrol -o show job {job}")
    assert f"NodeList={NODES[1]} " in shown and "ExitCode=0:0" in shown
    out = ctl(cluster, f"sbatch --parsable -w {NODES[0]} -o /tmp/ok.out --wrap 'sleep 2; echo ok'").strip()
    wait_for(lambda: "JobState=COMPLETED" in ctl(cluster, f"scontrol -o show job {out}"), 60, "the wrap job completes")
    assert on_host(cluster, NODES[0], "cat /tmp/ok.out") == "ok\n"


def test_a_two_node_srun_prints_both_names(cluster):
    assert sorted(ctl(cluster, "srun -N2 -p gpu hostname").split()) == NODES


def test_drain_with_a_reason_and_resume(cluster):
    node = NODES[1]
    ctl(cluster, f"scontrol update nodename={node} state=drain reason='gpuprov lab test: drain'")
    assert node_line(cluster, node) == f"{node} drain|gpuprov lab test: drain"
    assert slurm.node_state(cluster, node) == ("drained", "gpuprov lab test: drain")
    ctl(cluster, f"scontrol update nodename={node} state=resume")
    # a resumed node shows `idle*` (not responding) until the controller's next ping, a second later
    wait_for(lambda: node_line(cluster, node) == f"{node} idle|none", 30, f"{node} is idle again")


def test_a_drained_node_that_reboots_comes_back_drained_with_its_reason(cluster):
    node = cluster.host(NODES[0])
    ctl(cluster, f"scontrol update nodename={node.name} state=drain reason='gpuprov lab test: reboot'")
    boots = subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", node.container_id], capture_output=True,
                           text=True, check=True).stdout.strip()
    subprocess.run(["ssh", "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                    "-o", "BatchMode=yes", "-i", str(cluster.key), "-p", str(node.port), f"root@{node.address}",
                    "systemctl reboot"], capture_output=True, timeout=60)

    def back() -> bool:
        now = subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}} {{.State.Running}}", node.container_id],
                             capture_output=True, text=True).stdout.split()
        return now == [str(int(boots) + 1), "true"] and subprocess.run(
            ["docker", "exec", node.container_id, "systemctl", "is-active", "-q", "slurmd"]).returncode == 0

    wait_for(back, 120, f"{node.name} reboots and runs slurmd again")
    line = wait_for(lambda: (lambda seen: seen if "*" not in seen else None)(node_line(cluster, node.name)), 150,
                    f"{node.name} answers the controller again")
    assert line.startswith(f"{node.name} drain|gpuprov lab test: reboot"), line
    ctl(cluster, f"scontrol update nodename={node.name} state=resume")
    wait_for(lambda: node_line(cluster, node.name) == f"{node.name} idle|none", 30, f"{node.name} is idle again")


def test_a_second_lab_up_slurm_changes_nothing(cluster):
    def services() -> list[str]:
        return [on_host(cluster, host, f"systemctl show -p ActiveEnterTimestampMonotonic {unit}")
                for host, unit in ((CONTROLLER, "slurmctld"), *((n, "slurmd") for n in NODES))]

    before, inventory = services(), cluster.inventory.read_text()
    started = time.monotonic()
    again = gpuprov.lab.up(len(GPU_PROFILES), GPU_PROFILES, paths=cluster.paths, progress=print, slurm=True)
    print(f"lab.up --slurm again: {time.monotonic() - started:.1f} s")
    assert [h.container_id for h in again.hosts] == [h.container_id for h in cluster.hosts]
    assert services() == before
    assert cluster.inventory.read_text() == inventory
