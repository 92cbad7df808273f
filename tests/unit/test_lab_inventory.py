"""The inventory and known_hosts the lab writes."""

from __future__ import annotations

from pathlib import Path

import paramiko
import yaml

from gpuprov.lab.keys import ensure_keypair, known_hosts_line, render_known_hosts
from gpuprov.lab.state import INVENTORY_HEADER, LabHost, LabPaths, render_inventory

HOSTS = [
    LabHost("gpuprov-lab-01", "hgx-h100", 42201, "172.20.0.2", "c1", {"gpu": "H100-SXM", "count": 8,
                                                                      "nvswitch": True}),
    LabHost("gpuprov-lab-02", "l40s", 42202, "172.20.0.3", "c2", {"gpu": "L40S", "count": 4,
                                                                  "nvswitch": False}, release="trixie"),
]


def test_inventory_document(tmp_path):
    paths = LabPaths(tmp_path)
    text = render_inventory(HOSTS, paths)
    assert text.startswith(INVENTORY_HEADER)
    doc = yaml.safe_load(text)
    assert doc["known_hosts"] == "../.lab/known_hosts"
    assert (paths.inventory.parent / doc["known_hosts"]).resolve() == paths.known_hosts
    assert doc["defaults"] == {"user": "root", "identity_file": str(tmp_path / ".lab" / "id_ed25519")}
    assert Path(doc["defaults"]["identity_file"]).is_absolute()
    host = doc["hosts"]["gpuprov-lab-01"]
    assert host == {"address": "127.0.0.1", "port": 42201, "groups": ["lab", "hgx-h100"],
                    "vars": {"hardware": {"gpu": "H100-SXM", "count": 8, "nvswitch": True},
                             "lab": {"profile": "hgx-h100", "internal_ip": "172.20.0.2", "release": "bookworm"},
                             "cluster_address": "172.20.0.2", "monitoring_address": "172.20.0.2"}}
    assert doc["hosts"]["gpuprov-lab-02"]["vars"]["lab"]["release"] == "trixie"
    assert set(doc["groups"]) == {"lab", "hgx-h100", "l40s"}
    # the HGX profile's group asks for Docker (profiles.yaml); the L40S one does not
    assert doc["groups"]["hgx-h100"] == {"vars": {"container_engine": "docker"}}
    assert doc["groups"]["l40s"] == {"vars": {}}


def test_lab_inventory_loads_and_gives_the_hgx_host_docker(tmp_path):
    from gpuprov.inventory import load_inventory

    paths = LabPaths(tmp_path)
    paths.inventory.parent.mkdir(parents=True)
    ensure_keypair(paths.key, "gpuprov-lab")
    paths.inventory.write_text(render_inventory(HOSTS, paths, {"mirror": {"url": "http://172.20.0.9/"}}))
    inventory = load_inventory(paths.inventory)
    assert inventory.host("gpuprov-lab-01").vars["container_engine"] == "docker"
    assert inventory.host("gpuprov-lab-01").sources["container_engine"] == "group:hgx-h100"
    assert "container_engine" not in inventory.host("gpuprov-lab-02").vars


def test_lab_inventory_gives_validate_what_lab_hosts_need(tmp_path):
    """Lab hosts reach no index: a CPU torch from the controller's pip configuration; the rendezvous on the
    internal network."""
    from gpuprov.inventory import load_inventory
    from gpuprov.validation.suite_config import validate_vars

    paths = LabPaths(tmp_path)
    paths.inventory.parent.mkdir(parents=True)
    ensure_keypair(paths.key, "gpuprov-lab")
    paths.inventory.write_text(render_inventory(HOSTS, paths, {"mirror": {"url": "http://172.20.0.9/"}}))
    inventory = load_inventory(paths.inventory)
    for name, address in (("gpuprov-lab-01", "172.20.0.2"), ("gpuprov-lab-02", "172.20.0.3")):
        settings = validate_vars(inventory.host(name))
        assert (settings.torch_wheel, settings.torch_version, settings.torch_index) == ("cpu", "2.13", "")
        assert settings.cluster_address == address
    assert inventory.host("gpuprov-lab-01").vars["mirror"] == {"url": "http://172.20.0.9/"}


def test_known_hosts_lines_load_in_paramiko(tmp_path):
    pubs = [ensure_keypair(tmp_path / name / "key", f"root@{name}") for name in ("a", "b")]
    assert pubs[0] != pubs[1]
    path = tmp_path / "known_hosts"
    path.write_text(render_known_hosts([("127.0.0.1", 42201, pubs[0]), ("127.0.0.1", 42202, pubs[1])]))
    keys = paramiko.HostKeys(str(path))
    assert keys.lookup("[127.0.0.1]:42201")["ssh-ed25519"].get_base64() == pubs[0].split()[1]
    assert keys.lookup("[127.0.0.1]:42202")["ssh-ed25519"].get_base64() == pubs[1].split()[1]


def test_known_hosts_port_22_is_bare():
    assert known_hosts_line("10.0.0.1", 22, "ssh-ed25519 AAAA c") == "10.0.0.1 ssh-ed25519 AAAA"


def test_keypair_is_made_once_private_and_loadable(tmp_path):
    key = tmp_path / "id_ed25519"
    first = ensure_keypair(key, "gpuprov-lab")
    assert ensure_keypair(key, "gpuprov-lab") == first
    assert key.stat().st_mode & 0o777 == 0o600
    loaded = paramiko.Ed25519Key.from_private_key_file(str(key))
    assert loaded.get_base64() == first.split()[1]
