"""The lab's Slurm cluster, its pure parts: slurm.conf and gres.conf as Slurm's documentation describes them, the
files each host gets, and the inventory of a lab with a Slurm controller."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.lab import slurm
from gpuprov.lab.state import LabHost, LabPaths, LabState, inventory_document

PROFILES = yaml.safe_load(Path(slurm.__file__).with_name("profiles.yaml").read_text())["profiles"]


def host(name, profile, ip, hardware=None):
    return LabHost(name=name, profile=profile, port=42200, internal_ip=ip, container_id=name,
                   hardware=PROFILES[profile]["hardware"] if hardware is None else hardware)


def lab(tmp_path):
    hosts = [host("gpuprov-lab-01", "hgx-h100", "10.213.0.11"), host("gpuprov-lab-02", "l40s", "10.213.0.12"),
             host("gpuprov-lab-03", "slurm-controller", "10.213.0.13", hardware={})]
    return LabState(hosts, LabPaths(tmp_path))


def conf_lines(text: str) -> list[dict[str, str]]:
    """Each non-comment line as slurm.conf(5) reads it: whitespace-separated KEY=VALUE pairs, a value may be quoted."""
    return [dict(part.split("=", 1) for part in shlex.split(line))
            for line in text.splitlines() if line.strip() and not line.startswith("#")]


def expand(files: str) -> list[str]:
    """A gres.conf File= value: one path, or a bracketed numeric range /dev/nvidia[0-7] (gres.conf(5))."""
    found = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", files)
    if not found:
        return [files]
    return [f"{found.group(1)}{i}" for i in range(int(found.group(2)), int(found.group(3)) + 1)]


def test_gres_conf_lines_name_every_gpu_of_the_profile_with_a_file(tmp_path):
    cluster = slurm.cluster_of(lab(tmp_path))
    lines = conf_lines(slurm.render_gres_conf(cluster))
    assert lines[0] == {"AutoDetect": "off"}
    nodes = {line["NodeName"]: line for line in lines[1:]}
    assert set(nodes) == {"gpuprov-lab-01", "gpuprov-lab-02"}
    assert nodes["gpuprov-lab-01"]["Name"] == "gpu" and nodes["gpuprov-lab-01"]["Type"] == "h100-sxm"
    assert expand(nodes["gpuprov-lab-01"]["File"]) == [f"/dev/nvidia{i}" for i in range(8)]
    assert nodes["gpuprov-lab-02"]["Type"] == "l40s"
    assert expand(nodes["gpuprov-lab-02"]["File"]) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]


def test_one_gpu_is_one_file():
    assert slurm.device_files(1) == "/dev/nvidia0"


def test_slurm_conf_nodes_partition_and_settings(tmp_path):
    cluster = slurm.cluster_of(lab(tmp_path), {"gpuprov-lab-01": 16})
    lines = conf_lines(slurm.render_slurm_conf(cluster))
    settings = {k: v for line in lines if len(line) == 1 for k, v in line.items()}
    assert settings["SlurmctldHost"] == "gpuprov-lab-03(10.213.0.13)"
    assert settings["ProctrackType"] == "proctrack/linuxproc" and settings["TaskPlugin"] == "task/none"
    assert settings["SelectType"] == "select/cons_tres" and settings["GresTypes"] == "gpu"
    assert settings["ReturnToService"] == "2"
    assert settings["RebootProgram"] == "/usr/bin/systemctl reboot"
    nodes = {line["NodeName"]: line for line in lines if "NodeName" in line}
    assert nodes["gpuprov-lab-01"] == {"NodeName": "gpuprov-lab-01", "NodeAddr": "10.213.0.11", "CPUs": "16",
                                       "Gres": "gpu:h100-sxm:8", "State": "UNKNOWN"}
    assert nodes["gpuprov-lab-02"]["Gres"] == "gpu:l40s:4" and nodes["gpuprov-lab-02"]["CPUs"] == "1"
    partition = next(line for line in lines if "PartitionName" in line)
    assert partition["PartitionName"] == "gpu" and partition["Default"] == "YES"
    assert partition["Nodes"].split(",") == ["gpuprov-lab-01", "gpuprov-lab-02"]


@pytest.mark.parametrize("name", ["gpu01;reboot", "GPU01", "a b", "-x", "x" * 64, "$(id)"])
def test_names_a_shell_or_slurm_would_read_otherwise_are_refused(name):
    with pytest.raises(InputError):
        slurm.check_name(name)


def test_gres_type_is_the_catalog_model_in_lowercase():
    assert [slurm.gres_type(m) for m in ("H100-SXM", "L40S", "A100-PCIE-80GB")] == ["h100-sxm", "l40s",
                                                                                      "a100-pcie-80gb"]
    with pytest.raises(InputError):
        slurm.gres_type("H100:8")


def test_a_host_without_an_internal_ip_is_named(tmp_path):
    state = lab(tmp_path)
    state.hosts[1] = host("gpuprov-lab-02", "l40s", None)
    with pytest.raises(GpuprovError, match="gpuprov-lab-02 has no internal IP"):
        slurm.cluster_of(state)


def test_devices_unit_makes_the_nvidia_character_devices():
    unit = slurm.devices_unit(2)
    command = shlex.split(next(line for line in unit.splitlines() if line.startswith("ExecStart="))[10:])
    assert command[:2] == ["/bin/sh", "-c"]
    assert "mknod -m 0666 /dev/nvidia0 c 195 0" in command[2] and "mknod -m 0666 /dev/nvidia1 c 195 1" in command[2]
    assert "Before=slurmd.service" in unit


def test_each_host_gets_the_munge_key_and_only_gpu_hosts_get_slurmd_files(tmp_path):
    cluster = slurm.cluster_of(lab(tmp_path))
    key = b"k" * 1024
    ctl = slurm.host_files(cluster, cluster.controller, "http://10.213.0.129/slurm/", "KEY", key)
    node = slurm.host_files(cluster, cluster.nodes[0], "http://10.213.0.129/slurm/", "KEY", key)
    assert ctl["/etc/gpuprov-lab/munge.key"] == (key, 0o400) == node["/etc/gpuprov-lab/munge.key"]
    assert "/etc/default/slurmd" not in ctl
    assert node["/etc/default/slurmd"][0] == b'SLURMD_OPTIONS="-b"\n'
    assert ctl[slurm.SOURCE_LIST][0] == (b"deb [signed-by=/etc/apt/keyrings/gpuprov-lab-slurm.asc] "
                                         b"http://10.213.0.129/slurm/ /\n")
    assert slurm.files_digest(node) != slurm.files_digest(ctl)
    assert slurm.files_digest(node) == slurm.files_digest(dict(reversed(node.items())))


def test_munge_key_is_made_once_and_private(tmp_path):
    paths = LabPaths(tmp_path)
    first = slurm.ensure_munge_key(paths)
    assert len(first) == 1024 and slurm.ensure_munge_key(paths) == first
    assert (tmp_path / ".lab" / "slurm" / "munge.key").stat().st_mode & 0o777 == 0o600


def test_setup_script_installs_without_recommends_from_its_own_list():
    script = slurm.setup_script(("slurmd", "munge"), ("munge", "slurmd"), "abc")
    # both apt-get calls read only the lab's Slurm list: it lies outside sources.list.d (provisioning's apt never
    # sees it), so an install without it would not find the packages the update listed
    assert f'source="-o Dir::Etc::SourceList={slurm.SOURCE_LIST} -o Dir::Etc::SourceParts=- ' in script
    assert "apt-get -q update $source\n" in script
    assert ("apt-get -q install -y --no-install-recommends -o Dpkg::Options::=--force-confold $source slurmd munge"
            in script)
    assert "install -o munge -g munge -m 0400 /etc/gpuprov-lab/munge.key /etc/munge/munge.key" in script
    assert "systemctl restart munge slurmd" in script


def test_controller_profile_has_no_gpus():
    profile = slurm.controller_profile()
    assert profile.name == "slurm-controller" and profile.hardware == {} and profile.gpu_devices() == []
    assert profile.devices


def test_inventory_of_a_slurm_lab(tmp_path):
    document = inventory_document(lab(tmp_path).hosts, LabPaths(tmp_path))
    hosts = document["hosts"]
    assert hosts["gpuprov-lab-03"]["groups"] == ["slurm_controllers"]
    assert "hardware" not in hosts["gpuprov-lab-03"]["vars"] and "scheduler" not in hosts["gpuprov-lab-03"]["vars"]
    for name in ("gpuprov-lab-01", "gpuprov-lab-02"):
        assert "gpu" in hosts[name]["groups"] and "lab" in hosts[name]["groups"]
        assert hosts[name]["vars"]["scheduler"] == {"kind": "slurm", "controller": "gpuprov-lab-03"}
    assert {"slurm_controllers", "gpu"} <= set(document["groups"])
    assert "slurm-controller" not in document["groups"]


def test_inventory_without_a_controller_is_unchanged(tmp_path):
    hosts = lab(tmp_path).hosts[:2]
    document = inventory_document(hosts, LabPaths(tmp_path))
    assert [document["hosts"][h.name]["groups"] for h in hosts] == [["lab", "hgx-h100"], ["lab", "l40s"]]
    assert all("scheduler" not in document["hosts"][h.name]["vars"] for h in hosts)
    assert set(document["groups"]) == {"lab", "hgx-h100", "l40s"}
