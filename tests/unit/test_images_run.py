"""images.run's pieces without hosts: the docker run words (judged by a real shell), the driver check and its
words, the inventory variables it reads, the command after `--`, and the task's bad input (exit 2 before any
host). The locked images of stack.lock and what stack.check says of them. Hosts and a registry: the lab test."""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st
from invoke import Config, Context
from invoke.exceptions import Exit

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.images.run import (
    RunVars,
    check_container,
    check_driver,
    docker_run_argv,
    has_rdma,
    run_vars,
    shell_line,
)
from gpuprov.inventory import InventoryError, load_inventory
from gpuprov.stack.check import image_mismatches
from gpuprov.stack.lock import load_lock, locked_images, write_lock
from gpuprov.tasks import images as image_tasks

DIGEST = "sha256:" + "ab" * 32
FACTS_570 = {"loaded_driver_version": "570.211.01", "nvidia_smi": {"driver_version": "570.211.01", "gpus": [{}]}}


def host_with(tmp_path, variables: str):
    path = tmp_path / "inventory.yaml"
    head = "defaults: {user: root}\ngroups:\n  hgx:\n    vars:\n"
    tail = "hosts:\n  gpu01: {address: 192.0.2.11, groups: [hgx]}\n"
    path.write_text(head + textwrap.indent(variables, " " * 6) + tail)
    return load_inventory(path).select(hosts=["gpu01"], groups=[], all_=False)[0]


# ---------------------------------------------------------------------------------------------- docker run

def test_a_gpu_job_gets_every_gpu_the_hosts_ipc_the_ulimits_and_the_mounts():
    argv = docker_run_argv("10.0.0.5:5000/ngc:25.01", container="job", gpus=True, detach=False,
                           settings=RunVars(data_dir="/data", output_dir="/srv/out"),
                           command=["python", "train.py", "--lr", "1e-3"])
    assert argv == ["docker", "run", "--rm", "--name", "job", "--gpus", "all", "--ipc=host", "--ulimit", "memlock=-1",
                    "--ulimit", "stack=67108864", "-v", "/data:/data", "-v", "/srv/out:/srv/out",
                    "10.0.0.5:5000/ngc:25.01", "python", "train.py", "--lr", "1e-3"]


def test_a_sized_shm_a_memlock_limit_detached_and_no_gpus():
    argv = docker_run_argv("r/x:1", container="job", gpus=False, detach=True,
                           settings=RunVars(shm_size="64g", memlock=8388608), command=[])
    assert argv == ["docker", "run", "--detach", "--name", "job", "--shm-size=64g", "--ulimit", "memlock=8388608",
                    "--ulimit", "stack=67108864", "r/x:1"]


def test_a_host_with_rdma_devices_gives_them_and_ipc_lock_to_the_container():
    # Docker's run reference: --device adds a host device, --cap-add=IPC_LOCK lets the job lock (register) the memory
    # RDMA reads and writes; NVIDIA's NCCL and MOFED container guides pass /dev/infiniband and IPC_LOCK
    argv = docker_run_argv("r/x:1", container="job", gpus=True, detach=False, settings=RunVars(), command=[],
                           rdma=True)
    assert argv == ["docker", "run", "--rm", "--name", "job", "--gpus", "all", "--device=/dev/infiniband",
                    "--cap-add=IPC_LOCK", "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
                    "r/x:1"]


def test_memlock_null_keeps_the_engines_own_limit(tmp_path):
    settings = run_vars(host_with(tmp_path, "images: {memlock: null}\n"))
    assert settings.memlock is None
    argv = docker_run_argv("r/x:1", container="job", gpus=False, detach=False, settings=settings, command=[])
    assert argv == ["docker", "run", "--rm", "--name", "job", "--ipc=host", "--ulimit", "stack=67108864", "r/x:1"]


def test_the_lab_inventory_carries_what_lab_hosts_need_for_images_run(tmp_path):
    # lab hosts are containers without CAP_SYS_RESOURCE: their engine cannot grant `--ulimit memlock=-1` (the lab
    # test shows runc's "error setting rlimit type 8"), so the lab's own inventory keeps the engine's limit
    from gpuprov.lab.state import LabHost, LabPaths, render_inventory

    paths = LabPaths(tmp_path)
    paths.key.parent.mkdir(parents=True)
    paths.key.write_text("key")
    paths.inventory.parent.mkdir(parents=True, exist_ok=True)
    paths.inventory.write_text(render_inventory([LabHost("gpuprov-lab-01", "hgx-h100", 42201, "172.20.0.2", "c1",
                                                         {"gpu": "H100-SXM", "count": 8})], paths))
    [host] = load_inventory(paths.inventory).select(hosts=["gpuprov-lab-01"], groups=[], all_=False)
    settings = run_vars(host)
    assert settings.memlock is None
    assert "memlock" not in " ".join(docker_run_argv("r/x:1", container="job", gpus=True, detach=False,
                                                     settings=settings, command=[]))


class Listing:
    """A connection whose `ls` of /dev/infiniband prints what a host has."""

    def __init__(self, rc: int, stdout: str):
        self.rc, self.stdout, self.commands = rc, stdout, []

    def run(self, command, **kwargs):
        self.commands.append(command)
        return type("Result", (), {"rc": self.rc, "stdout": self.stdout, "stderr": ""})()


@pytest.mark.parametrize(("rc", "stdout", "expected"), [
    (0, "rdma_cm\numad0\nuverbs0\nissm0\n", True),     # a ConnectX port: rdma-core's device files
    (0, "rdma_cm\n", False),                           # the RDMA CM without a verbs device
    (2, "", False),                                     # no /dev/infiniband
])
def test_rdma_devices_are_what_the_host_lists_under_dev_infiniband(rc, stdout, expected):
    conn = Listing(rc, stdout)
    assert has_rdma(conn) is expected
    assert conn.commands == ["ls -A /dev/infiniband 2>/dev/null"]


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))),
                max_size=6))
def test_every_word_reaches_the_command_as_it_was_given(words):
    # /bin/sh is the judge: it splits the line back into the words
    script = f"set -- {shell_line(words)}; for w in \"$@\"; do printf '%s\\0' \"$w\"; done"
    done = subprocess.run(["sh", "-c", script], capture_output=True, check=True)
    assert done.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1] == words


# ---------------------------------------------------------------------------------------------- driver

def test_a_driver_older_than_the_images_minimum_is_refused_naming_both():
    with pytest.raises(GpuprovError) as caught:
        check_driver("gpu01", "10.0.0.5:5000/cuda-pytorch-train:2.8.0-cu129-train", FACTS_570, "575.57.08", False)
    assert str(caught.value).splitlines()[0] == (
        "[gpu01] images.run: refused before pulling 10.0.0.5:5000/cuda-pytorch-train:2.8.0-cu129-train: the host's "
        "driver 570.211.01 is older than 575.57.08, the image's io.gpuprov.min-driver")


def test_a_host_without_a_driver_is_refused_for_an_image_with_a_minimum():
    with pytest.raises(GpuprovError) as caught:
        check_driver("gpu01", "r/x:1", {"loaded_driver_version": None, "nvidia_smi": None}, "570.86.10", False)
    assert caught.value.message == ("refused before pulling r/x:1: the host has no NVIDIA driver loaded; the image "
                                    "needs 570.86.10 or newer (io.gpuprov.min-driver)")


def test_forward_compatibility_runs_it_with_a_note_and_a_new_enough_driver_without_one():
    assert check_driver("gpu01", "r/x:1", FACTS_570, "575.57.08", True) == (
        "driver 570.211.01 is older than 575.57.08 (io.gpuprov.min-driver of r/x:1); the host's stack uses CUDA "
        "forward compatibility")
    assert check_driver("gpu01", "r/x:1", FACTS_570, "570.86.10", False) is None   # 211 > 86, numerically
    assert check_driver("gpu01", "r/x:1", FACTS_570, "570.211.01", False) is None
    assert check_driver("gpu01", "r/x:1", {}, None, False) is None                 # a CPU image has no minimum


# ---------------------------------------------------------------------------------------------- variables

def test_the_hosts_images_variables_and_data_dir_are_read(tmp_path):
    assert run_vars(host_with(tmp_path, "data_dir: /data/\nimages: {registry: '10.0.0.5:5000', shm_size: 64g, "
                                            "output_dir: /srv/out, memlock: 8388608}\n")) == RunVars(
        registry="10.0.0.5:5000", data_dir="/data", output_dir="/srv/out", shm_size="64g", memlock=8388608)


@pytest.mark.parametrize(("variables", "marker", "message"), [
    ("images: [x]\n", "[x]", "images: images must be a mapping, not a list"),
    ("images: {shm: 1g}\n", "shm", "images.shm: unknown images key 'shm'; expected one of: registry, output_dir, "
                                   "shm_size, memlock"),
    ("images: {registry: 'http://r:5000'}\n", "'http", "images.registry: must be a registry address like "
                                                       "host:5000, not 'http://r:5000'"),
    ("images: {registry: '10.0.0.5:70000'}\n", "'10", "images.registry: must be a registry address like "
                                                      "host:5000, not '10.0.0.5:70000'"),
    ("images: {shm_size: 64GB}\n", "64GB", "images.shm_size: must be a size like 64g (digits, then b, k, m or g), "
                                           "not '64GB'"),
    ("images: {memlock: 0}\n", "0", "images.memlock: must be a number of bytes, -1 for unlimited, or null for "
                                    "the engine's own limit, not 0"),
    ("images: {output_dir: out}\n", " out", "images.output_dir: must be an absolute path other than / (letters, "
                                           "digits, _ . + @ / -), not 'out'"),
    ("data_dir: '/data/../etc'\n", "'/data", "data_dir: must be an absolute path other than / (letters, digits, "
                                             "_ . + @ / -), not '/data/../etc'"),
])
def test_bad_variables_are_refused_at_load_where_they_are_written(tmp_path, variables, marker, message):
    with pytest.raises(InventoryError) as caught:
        host_with(tmp_path, variables)
    path = tmp_path / "inventory.yaml"
    col = 7 + variables.index(marker) + marker.startswith(" ")
    assert caught.value.errors == [f"{path}:5:{col}: groups.hgx.vars.{message}"]


# ---------------------------------------------------------------------------------------------- the task

def test_the_command_is_every_word_after_the_first_double_dash():
    argv = ["invoke", "images.run", "--host", "gpu01", "--name", "x", "--", "python", "-c", "print('a b')", "--",
            "--lr"]
    assert image_tasks.remainder(argv) == ["python", "-c", "print('a b')", "--", "--lr"]
    assert image_tasks.remainder(["invoke", "images.run"]) == []


@pytest.fixture
def ctx(tmp_path) -> Context:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("defaults: {user: root}\nhosts:\n  gpu01: {address: 192.0.2.11}\n")
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "locks": str(tmp_path / "locks"), "reports": str(tmp_path / "reports"),
        "known_hosts": str(tmp_path / "known_hosts"), "connect_timeout": 1, "connect_retries": 0}}))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"host": ["gpu01"]}, "error: images.run: --name is required: the image to run (invoke images.list shows them)"),
    ({"host": ["gpu01"], "name": "cuda-pytorch-train"},
     "error: images.run: --name cuda-pytorch-train selects 2 images: name one of cuda-pytorch-train-2.8.0-cu128, "
     "cuda-pytorch-train-2.8.0-cu129"),
    ({"host": ["gpu01"], "name": "lab-pytorch-cpu"},
     "error: images.run: no registry for gpu01: give --registry, or set the hosts' images.registry"),
    ({"host": ["gpu01"], "name": "lab-pytorch-cpu", "registry": "10.0.0.5:5000", "container": "-x"},
     "error: images.run: --container must be a container name (letters, digits, _ . -), not '-x'"),
    ({"host": ["gpu01"], "name": "lab-pytorch-cpu", "registry": "http://10.0.0.5"},
     "error: images: --registry must be a registry host with an optional port and path, such as 127.0.0.1:5000 or "
     "registry.example.com/team, not 'http://10.0.0.5'"),
])
def test_bad_input_is_exit_2_before_any_host(ctx, capsys, kwargs, message):
    with pytest.raises(Exit) as caught:
        image_tasks.run(ctx, **kwargs)
    assert caught.value.code == 2 and capsys.readouterr().err.splitlines()[0] == message


def test_an_unreachable_host_is_its_failure_exit_1(ctx, capsys):
    with pytest.raises(Exit) as caught:
        image_tasks.run(ctx, host=["gpu01"], name="lab-pytorch-cpu", registry="10.0.0.5:5000", trust_new_hosts=True)
    assert caught.value.code == 1
    first, second, *table = capsys.readouterr().out.splitlines()   # each line of the error on its own line
    assert first.startswith("[gpu01] connect: cannot reach 192.0.2.11:22 after 1 attempts: ")
    assert second == "  next: check that gpu01 is up, its address and port"
    assert table[-1].startswith(f"report: {ctx.config.gpuprov.reports}/images-run-")


def test_container_names_docker_accepts():
    check_container("gpuprov-job_1.a")
    check_container(None)
    with pytest.raises(InputError):
        check_container("a b")


# ---------------------------------------------------------------------------------------------- locks

def stack_dict():
    from gpuprov.stack.resolve import resolve

    return resolve("H100-SXM", "ubuntu-22.04", gpus=8, nvswitch=True, driver="570").to_dict()


def test_a_lock_records_images_by_digest_and_reads_them_back(tmp_path):
    image = {"name": "cuda-pytorch-train-2.8.0-cu129", "tag": "2.8.0-cu129-train", "digest": DIGEST,
             "min_driver": "575.57.08"}
    path = write_lock(tmp_path / "hgx.lock.yaml", stack_dict(), {"group": "hgx"}, [image])
    assert load_lock(path)["images"] == [image]
    plain = write_lock(tmp_path / "plain.lock.yaml", stack_dict(), {})
    assert "images" not in plain.read_text() and load_lock(plain)["images"] == []


@pytest.mark.parametrize(("entry", "place", "message"), [
    ({"digest": "sha256:xyz"}, "images[0].digest", "bad digest 'sha256:xyz': expected sha256: and 64 hex digits"),
    ({"min_driver": "new"}, "images[0].min_driver", "bad version 'new': expected digits and dots like \"570.148.08\""),
    ({"tag": None}, "images[0].tag", "must be a non-empty string, not empty (null)"),
])
def test_a_bad_image_entry_names_its_place(tmp_path, entry, place, message):
    image = {"name": "x", "tag": "1-cpu-train", "digest": DIGEST, "min_driver": None, **entry}
    path = write_lock(tmp_path / "hgx.lock.yaml", stack_dict(), {}, [image])
    with pytest.raises(InputError) as caught:
        load_lock(path)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.lstrip("- ").startswith(
        place.rsplit(".", 1)[1] + ":"))
    assert caught.value.message.startswith(f"{path}:{line}:")
    assert caught.value.message.endswith(f": {place}: {message}")


def test_locked_images_per_host(tmp_path):
    image = {"name": "x", "tag": "1-cpu-train", "digest": DIGEST, "min_driver": None}
    write_lock(tmp_path / "hgx.lock.yaml", stack_dict(), {}, [image])
    host = host_with(tmp_path, "{}\n")
    assert locked_images([host], tmp_path) == {"gpu01": [image]}


def test_stack_check_reports_a_locked_image_the_driver_no_longer_runs():
    images = [{"name": "cuda-pytorch-train-2.8.0-cu129", "tag": "2.8.0-cu129-train", "digest": DIGEST,
               "min_driver": "575.57.08"},
              {"name": "lab-pytorch-cpu", "tag": "2.13.0-cpu-train", "digest": DIGEST, "min_driver": None}]
    [mismatch] = image_mismatches(FACTS_570, images, forward_compat=False)
    assert mismatch.to_dict() == {
        "what": f"locked image cuda-pytorch-train-2.8.0-cu129:2.8.0-cu129-train ({DIGEST})",
        "expected": "driver 575.57.08 or newer (io.gpuprov.min-driver)", "found": "driver 570.211.01",
        "remedy": "install a driver of at least 575.57.08 (invoke provision --update-lock after raising stack.driver), "
                  "or lock an image built for an older CUDA (invoke stack.lock --image)"}
    assert image_mismatches(FACTS_570, images, forward_compat=True) == []
    assert image_mismatches({"loaded_driver_version": "575.57.08"}, images, forward_compat=False) == []
