"""Facts against real lab hosts over real SSH: the same code that runs against production servers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from labutil import copy_inventory, invoke

pytestmark = pytest.mark.lab
def test_facts_from_three_profiles_in_one_call(lab):
    proc = invoke("facts", "--all", "--json", "--inventory", str(lab.inventory))
    facts = json.loads(proc.stdout)
    assert sorted(facts) == sorted(h.name for h in lab.hosts)
    by_profile = {lab.host(name).profile: value for name, value in facts.items()}
    hgx = by_profile["hgx-h100"]
    assert hgx["os"]["key"] == "debian-12"
    assert len(hgx["pci_gpus"]) == 8 and {g["model"] for g in hgx["pci_gpus"]} == {"H100-SXM"}
    assert hgx["nvswitch_count"] == 4
    assert {g["device_id"] for g in by_profile["l40s"]["pci_gpus"]} == {"26b9"}
    assert by_profile["l40s"]["nvswitch_count"] == 0
    assert {g["device_id"] for g in by_profile["a100-pcie"]["pci_gpus"]} == {"20b5"}
    for value in facts.values():
        # bare hosts: missing tools are facts, not failures
        assert value["nvidia_smi"] is None and value["loaded_driver_version"] is None
        assert value["complete"] is True and value["kernel"] and value["cpus"] >= 1


def test_facts_table_is_readable(lab):
    proc = invoke("facts", "--host", lab.hosts[0].name, "--inventory", str(lab.inventory))
    assert "GPUs (PCI)" in proc.stdout and lab.hosts[0].name in proc.stdout


def test_unknown_host_key_refused_then_trusted(lab, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    inventory = copy_inventory(lab, tmp_path, known_hosts)
    name = lab.hosts[0].name
    refused = invoke("facts", "--host", name, "--inventory", str(inventory), check_code=1)
    assert "unknown host key" in refused.stdout + refused.stderr
    assert "--trust-new-hosts" in refused.stdout + refused.stderr
    assert not known_hosts.exists() or known_hosts.read_text() == ""

    invoke("facts", "--host", name, "--inventory", str(inventory), "--trust-new-hosts")
    recorded = known_hosts.read_text()
    assert f"[127.0.0.1]:{lab.host(name).port}" in recorded
    invoke("facts", "--host", name, "--inventory", str(inventory))  # now known: no flag needed


def test_changed_host_key_always_refused(lab, tmp_path):
    first, second = lab.hosts[0], lab.hosts[1]
    theirs = [line for line in lab.known_hosts.read_text().splitlines() if f":{second.port} " in line][0]
    forged = theirs.replace(f"[127.0.0.1]:{second.port}", f"[127.0.0.1]:{first.port}")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(forged + "\n")
    inventory = copy_inventory(lab, tmp_path, known_hosts)
    proc = invoke("facts", "--host", first.name, "--inventory", str(inventory), "--trust-new-hosts", check_code=1)
    assert "CHANGED" in proc.stdout + proc.stderr
    assert known_hosts.read_text() == forged + "\n"


def test_stopped_host_reported_others_answer(lab):
    import gpuprov.lab

    down = lab.hosts[-1]
    gpuprov.lab.stop_host(down.name)
    try:
        proc = invoke("facts", "--all", "--json", "--inventory", str(lab.inventory), check_code=1)
    finally:
        gpuprov.lab.start_host(down.name, paths=lab.paths)
    facts = json.loads(proc.stdout)
    assert "cannot reach" in facts[down.name]["error"]
    assert all(facts[h.name]["complete"] for h in lab.hosts if h.name != down.name)


def test_inventory_values_are_data(lab, tmp_path):
    """Shell metacharacters in inventory values never run: facts and a dry-run plan leave no trace."""
    path = copy_inventory(lab, tmp_path, lab.known_hosts)
    document = yaml.safe_load(path.read_text())
    name = lab.hosts[0].name
    document["hosts"][name]["vars"]["note"] = "$(touch /tmp/owned-note); reboot"
    document["hosts"][name]["vars"]["label"] = "`touch /tmp/owned-tick` && reboot"
    path.write_text(yaml.safe_dump(document))
    invoke("facts", "--host", name, "--inventory", str(path))
    invoke("inventory.show", "--host", name, "--inventory", str(path))
    container = lab.host(name).container_id
    probe = subprocess.run(["docker", "exec", container, "sh", "-c", "ls /tmp/owned-* 2>/dev/null | wc -l"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "0"
    assert not list(Path("/tmp").glob("owned-*"))
