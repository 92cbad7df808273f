"""The image matrix in the lab: the lab image built through the Docker SDK, its labels and the versions inside read
back, the smoke suite passing in it, a push to the lab registry (Debian's docker-registry in a lab container),
images.run on a provisioned lab host pulling it from there and starting a job with the flags PyTorch needs (read
back with `docker inspect` on the host), and images.run refused before any pull on a host whose driver is below
an image's minimum; stack.lock records the digest, stack.check reports a driver below a locked image's minimum.

The tests run in file order and share the module's registry and hosts. What is expected comes from outside
gpuprov: git, the docker CLI, torch inside the image, the registry's HTTP API, NVIDIA's driver tables."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from labutil import ROOT, copy_inventory, invoke, on_host

pytestmark = pytest.mark.lab
IMAGE = "lab-pytorch-cpu"
TAG = "2.13.0-cpu-train"
# NVIDIA's CUDA Toolkit release notes, Table 3: CUDA 12.9 Update 1 needs driver >= 575.57.08 on Linux
CU129 = "cuda-pytorch-train-2.8.0-cu129"
CU129_MIN_DRIVER = "575.57.08"
JOB = "gpuprov-lab-job"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("images-lab")
    return {"INVOKE_GPUPROV_LOCKS": str(folder / "locks"), "INVOKE_GPUPROV_REPORTS": str(folder / "reports")}


@pytest.fixture(scope="module")
def registry(lab):
    """The lab registry, trusted by every lab host's Docker (before Docker is installed there)."""
    from gpuprov.lab.registry import ensure_registry, trust_registry

    info = ensure_registry(paths=lab.paths, progress=print)
    trust_registry(lab.hosts, info.pull)
    return info


@pytest.fixture(scope="module")
def built(registry, env) -> dict:
    """`invoke images.build --name lab-pytorch-cpu --push --registry <lab registry>`: its JSON document."""
    started = time.monotonic()
    proc = invoke("images.build", "--name", IMAGE, "--push", "--registry", registry.push, "--json", env=env,
                  timeout=1800)
    print(f"images.build --push: {time.monotonic() - started:.1f} s")
    return json.loads(proc.stdout)["images"][0]


def docker_inspect(reference: str) -> dict:
    proc = subprocess.run(["docker", "image", "inspect", reference], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)[0]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_the_lab_image_is_built_with_its_labels(built):
    assert built["result"] == "built" and built.get("error") is None
    image = docker_inspect(f"{IMAGE}:{TAG}")
    labels = image["Config"]["Labels"]
    revision = git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain") else "")
    assert labels["org.opencontainers.image.revision"] == revision
    assert labels["org.opencontainers.image.title"] == IMAGE
    assert labels["org.opencontainers.image.version"] == TAG
    assert labels["io.gpuprov.purpose"] == "train" and labels["io.gpuprov.pytorch"] == "2.13.0+cpu"
    assert "io.gpuprov.cuda" not in labels and "io.gpuprov.min-driver" not in labels   # a CPU image
    assert labels["io.gpuprov.context-hash"].startswith("sha256:")
    assert image["Config"]["User"] == "1000:1000"
    assert f"{IMAGE}:{TAG}-{revision[:12]}{'-dirty' if revision.endswith('-dirty') else ''}" in image["RepoTags"]


def test_the_versions_inside_are_torchs_own(built):
    probe = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
    proc = subprocess.run(["docker", "run", "--rm", f"{IMAGE}:{TAG}", "python3", "-c", probe], capture_output=True,
                          text=True, check=True)
    assert json.loads(proc.stdout) == ["2.13.0+cpu", None]
    assert built["verification"]["versions"] == {"torch": "2.13.0+cpu", "cuda": None, "cudnn": None, "nccl": None}
    assert built["verification"]["problems"] == []


def test_a_rebuild_without_change_is_all_cache_hits_and_changed_only_builds_nothing(built, env):
    again = json.loads(invoke("images.build", "--name", IMAGE, "--json", env=env).stdout)["images"][0]
    assert again["result"] == "built" and again["image_id"] == built["image_id"]
    assert [step["cached"] for step in again["steps"][1:]] == [True] * (len(again["steps"]) - 1)
    nothing = json.loads(invoke("images.build", "--name", IMAGE, "--changed-only", "--json", env=env).stdout)
    assert [(e["result"], e["steps"]) for e in nothing["images"]] == [("unchanged", [])]
    assert docker_inspect(f"{IMAGE}:{TAG}")["Id"] == built["image_id"]


def test_the_smoke_suite_passes_inside_the_image(built, env):
    document = json.loads(invoke("images.test", "--name", IMAGE, "--json", env=env, timeout=1200).stdout)
    [entry] = document["images"]
    assert entry["result"] == "passed" and document["gpus"] is False   # this machine has no GPU: CPU only
    statuses = {r["check"]: r["status"] for r in entry["document"]["results"]}
    assert "fail" not in statuses.values()
    assert statuses["train.ddp"] == "pass" and statuses["infer.latency"] == "pass"
    assert entry["document"]["versions"]["torch"] == "2.13.0+cpu"


def test_the_push_reached_the_lab_registry(built, registry):
    with urllib.request.urlopen(f"http://{registry.push}/v2/{IMAGE}/tags/list", timeout=10) as response:
        tags = json.load(response)["tags"]
    assert TAG in tags
    request = urllib.request.Request(f"http://{registry.push}/v2/{IMAGE}/manifests/{TAG}", method="HEAD", headers={
        "Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        digest = response.headers["Docker-Content-Digest"]
    assert digest in {pushed["digest"] for pushed in built["pushed"]}


# ------------------------------------------------------------------------------------------- on lab hosts

def hgx(lab) -> str:
    return next(h.name for h in lab.hosts if h.profile == "hgx-h100")


def l40s(lab) -> str:
    return next(h.name for h in lab.hosts if h.profile == "l40s")


@pytest.fixture(scope="module")
def inventory(lab, registry, tmp_path_factory):
    """The lab inventory with the images variables added to what the lab writes (the lab group's `images:` keeps
    the lab engine's locked-memory limit, memlock: null): the registry as hosts reach it and mounts; the L40S host
    pinned to the 570 driver branch."""
    def edit(document):
        assert document["groups"]["lab"]["vars"]["images"] == {"memlock": None}   # as the lab writes it
        document["groups"]["lab"]["vars"]["images"].update(registry=registry.pull, output_dir="/srv/out")
        document["hosts"][hgx(lab)]["vars"]["data_dir"] = "/data"
        document["hosts"][l40s(lab)]["vars"]["stack"] = {"driver": "570"}

    return copy_inventory(lab, tmp_path_factory.mktemp("images-inventory"), edit=edit)


@pytest.fixture(scope="module")
def provisioned(lab, inventory, built, env):
    """The HGX host with the whole stack (Docker and the container toolkit among it), the L40S host with the 570
    driver only (no Docker)."""
    started = time.monotonic()
    invoke("provision", "--inventory", str(inventory), "--host", hgx(lab), env=env, timeout=1800)
    invoke("provision", "--inventory", str(inventory), "--host", l40s(lab), "--only", "sources,kernel,driver",
           env=env, timeout=1800)
    print(f"provisioned: {time.monotonic() - started:.1f} s")


def host_docker(lab, name: str, args: str) -> str:
    return on_host(lab, name, f"docker {args}")


def test_images_run_pulls_from_the_registry_and_starts_the_job_with_its_flags(lab, inventory, provisioned, env,
                                                                               registry):
    name = hgx(lab)
    job = "nvidia-smi -L && python3 -c 'import torch; print(\"torch\", torch.__version__)' && exec sleep 600"
    proc = invoke("images.run", "--inventory", str(inventory), "--host", name, "--name", IMAGE, "--detach",
                  "--container", JOB, "--json", "--", "sh", "-c", job, env=env, timeout=1800)
    [run] = json.loads(proc.stdout)["hosts"]
    assert run["rc"] == 0 and run["container"] == JOB
    try:
        [inspected] = json.loads(host_docker(lab, name, f"inspect {JOB}"))
        config = inspected["HostConfig"]
        assert inspected["Config"]["Image"] == f"{registry.pull}/{IMAGE}:{TAG}"
        assert config["IpcMode"] == "host"
        # no memlock asked for: the engine's own limit, which this lab's engines cannot lift (see below)
        assert [(u["Name"], u["Soft"], u["Hard"]) for u in config["Ulimits"]] == [("stack", 67108864, 67108864)]
        assert [(r["Count"], r["Capabilities"]) for r in config["DeviceRequests"]] == [(-1, [["gpu"]])]
        assert sorted(config["Binds"]) == ["/data:/data", "/srv/out:/srv/out"]
        deadline = time.monotonic() + 60
        while "torch" not in host_docker(lab, name, f"logs {JOB}") and time.monotonic() < deadline:
            time.sleep(1)
        # the GPUs reached the job through the NVIDIA runtime (the host's list, UUIDs and all), then torch ran
        host_list = on_host(lab, name, "nvidia-smi -L").splitlines()
        assert len(host_list) == 8
        assert host_docker(lab, name, f"logs {JOB}").splitlines() == [*host_list, "torch 2.13.0+cpu"]
    finally:
        host_docker(lab, name, f"rm -f {JOB}")


def test_a_foreground_run_prints_the_commands_output_and_removes_the_container(lab, inventory, provisioned, env):
    name = hgx(lab)
    proc = invoke("images.run", "--inventory", str(inventory), "--host", name, "--name", IMAGE, "--json", "--",
                  "python3", "-c", "import sys, torch; print(torch.__version__, sys.argv)", "a b", env=env)
    [run] = json.loads(proc.stdout)["hosts"]
    assert run["stdout"] == "2.13.0+cpu ['-c', 'a b']\n"
    assert host_docker(lab, name, "ps -a --format '{{.Image}}'").strip() == ""


def test_unlimited_locked_memory_is_asked_for_and_this_labs_engine_cannot_grant_it(lab, inventory, provisioned,
                                                                                  env, tmp_path):
    # the lab's engines run without CAP_SYS_RESOURCE: runc cannot lift RLIMIT_MEMLOCK (type 8) above its limit
    name = hgx(lab)
    document = yaml.safe_load(inventory.read_text())
    document["groups"]["lab"]["vars"]["images"]["memlock"] = -1
    default = tmp_path / "default.yaml"
    default.write_text(yaml.safe_dump(document))
    proc = invoke("images.run", "--inventory", str(default), "--host", name, "--name", IMAGE, "--detach",
                  "--container", f"{JOB}-unlimited", "--", "true", check_code=1, env=env)
    try:
        assert "error setting rlimit type 8: operation not permitted" in proc.stdout
        assert "set the host's images.memlock to its limit in bytes" in proc.stdout
        [inspected] = json.loads(host_docker(lab, name, f"inspect {JOB}-unlimited"))
        assert [(u["Name"], u["Soft"]) for u in inspected["HostConfig"]["Ulimits"]] == [("memlock", -1),
                                                                                        ("stack", 67108864)]
    finally:
        host_docker(lab, name, f"rm -f {JOB}-unlimited")


def test_images_run_is_refused_before_pulling_where_the_driver_is_below_the_minimum(lab, inventory, provisioned,
                                                                                    env, registry):
    from gpuprov.stack.lock import load_lock, write_lock

    name = l40s(lab)
    driver = on_host(lab, name, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").splitlines()[0]
    assert driver.startswith("570.")
    # the cu129 wheel runs on R570 through CUDA 12's minor-version compatibility (drivers >= 525.60.13): no refusal,
    # the pull is tried (and fails: this host has no Docker)
    proc = invoke("images.run", "--inventory", str(inventory), "--host", name, "--name", CU129, "--registry",
                  registry.pull, "--", "nvidia-smi", check_code=1, env=env)
    assert proc.stdout.splitlines()[0].startswith(f"[{name}] images.run: docker pull failed (exit ")
    # a locked digest whose minimum is above the driver is refused before pulling
    invoke("stack.lock", "--inventory", str(inventory), "--host", name, env=env)
    path = Path(env["INVOKE_GPUPROV_LOCKS"]) / f"{name}.lock.yaml"
    lock, digest = load_lock(path), "sha256:" + "1" * 64
    write_lock(path, lock["stack"], lock["inputs"], [{"name": CU129, "tag": "2.8.0-cu129-train", "digest": digest,
                                                      "min_driver": CU129_MIN_DRIVER}])
    proc = invoke("images.run", "--inventory", str(inventory), "--host", name, "--name", CU129, "--registry",
                  registry.pull, "--", "nvidia-smi", check_code=1, env=env)
    assert proc.stdout.splitlines()[0] == (
        f"[{name}] images.run: refused before pulling {registry.pull}/cuda-pytorch-train@{digest}: the "
        f"host's driver {driver} is older than {CU129_MIN_DRIVER}, the image's io.gpuprov.min-driver")
    # nothing was pulled: this host has no Docker at all, so any pull would have failed differently
    assert on_host(lab, name, "command -v docker || echo none").strip() == "none"


def test_stack_lock_records_the_digest_and_images_run_pulls_it(lab, inventory, provisioned, env, registry, built):
    name = hgx(lab)
    invoke("stack.lock", "--inventory", str(inventory), "--host", name, "--image", IMAGE, "--registry",
           registry.push, env=env)
    lock = yaml.safe_load((Path(env["INVOKE_GPUPROV_LOCKS"]) / f"{name}.lock.yaml").read_text())
    digest = next(p["digest"] for p in built["pushed"] if p["reference"] == f"{registry.push}/{IMAGE}:{TAG}")
    assert lock["images"] == [{"name": IMAGE, "tag": TAG, "digest": digest, "min_driver": None}]
    proc = invoke("images.run", "--inventory", str(inventory), "--host", name, "--name", IMAGE, "--detach",
                  "--container", f"{JOB}-locked", "--json", "--", "sleep", "30", env=env)
    try:
        assert json.loads(proc.stdout)["hosts"][0]["rc"] == 0
        [inspected] = json.loads(host_docker(lab, name, f"inspect {JOB}-locked"))
        assert inspected["Config"]["Image"] == f"{registry.pull}/{IMAGE}@{digest}"
    finally:
        host_docker(lab, name, f"rm -f {JOB}-locked")
    invoke("stack.check", "--inventory", str(inventory), "--host", name, env=env)


def test_stack_check_reports_a_host_whose_driver_no_longer_fits_a_locked_image(lab, inventory, provisioned, env):
    from gpuprov.stack.lock import load_lock, write_lock

    name = l40s(lab)
    invoke("stack.lock", "--inventory", str(inventory), "--host", name, env=env)
    path = Path(env["INVOKE_GPUPROV_LOCKS"]) / f"{name}.lock.yaml"
    lock = load_lock(path)
    digest = "sha256:" + "0" * 64
    write_lock(path, lock["stack"], lock["inputs"], [{"name": CU129, "tag": "2.8.0-cu129-train", "digest": digest,
                                                      "min_driver": CU129_MIN_DRIVER}])
    proc = invoke("stack.check", "--inventory", str(inventory), "--host", name, check_code=1, env=env)
    driver = on_host(lab, name, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").splitlines()[0]
    assert (f"[{name}] locked image {CU129}:2.8.0-cu129-train ({digest}): expected driver {CU129_MIN_DRIVER} or "
            f"newer (io.gpuprov.min-driver), found driver {driver}") in proc.stdout.splitlines()
