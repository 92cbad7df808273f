"""An inventory whose hosts come from the lab's real slurmctld (Debian's slurm-wlm 22.05): a `slurm:` source, the
lab inventory's SSH settings and overrides, read over SSH by every task that loads it. The expected GPUs come from
the lab's profiles, the expected state and reason from what the test itself sets with scontrol."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from labutil import invoke, invoke_json, on_host, slurm_fleet, snapshot, wait_for

from gpuprov.lab.profiles import load_profiles

pytestmark = pytest.mark.lab
OWN_FLEET = True   # conftest.bare_lab: the fleet below replaces the session's hosts

GPU_PROFILES = ["hgx-h100", "l40s"]
CONTROLLER = "gpuprov-lab-03"
NODES = ["gpuprov-lab-01", "gpuprov-lab-02"]
# a drain reason an admin could type: a pipe, quotes, a backslash, shell syntax, a tab, non-ASCII letters
REASON = 'bad fan | "psu 2" \\ $(id) ; tab\there ünï'


@pytest.fixture(scope="module")
def cluster():
    with slurm_fleet(GPU_PROFILES) as state:
        yield state


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("inventory-slurm")
    return {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}


def slurm_inventory(cluster, folder: Path, edit=None) -> Path:
    """The lab inventory with a `slurm:` source on the controller host; the GPU hosts keep their SSH settings and
    overrides but lose their `gpu` group, hardware and scheduler, which Slurm gives them."""
    document = yaml.safe_load(cluster.inventory.read_text())
    document["known_hosts"] = str(cluster.known_hosts)
    document["slurm"] = {"controller": CONTROLLER}
    assert document["groups"].pop("gpu") == {"vars": {}}
    for node in NODES:
        host = document["hosts"][node]
        host["groups"] = [g for g in host["groups"] if g != "gpu"]
        assert host["vars"].pop("scheduler") == {"kind": "slurm", "controller": CONTROLLER}
        del host["vars"]["hardware"]
    if edit is not None:
        edit(document)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def ctl(cluster, command: str) -> str:
    return on_host(cluster, CONTROLLER, command)



def show(path: Path, host: str, env: dict) -> dict:
    return invoke_json("inventory.show", "--host", host, "--inventory", str(path), env=env)


def test_every_node_is_in_its_partition_group_with_its_gres(cluster, env, tmp_path):
    path = slurm_inventory(cluster, tmp_path)
    checked = invoke("inventory.check", "--inventory", str(path), env=env)
    assert "(native+slurm format): 3 hosts" in checked.stdout
    assert f"hosts: {', '.join([*NODES, CONTROLLER])}" in checked.stdout.splitlines()
    profiles = load_profiles()
    for node, profile in zip(NODES, GPU_PROFILES, strict=True):
        hardware = profiles[profile].hardware
        shown = show(path, node, env)
        assert shown["groups"][0] == "gpu", shown["groups"]          # the partition, before the file's groups
        assert shown["vars"]["hardware"] == {"gpu": hardware["gpu"], "count": hardware["count"]}
        assert shown["vars"]["slurm_gres"] == f"gpu:{hardware['gpu'].lower()}:{hardware['count']}"
        assert (shown["vars"]["slurm_state"], shown["vars"]["slurm_reason"]) == ("idle", "")
        assert shown["vars"]["scheduler"] == {"kind": "slurm", "controller": CONTROLLER}
        assert shown["sources"]["hardware"] == "slurm" and shown["sources"]["mirror"] == "group:lab"
        assert (shown["address"], shown["port"]) == ("127.0.0.1", cluster.host(node).port)


def test_a_file_with_only_the_controller_lists_slurm_s_nodes(cluster, env, tmp_path):
    lab = yaml.safe_load(cluster.inventory.read_text())
    document = {"known_hosts": str(cluster.known_hosts), "defaults": lab["defaults"],
                "hosts": {CONTROLLER: {k: lab["hosts"][CONTROLLER][k] for k in ("address", "port")}},
                "slurm": {"controller": CONTROLLER, "partitions": ["gpu"]}}
    path = tmp_path / "slurm-only.yaml"
    path.write_text(yaml.safe_dump(document))
    checked = invoke("inventory.check", "--inventory", str(path), env=env).stdout.splitlines()
    assert checked[1:] == [f"hosts: {CONTROLLER}, {', '.join(NODES)}", "groups: gpu"], checked
    # Slurm's NodeAddr (the lab writes each node's internal IP there), as the file gives no address
    assert show(path, NODES[0], env)["address"] == cluster.host(NODES[0]).internal_ip


def test_a_drained_node_shows_its_state_and_reason(cluster, env, tmp_path):
    path = slurm_inventory(cluster, tmp_path)
    node = NODES[1]
    ctl(cluster, f"scontrol update nodename={node} state=drain reason={shlex.quote(REASON)}")
    try:
        shown = show(path, node, env)
        assert (shown["vars"]["slurm_state"], shown["vars"]["slurm_reason"]) == ("idle+drain", REASON)
        assert show(path, NODES[0], env)["vars"]["slurm_state"] == "idle"
    finally:
        ctl(cluster, f"scontrol update nodename={node} state=resume")
    wait_for(lambda: show(path, node, env)["vars"]["slurm_state"] == "idle", 30, f"{node} is idle again")


def test_provision_dry_run_plans_from_the_partition_group_and_changes_nothing(cluster, env, tmp_path):
    path = slurm_inventory(cluster, tmp_path)
    before = {node: snapshot(cluster, node) for node in NODES}
    report = invoke_json("provision", "--group", "gpu", "--dry-run", "--inventory", str(path), env=env)
    runs = {run["host"]: run for run in report["hosts"]}
    assert sorted(runs) == NODES
    assert all(run["status"] == "planned" and run["plan"]["changes"] for run in runs.values()), runs
    assert {node: snapshot(cluster, node) for node in NODES} == before


def test_rollout_drains_through_the_controller_slurm_names(cluster, env, tmp_path):
    """The nodes' scheduler (kind slurm, the source's controller) comes from the slurm: source alone."""
    path = slurm_inventory(cluster, tmp_path)
    proc = invoke("rollout", "--group", "gpu", "--drain", "slurm", "--dry-run", "--inventory", str(path), env=env)
    planned = [line for line in proc.stdout.splitlines() if "would drain" in line]
    assert [line.split()[1] for line in planned] == NODES, proc.stdout
    assert ctl(cluster, f"sinfo -h -N -n {','.join(NODES)} -o '%N %t'").split() == [NODES[0], "idle", NODES[1], "idle"]


def test_one_node_is_selected_by_name(cluster, env, tmp_path):
    path = slurm_inventory(cluster, tmp_path)
    facts = invoke_json("facts", "--host", NODES[0], "--inventory", str(path), env=env)
    assert list(facts) == [NODES[0]], list(facts)


def test_a_controller_that_cannot_be_reached_is_a_clear_error(cluster, env, tmp_path):
    def closed_port(document):
        document["hosts"][CONTROLLER]["port"] = 9   # discard: nothing listens there
    path = slurm_inventory(cluster, tmp_path, closed_port)
    proc = invoke("inventory.check", "--inventory", str(path), env=env, check_code=1)
    assert proc.stderr.startswith(f"error: [{CONTROLLER}] inventory.slurm: cannot read Slurm's nodes from the "
                                  f"controller {CONTROLLER}: "), proc.stderr
    assert "\n  command: sinfo --json\n" in proc.stderr and "\n  next: " in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unknown_controller_key_is_refused_with_what_to_do(cluster, env, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")

    def no_keys(document):
        document["known_hosts"] = str(empty)
    path = slurm_inventory(cluster, tmp_path, no_keys)
    proc = invoke("inventory.check", "--inventory", str(path), env=env, check_code=1)
    assert proc.stderr.startswith(f"error: [{CONTROLLER}] inventory.slurm: cannot read Slurm's nodes from the "
                                  f"controller {CONTROLLER}: unknown host key "), proc.stderr
    port = cluster.host(CONTROLLER).port
    assert f"add its line for [127.0.0.1]:{port} to {empty} (ssh-keyscan -p {port} 127.0.0.1 prints it)" in proc.stderr
    assert empty.read_text() == ""
