"""The lab's stand-in container runtime hook, runtime and nested image: what `docker run --gpus` on a lab host runs.

The hook is run here as runc runs it (OCI state on stdin, the bundle's config.json naming the root file system),
against a lab host's files under a temporary root; what it leaves in the container's root file system is then run
as the container would run it. Writing into a root file system needs chroot (root), as on a lab host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.lab import NVLINK_H100, make_root

from gpuprov.lab import standins
from gpuprov.lab.nested import SCRIPT
from gpuprov.lab.standins import PackageSpec, package_contents

HOOK = standins.FILES / "nvidia-container-runtime-hook"
RUNTIME = standins.FILES / "nvidia-container-runtime"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chroot into the container's root needs root")


@pytest.fixture
def host(tmp_path) -> Path:
    """A provisioned hgx-h100 lab host's files: driver 570.148.08 loaded, nvidia-smi installed."""
    root = make_root(tmp_path, "hgx-h100", "570.148.08", cuda="12.8", persistence=True, fabric=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_bytes((standins.FILES / "nvidia-smi").read_bytes())
    return root


def container(tmp_path: Path, env: list[str], name: str = "c1") -> tuple[Path, Path]:
    """A bundle (config.json as dockerd writes it for `--gpus`) and its empty root file system."""
    bundle = tmp_path / name
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                    "process": {"env": ["PATH=/usr/bin:/bin", *env]}}))
    return bundle, rootfs


def hook(host: Path, bundle: Path, *args: str) -> tuple[int, str]:
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 4242, "bundle": str(bundle)})
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(host)}
    proc = subprocess.run([sys.executable, str(HOOK), *(args or ("prestart",))], input=state, capture_output=True,
                          text=True, env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def in_container(rootfs: Path, *args: str) -> tuple[int, str]:
    """The container's nvidia-smi as the container runs it (its root: the container's root file system)."""
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(rootfs)}
    proc = subprocess.run([sys.executable, str(rootfs / "usr/bin/nvidia-smi"), *args], capture_output=True,
                          text=True, env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def host_smi(host: Path, *args: str) -> str:
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(host)}
    return subprocess.run([sys.executable, str(host / "usr/bin/nvidia-smi"), *args], capture_output=True,
                          text=True, env=env, check=True).stdout


@pytest.mark.root
@needs_root
def test_gpus_all_shows_the_hosts_gpus_in_the_container(host, tmp_path):
    bundle, rootfs = container(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    assert hook(host, bundle) == (0, "")
    assert (rootfs / "usr/bin/nvidia-smi").stat().st_mode & 0o777 == 0o755
    rc, out = in_container(rootfs, "-L")
    assert rc == 0 and out == host_smi(host, "-L")  # same GPUs, same UUIDs
    fields = "--query-gpu=index,name,pci.bus_id,driver_version,persistence_mode,fabric.state"
    assert in_container(rootfs, fields, "--format=csv")[1] == host_smi(host, fields, "--format=csv")
    assert in_container(rootfs, "nvlink", "-s")[1].splitlines()[1:19] == NVLINK_H100.read_text().splitlines()[1:]


@pytest.mark.root
@needs_root
def test_a_device_list_gives_the_container_those_gpus_renumbered(host, tmp_path):
    uuids = [line.rsplit("UUID: ", 1)[1].rstrip(")") for line in host_smi(host, "-L").splitlines()]
    bundle, rootfs = container(tmp_path, [f"NVIDIA_VISIBLE_DEVICES=5,{uuids[2]}"])
    assert hook(host, bundle)[0] == 0
    rc, out = in_container(rootfs, "--query-gpu=index,uuid", "--format=csv,noheader")
    assert out.splitlines() == [f"0, {uuids[2]}", f"1, {uuids[5]}"]


@pytest.mark.root
@needs_root
def test_container_sees_no_host_processes_but_the_hosts_faults(host, tmp_path):
    (host / "etc/gpuprov-lab/faults").write_text("gpu-process\nthrottle 1\n")
    bundle, rootfs = container(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    assert hook(host, bundle)[0] == 0
    apps = in_container(rootfs, "--query-compute-apps=pid", "--format=csv,noheader")
    assert apps == (0, "") and "4242" in host_smi(host, "--query-compute-apps=pid", "--format=csv,noheader")
    out = in_container(rootfs, "--query-gpu=clocks_event_reasons.hw_slowdown", "--format=csv,noheader")[1]
    assert out.splitlines()[:2] == ["Not Active", "Active"]
    # a fault cleared on the host is gone from the next container too
    (host / "etc/gpuprov-lab/faults").unlink()
    bundle, rootfs = container(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"], "c2")
    assert hook(host, bundle)[0] == 0 and not (rootfs / "etc/gpuprov-lab/faults").exists()


def test_a_container_without_gpus_is_left_alone(host, tmp_path):
    for env in ([], ["NVIDIA_VISIBLE_DEVICES=void"], ["NVIDIA_VISIBLE_DEVICES="]):
        bundle, rootfs = container(tmp_path, env, f"c{len(env)}{env[0][-1:] if env else ''}")
        assert hook(host, bundle) == (0, "")
        assert list(rootfs.iterdir()) == []


# The hook fails as nvidia-container-cli does (runc shows the hook's stderr in docker's error).
@pytest.mark.parametrize("breakage,message", [
    ("mismatch", "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch"),
    ("fault", "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch"),
    ("unloaded", "nvidia-container-cli: initialization error: nvml error: driver not loaded"),
    ("no-driver", "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: cannot "
                  "open shared object file: no such file or directory"),
    ("unknown-device", "nvidia-container-cli: device error: 8: unknown device"),
])
def test_the_hook_fails_as_nvidia_container_cli(host, tmp_path, breakage, message):
    env = ["NVIDIA_VISIBLE_DEVICES=8" if breakage == "unknown-device" else "NVIDIA_VISIBLE_DEVICES=all"]
    if breakage == "mismatch":
        (host / "run/gpuprov-lab/loaded-driver").write_text("565.57.01\n")
    elif breakage == "fault":
        (host / "etc/gpuprov-lab/faults").write_text("driver-mismatch\n")
    elif breakage == "unloaded":
        (host / "run/gpuprov-lab/loaded-driver").unlink()
    elif breakage == "no-driver":
        (host / "usr/lib/gpuprov-lab/driver-version").unlink()
    bundle, rootfs = container(tmp_path, env)
    assert hook(host, bundle) == (1, f"Auto-detected mode as 'legacy'\n{message}\n")
    assert list(rootfs.iterdir()) == []


@pytest.mark.root
@needs_root
def test_gpu_missing_on_the_host_is_missing_in_the_container(host, tmp_path):
    (host / "etc/gpuprov-lab/faults").write_text("gpu-missing\n")
    bundle, rootfs = container(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    assert hook(host, bundle)[0] == 0
    assert in_container(rootfs, "-L")[1].count("GPU ") == 7
    bundle, rootfs = container(tmp_path, ["NVIDIA_VISIBLE_DEVICES=7"], "c2")
    assert hook(host, bundle)[0] == 1


@pytest.mark.root
@needs_root
def test_the_hook_writes_through_the_images_own_symlinks(host, tmp_path):
    """A merged-/usr image: /bin -> usr/bin. An absolute symlink in the image must not lead outside it."""
    bundle, rootfs = container(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "bin").symlink_to("usr/bin")
    outside = tmp_path / "outside"
    outside.mkdir()
    (rootfs / "etc").symlink_to(str(outside))  # absolute: means <rootfs>/<outside> inside the container
    (rootfs / str(outside).lstrip("/")).mkdir(parents=True)
    assert hook(host, bundle)[0] == 0
    assert (rootfs / "usr/bin/nvidia-smi").is_file() and list(outside.iterdir()) == []
    assert (rootfs / str(outside).lstrip("/") / "gpuprov-lab/visible-devices").is_file()


def test_hook_version_and_unknown_commands(host, tmp_path):
    text = package_contents(PackageSpec("nvidia-container-toolkit", "1.17.8-1", "container_toolkit", "1.17.8"),
                            {}).files["usr/bin/nvidia-container-runtime-hook"]
    assert text[1] == 0o755 and b'VERSION = "1.17.8"' in text[0]
    bundle, _ = container(tmp_path, [])
    assert hook(host, bundle, "poststop")[0] == 0
    rc, out = hook(host, bundle, "frobnicate")
    assert rc == 2 and "not simulated" in out


# ------------------------------------------------------------------------------------ nvidia runtime (shim)

def test_the_nvidia_runtime_adds_the_hook_and_runs_runc(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "runc-args"
    (bin_dir / "runc").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\n")
    (bin_dir / "nvidia-container-runtime-hook").write_text("#!/bin/sh\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def runtime(bundle: Path) -> dict:
        args = ["--root", "/var/run/docker/runtime-runc/moby", "--log-format", "json", "create", "--bundle",
                str(bundle), "--pid-file", "/run/x.pid", "c1"]
        proc = subprocess.run([sys.executable, str(RUNTIME), *args], env=env, capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        assert record.read_text().splitlines() == args  # runc got exactly the same arguments
        return json.loads((bundle / "config.json").read_text())

    bundle, _ = container(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    hooks = runtime(bundle)["hooks"]["prestart"]
    assert hooks == [{"path": str(bin_dir / "nvidia-container-runtime-hook"),
                      "args": ["nvidia-container-runtime-hook", "prestart"], "env": [f"PATH={env['PATH']}"]}]
    assert runtime(bundle)["hooks"]["prestart"] == hooks  # added once (`--gpus` adds it itself)
    plain, _ = container(tmp_path, [], "plain")
    assert "hooks" not in runtime(plain)


# ---------------------------------------------------------------------------------------------- nested image

@pytest.mark.root
@needs_root
def test_nested_image_is_the_hosts_python_and_is_deterministic(tmp_path):
    """The image script, run here with a stand-in `docker` that keeps what it imports: a root file system in which
    the hook's nvidia-smi runs (checked with chroot), and the same tag for the same files."""
    if not Path("/usr/bin/python3").exists() or not Path("/usr/bin/dash").exists():
        pytest.skip("needs a Debian-like /usr/bin/python3 and /usr/bin/dash, as lab hosts have")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    imported = tmp_path / "imported"
    imported.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n[ \"$1\" = image ] && exit 1\n"
                      f"[ \"$1\" = import ] && {{ eval last=\\${{$#}}; for a; do :; done; "
                      f"cp \"$6\" {imported}/\"$(echo $last | tr / _)\".tar; printf '%s\\n' \"$@\" > {imported}/args; "
                      "exit 0; }\nexit 2\n")
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def make() -> str:
        proc = subprocess.run(["/usr/bin/python3", "-c", SCRIPT, "gpuprov-lab/python"], env=env,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    tag = make()
    assert tag.startswith("gpuprov-lab/python:") and make() == tag
    args = (imported / "args").read_text().splitlines()
    assert args[:5] == ["import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "--change", 'CMD ["/usr/bin/python3"]'] and args[-1] == tag
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    subprocess.run(["tar", "-xf", str(imported / (tag.replace("/", "_") + ".tar")), "-C", str(rootfs)], check=True)
    assert os.readlink(rootfs / "bin") == "usr/bin" and (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777
    host = make_root(tmp_path, "l40s", "595.80")
    (host / "usr/bin").mkdir(parents=True)
    (host / "usr/bin/nvidia-smi").write_bytes((standins.FILES / "nvidia-smi").read_bytes())
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"root": {"path": str(rootfs)},
                                                    "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}))
    assert hook(host, bundle)[0] == 0
    chroot = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin")
    proc = subprocess.run([chroot, str(rootfs), "/bin/sh", "-c", "nvidia-smi -L"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == host_smi(host, "-L") and proc.stdout.count("NVIDIA L40S") == 4
