"""Lab mirror: stand-in package set, control files, simulated tools, and the signed flat repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.errors import GpuprovError
from gpuprov.facts.parsers import parse_nvidia_smi
from gpuprov.lab import standins
from gpuprov.lab.standins import (
    PackageSpec,
    control_text,
    driver_cuda_version,
    gpu_profiles_table,
    lab_stacks,
    package_contents,
    standin_packages,
)

KERNEL = "6.1.0-18-amd64"


def _stack(branch: str, version: str, *, pinning: bool = False, fabric: bool = True, cuda: str = "12.8.1",
           nccl: str = "2.26.2") -> dict:
    driver_pkgs = ([{"name": f"nvidia-driver-pinning-{branch}", "version": f"{version}-1"},
                    {"name": "nvidia-open", "version": f"{version}-1"}] if pinning
                   else [{"name": f"nvidia-open-{branch}", "version": f"{version}-1"}])
    dash = "-".join(cuda.split(".")[:2])
    return {
        "gpu": {"model": "H100-SXM"}, "os": "debian-12",
        "driver": {"branch": branch, "version": version, "kernel_modules": "open", "packages": driver_pkgs},
        "cuda": {"version": cuda, "packages": [{"name": f"cuda-toolkit-{dash}", "version": f"{cuda}-1"}]},
        "forward_compat": False,
        "nccl": {"version": nccl, "packages": [{"name": "libnccl2", "version": f"{nccl}-1+cuda12.8"},
                                               {"name": "libnccl-dev", "version": f"{nccl}-1+cuda12.8"}]},
        "container_toolkit": {"version": "1.17.8", "packages": [
            {"name": "nvidia-container-toolkit", "version": "1.17.8-1"},
            {"name": "nvidia-container-toolkit-base", "version": "1.17.8-1"}]},
        "fabricmanager": ({"version": version, "packages": [
            {"name": f"nvidia-fabricmanager-{branch}" if not pinning else "nvidia-fabricmanager",
             "version": f"{version}-1"}]} if fabric else None),
        "dcgm": {"version": "4.2.3", "packages": [{"name": "datacenter-gpu-manager-4-core", "version": "1:4.2.3-1"}]},
        "ngc_pytorch": None, "pytorch": None,
    }


# ------------------------------------------------------------------------------------------ package set

def test_package_set_deduplicates_and_adds_kernel_headers():
    stacks = [_stack("570", "570.148.08"), _stack("570", "570.148.08", fabric=False),
              _stack("595", "595.58.03", pinning=True, cuda="13.2.1", nccl="2.30.4")]
    specs = standin_packages(stacks, KERNEL)
    keys = [(s.name, s.version) for s in specs]
    assert len(keys) == len(set(keys))
    by_key = {(s.name, s.version): s for s in specs}
    assert by_key[("nvidia-open-570", "570.148.08-1")].role == "driver"
    assert by_key[("nvidia-open-570", "570.148.08-1")].upstream == "570.148.08"
    assert by_key[("nvidia-driver-pinning-595", "595.58.03-1")].role == "driver_pinning"
    assert by_key[("nvidia-open", "595.58.03-1")].role == "driver"
    assert by_key[("nvidia-fabricmanager", "595.58.03-1")].role == "fabricmanager"
    assert by_key[("libnccl2", "2.30.4-1+cuda12.8")].upstream == "2.30.4"
    assert by_key[("datacenter-gpu-manager-4-core", "1:4.2.3-1")].upstream == "4.2.3"
    assert ("libnccl2", "2.26.2-1+cuda12.8") in by_key
    headers = by_key[(f"linux-headers-{KERNEL}", "6.1.0-0gpuprovlab1")]
    assert headers.role == "kernel_headers" and headers.upstream == KERNEL


def test_cuda_compat_gets_its_own_role_and_driver_version():
    stack = _stack("535", "535.274.02")
    stack["cuda"]["packages"].append({"name": "cuda-compat-12-8", "version": "570.124.06-1"})
    compat = next(s for s in standin_packages([stack], KERNEL) if s.name == "cuda-compat-12-8")
    assert compat.role == "cuda_compat" and compat.upstream == "570.124.06"
    files = package_contents(compat, {})
    assert "usr/local/cuda-12.8/compat/libcuda.so.570.124.06" in files.files
    assert files.links["usr/local/cuda-12.8/compat/libcuda.so.1"] == "libcuda.so.570.124.06"


@pytest.mark.parametrize("name,version", [("Bad_Name", "1.0-1"), ("nvidia-open-570", "not a version"),
                                          ("nvidia-open-570", "1.0; rm -rf /")])
def test_invalid_package_in_stack_is_refused(name, version):
    stack = _stack("570", "570.148.08")
    stack["driver"]["packages"] = [{"name": name, "version": version}]
    with pytest.raises(GpuprovError, match="not a valid Debian name/version"):
        standin_packages([stack], KERNEL)


def test_kernel_without_version_is_refused():
    with pytest.raises(GpuprovError, match="kernel release"):
        standin_packages([], "custom_Kernel")


def test_lab_stacks_cover_every_profile_with_newest_and_two_older_branches():
    from gpuprov.catalog import lookup
    from gpuprov.lab.profiles import load_profiles

    profiles = load_profiles()
    stacks = lab_stacks(profiles)
    assert {s["os"] for s in stacks} == {"debian-12"}
    for profile in profiles.values():
        mine = [s for s in stacks if s["gpu"]["model"] == lookup(profile.hardware["gpu"]).key]
        branches = [int(s["driver"]["branch"]) for s in mine]
        assert len(mine) == 3 and branches[0] == max(branches) and len(set(branches)) == 3
        assert all((s["fabricmanager"] is not None) == profile.hardware["nvswitch"] for s in mine)


# ------------------------------------------------------------------------------------- control, contents

@given(epoch=st.integers(min_value=0, max_value=9), upstream=st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}",
                                                                            fullmatch=True))
def test_control_keeps_exact_version_and_never_depends(epoch, upstream):
    version = (f"{epoch}:" if epoch else "") + upstream + "-1"
    spec = PackageSpec("datacenter-gpu-manager-4-core", version, "dcgm", upstream)
    text = control_text(spec, "amd64", 3)
    fields = dict(line.split(": ", 1) for line in text.splitlines() if not line.startswith(" "))
    assert fields["Version"] == version
    assert fields["Maintainer"] == "gpuprov lab <lab@gpuprov.invalid>"
    assert fields["Description"] == "gpuprov lab stand-in, not NVIDIA software"
    assert "Depends" not in fields and "Pre-Depends" not in fields


def test_driver_branches_replace_each_other():
    text = control_text(PackageSpec("nvidia-open-570", "570.148.08-1", "driver", "570.148.08"), "amd64", 10)
    for field in ("Provides", "Conflicts", "Replaces"):
        assert f"{field}: gpuprov-lab-nvidia-driver\n" in text
    assert "Conflicts" not in control_text(PackageSpec("libnccl2", "2.26.2-1+cuda12.8", "nccl", "2.26.2"),
                                           "amd64", 1)


def test_driver_package_carries_smi_version_and_units_but_pinning_meta_does_not():
    driver = package_contents(PackageSpec("nvidia-open-570", "570.148.08-1", "driver", "570.148.08"), {})
    assert driver.files["usr/lib/gpuprov-lab/driver-version"][0] == b"570.148.08\n"
    assert driver.files["usr/lib/gpuprov-lab/driver-cuda-version"][0] == b"12.8\n"
    assert driver.files["usr/bin/nvidia-smi"][1] == 0o755
    assert "lib/systemd/system/nvidia-persistenced.service" in driver.files
    assert "lib/systemd/system/gpuprov-lab-nvidia-module.service" in driver.files
    assert "loaded-driver" in driver.scripts["postinst"]
    pinning = package_contents(PackageSpec("nvidia-driver-pinning-595", "595.58.03-1", "driver_pinning",
                                           "595.58.03"), {})
    assert not any("driver-version" in path or "nvidia-smi" in path for path in pinning.files)


def test_other_roles_install_their_real_file_names():
    def files(name, version, role, upstream):
        return package_contents(PackageSpec(name, version, role, upstream), {})

    fm = files("nvidia-fabricmanager-570", "570.148.08-1", "fabricmanager", "570.148.08")
    assert {"usr/bin/nv-fabricmanager", "lib/systemd/system/nvidia-fabricmanager.service"} <= set(fm.files)
    assert b'VERSION="570.148.08"' in fm.files["usr/bin/nv-fabricmanager"][0]
    ctk = files("nvidia-container-toolkit-base", "1.17.8-1", "container_toolkit", "1.17.8")
    assert {"usr/bin/nvidia-ctk", "usr/bin/nvidia-container-runtime"} <= set(ctk.files)
    dcgm = files("datacenter-gpu-manager-4-core", "1:4.2.3-1", "dcgm", "4.2.3")
    assert {"usr/bin/dcgmi", "lib/systemd/system/nvidia-dcgm.service"} <= set(dcgm.files)
    cuda = files("cuda-toolkit-12-8", "12.8.1-1", "cuda", "12.8.1")
    assert json.loads(cuda.files["usr/local/cuda-12.8/version.json"][0])["cuda"]["version"] == "12.8.1"
    nccl = files("libnccl2", "2.26.5-1+cuda12.9", "nccl", "2.26.5")
    assert "usr/lib/x86_64-linux-gnu/libnccl.so.2.26.5" in nccl.files
    headers = files(f"linux-headers-{KERNEL}", "6.1.0-0gpuprovlab1", "kernel_headers", KERNEL)
    assert headers.links[f"lib/modules/{KERNEL}/build"] == f"/usr/src/linux-headers-{KERNEL}"


@pytest.mark.parametrize("driver,cuda", [("535.183.01", "12.2"), ("570.148.08", "12.8"), ("590.48.01", "13.1"),
                                         ("595.80", "13.2"), ("470.256.02", "N/A")])
def test_driver_cuda_version_matches_real_nvidia_smi(driver, cuda):
    assert driver_cuda_version(driver) == cuda


# ------------------------------------------------------------------------------------- simulated tools

@pytest.fixture
def standin_root(tmp_path):
    """A fake root with the hgx-h100 profile and a driver "installed" (not loaded yet)."""
    lib = tmp_path / "usr/lib/gpuprov-lab"
    lib.mkdir(parents=True)
    (lib / "driver-version").write_text("570.148.08\n")
    (lib / "driver-cuda-version").write_text("12.8\n")
    (lib / "gpu-profiles.json").write_text(json.dumps(gpu_profiles_table()))
    (tmp_path / "etc/gpuprov-lab").mkdir(parents=True)
    (tmp_path / "etc/gpuprov-lab/profile").write_text("hgx-h100\n")
    (tmp_path / "etc/hostname").write_text("gpuprov-lab-01\n")
    (tmp_path / "run/gpuprov-lab").mkdir(parents=True)
    return tmp_path


def run_tool(root, tool: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(root)}
    proc = subprocess.run([sys.executable, str(standins.FILES / tool), *args], capture_output=True, text=True,
                          env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def load(root, version: str) -> None:
    (root / "run/gpuprov-lab/loaded-driver").write_text(version + "\n")


def test_smi_query_parses_into_the_profile_gpus(standin_root):
    load(standin_root, "570.148.08")
    rc, text = run_tool(standin_root, "nvidia-smi", "-q")
    assert rc == 0
    assert text.splitlines()[1] == "==============NVSMI LOG=============="
    smi = parse_nvidia_smi(text + "@@rc=0\n")
    assert smi["driver_version"] == "570.148.08" and smi["cuda_version"] == "12.8"
    assert [g["name"] for g in smi["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert smi["gpus"][0]["bus_id"] == "00000000:18:00.0"
    assert {g["memory_total_mib"] for g in smi["gpus"]} == {80 * 1024}
    assert all(g["ecc_mode"] is True and g["persistence_mode"] is False for g in smi["gpus"])
    assert len({g["uuid"] for g in smi["gpus"]}) == 8
    assert run_tool(standin_root, "nvidia-smi", "-q")[1].count("GPU-") == text.count("GPU-")
    assert parse_nvidia_smi(run_tool(standin_root, "nvidia-smi", "-q")[1])["gpus"][3]["uuid"] == smi["gpus"][3]["uuid"]


def test_smi_persistence_mode_follows_persistenced_and_pm(standin_root):
    load(standin_root, "570.148.08")
    rc, text = run_tool(standin_root, "nvidia-smi", "-pm", "1")
    assert rc == 0 and text.strip().endswith("All done.")
    assert all(g["persistence_mode"] for g in parse_nvidia_smi(run_tool(standin_root, "nvidia-smi", "-q")[1])["gpus"])


def test_smi_geforce_profile_has_no_ecc(standin_root):
    load(standin_root, "570.148.08")
    (standin_root / "etc/gpuprov-lab/profile").write_text("rtx-4090\n")
    smi = parse_nvidia_smi(run_tool(standin_root, "nvidia-smi", "-q")[1])
    assert [g["name"] for g in smi["gpus"]] == ["NVIDIA GeForce RTX 4090"] * 2
    assert {g["ecc_mode"] for g in smi["gpus"]} == {None}


def test_smi_version_mismatch_fails_like_the_real_one(standin_root):
    load(standin_root, "535.183.01")
    rc, text = run_tool(standin_root, "nvidia-smi", "-q")
    assert rc == 18
    assert text.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                 "NVML library version: 570.148"]
    assert "error" in parse_nvidia_smi(f"{text}@@rc={rc}\n")


def test_smi_without_loaded_module_or_gpus(standin_root):
    rc, text = run_tool(standin_root, "nvidia-smi")
    assert rc == 9 and "couldn't communicate with the NVIDIA driver" in text
    load(standin_root, "570.148.08")
    (standin_root / "etc/gpuprov-lab/profile").write_text("no-such-profile\n")
    assert run_tool(standin_root, "nvidia-smi", "-q") == (6, "No devices were found\n")


def test_smi_csv_table_and_list(standin_root):
    load(standin_root, "570.148.08")
    rc, text = run_tool(standin_root, "nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader,nounits")
    assert rc == 0 and text.splitlines() == ["NVIDIA H100 80GB HBM3, 570.148.08, 81920"] * 8
    rc, text = run_tool(standin_root, "nvidia-smi", "--query-gpu=name,bogus", "--format=csv")
    assert rc == 2 and 'Field "bogus" is not a valid field to query.' in text
    rc, text = run_tool(standin_root, "nvidia-smi")
    assert rc == 0 and "Driver Version: 570.148.08" in text and "CUDA Version: 12.8" in text
    assert run_tool(standin_root, "nvidia-smi", "-L")[1].count("NVIDIA H100 80GB HBM3 (UUID: GPU-") == 8


def test_ctk_configures_docker_keeping_other_keys(standin_root, tmp_path):
    ctk = package_contents(PackageSpec("nvidia-container-toolkit-base", "1.17.8-1", "container_toolkit",
                                       "1.17.8"), {}).files["usr/bin/nvidia-ctk"][0]
    tool = tmp_path / "nvidia-ctk"
    tool.write_bytes(ctk)
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(standin_root)}

    def ctk_run(*args):
        proc = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True, env=env,
                              check=False)
        return proc.returncode, proc.stdout + proc.stderr

    assert ctk_run("--version")[1].startswith("NVIDIA Container Toolkit CLI version 1.17.8\n")
    daemon = standin_root / "etc/docker/daemon.json"
    daemon.parent.mkdir(parents=True)
    daemon.write_text('{"log-driver": "json-file", "runtimes": {"other": {"path": "x"}}}')
    rc, out = ctk_run("runtime", "configure", "--runtime=docker")
    assert rc == 0 and "Wrote updated config to" in out
    assert json.loads(daemon.read_text()) == {
        "log-driver": "json-file",
        "runtimes": {"other": {"path": "x"}, "nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    daemon.write_text("{broken")
    rc, out = ctk_run("runtime", "configure", "--runtime=docker")
    assert rc == 1 and "unable to parse" in out and daemon.read_text() == "{broken"
    (standin_root / "etc/gpuprov-lab/devices.json").write_text(json.dumps(
        [{"vendor": "10de", "class": "0302"}] * 8 + [{"vendor": "10de", "class": "0680"}]))
    assert ctk_run("cdi", "generate", "--output=/etc/cdi/nvidia.yaml")[0] == 0
    spec = (standin_root / "etc/cdi/nvidia.yaml").read_text()
    assert "kind: nvidia.com/gpu" in spec and spec.count('- name: "') == 8
    assert ctk_run("system", "create-dev-char-symlinks", "--create-all")[0] == 0


# ------------------------------------------------------------------------------------------ repository

needs_tools = pytest.mark.skipif(not (shutil.which("dpkg-deb") and shutil.which("gpg")),
                                 reason="needs dpkg-deb and gpg (Debian)")


@needs_tools
def test_build_repo_signs_a_flat_repository(tmp_path):
    from gpuprov.lab.mirror import MirrorInfo, build_repo, mirror_vars
    from gpuprov.lab.state import LabPaths

    paths = LabPaths(tmp_path)
    repo = build_repo(paths, [_stack("570", "570.148.08")], kernel=KERNEL)
    assert len(repo.fingerprint) == 40 and repo.key_file == tmp_path / ".lab/mirror-key.asc"
    for name in ("Packages", "Packages.gz", "Release", "InRelease", "Release.gpg"):
        assert (repo.path / name).is_file()
    packages = (repo.path / "Packages").read_text()
    stanzas = [dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(" "))
               for block in packages.strip().split("\n\n")]
    assert {(s["Package"], s["Version"]) for s in stanzas} == {(p.name, p.version) for p in repo.packages}
    assert ("datacenter-gpu-manager-4-core", "1:4.2.3-1") in {(s["Package"], s["Version"]) for s in stanzas}
    for stanza in stanzas:
        assert (repo.path / stanza["Filename"]).stat().st_size == int(stanza["Size"])
    keyring = tmp_path / "keyring.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(repo.key_file)], check=True)
    verify = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo.path / "InRelease")],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stderr
    again = build_repo(paths, [_stack("570", "570.148.08")], kernel=KERNEL)
    assert again.path == repo.path and again.fingerprint == repo.fingerprint
    info_vars = mirror_vars(MirrorInfo("http://172.18.0.9/", repo.key_file, repo.fingerprint))
    assert info_vars == {"url": "http://172.18.0.9/", "key_file": str(repo.key_file),
                         "fingerprint": repo.fingerprint}


class _FakeContainers:
    def __init__(self, container):
        self.container = container

    def get(self, name):
        import docker.errors

        if self.container is None:
            raise docker.errors.NotFound(name)
        return self.container


class _FakeNetworks:
    def __init__(self, networks):
        self.networks = networks

    def list(self, names):
        return [n for n in self.networks if n.name in names]


def _fake(name="x", labels=None, attrs_labels=None):
    return type("Fake", (), {"name": name, "labels": labels or {}, "attrs": {"Labels": attrs_labels or {}}})()


def test_a_foreign_container_named_like_the_mirror_is_left_alone():
    from gpuprov.lab import mirror

    client = type("Client", (), {"containers": _FakeContainers(_fake("gpuprov-lab-mirror", {"other": "1"}))})()
    with pytest.raises(GpuprovError, match="exists but is not the lab's"):
        mirror._find(client)
    assert mirror._find(type("Client", (), {"containers": _FakeContainers(None)})()) is None


def test_mirror_needs_the_labs_own_network():
    from gpuprov.lab import mirror

    client = type("Client", (), {"networks": _FakeNetworks([_fake("gpuprov-lab-internal")])})()
    with pytest.raises(GpuprovError, match="is not the lab's"):
        mirror._network(client, "gpuprov-lab-internal")
    with pytest.raises(GpuprovError, match="does not exist"):
        mirror._network(client, "elsewhere")
    ours = _fake("gpuprov-lab-internal", attrs_labels={"gpuprov.lab": "1"})
    assert mirror._network(type("Client", (), {"networks": _FakeNetworks([ours])})(), ours.name) is ours
