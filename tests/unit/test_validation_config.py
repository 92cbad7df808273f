"""Each host's suite config from a lab-like inventory, a stack and facts; the validation variables' checks.

Expected figures are NVIDIA's datasheet numbers written out here (dense = the datasheet's sparse figure / 2):
H100 SXM5 BF16/FP16 989, TF32 494.5 ("989 TFLOPS*" with sparsity), 3,350 GB/s; L40S BF16 362.05, TF32 183
("366*"); PCIe per direction after 128b/130b encoding: Gen5 x16 32 GT/s x 16 / 8 x 128/130 = 63.0 GB/s, Gen4
31.5 GB/s. nvidia-smi names from the captures in tests/fixtures/nvidia-smi-q*."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from gpuprov.core.errors import InputError
from gpuprov.inventory import load_inventory
from gpuprov.validation.suite_config import build_config, validate_vars

# the shape `invoke lab.up` writes (gpuprov/lab/state.py), plus the validation variables
LAB_INVENTORY = textwrap.dedent("""\
    defaults: {user: root}
    groups:
      lab:
        vars:
          validate: {torch_wheel: cpu, torch_version: latest, torch_index: ""}
      hgx-h100:
        vars: {container_engine: docker}
      l40s: {vars: {}}
    hosts:
      gpuprov-lab-01:
        address: 127.0.0.1
        port: 42201
        groups: [lab, hgx-h100]
        vars:
          hardware: {gpu: H100-SXM, count: 8, nvswitch: true}
          lab: {profile: hgx-h100, internal_ip: 172.20.0.2}
          cluster_address: 172.20.0.2
          workload: llm-finetune
          data_dir: /data
      gpuprov-lab-02:
        address: 127.0.0.1
        port: 42202
        groups: [lab, l40s]
        vars:
          hardware: {gpu: L40S, count: 4, nvswitch: false}
          lab: {profile: l40s, internal_ip: 172.20.0.3}
    """)

H100_STACK = {"gpu": {"model": "H100-SXM"}, "driver": {"version": "570.148.08"}, "cuda": {"version": "12.8.1"},
              "nccl": {"version": "2.26.5"}, "fabricmanager": {"version": "570.148.08"},
              "pytorch": {"version": "2.7", "wheel": "cu128"}, "ngc_pytorch": "25.04-py3"}
L40S_STACK = {"gpu": {"model": "L40S"}, "driver": {"version": "570.148.08"}, "cuda": {"version": "12.8.1"},
              "nccl": {"version": "2.26.5"}, "fabricmanager": None, "pytorch": {"version": "2.7", "wheel": "cu128"}}


def facts(gpus: int, docker: bool = True) -> dict:
    return {"nvidia_smi": {"driver_version": "570.148.08", "gpus": [{"index": i} for i in range(gpus)]},
            "pci_gpus": [{"device_id": "2330"}] * gpus,
            "docker": {"version": "24.0", "active": True, "runtimes": ["nvidia"]} if docker else None}


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(LAB_INVENTORY)
    return load_inventory(path)


def test_hgx_host_config(inventory):
    host = inventory.host("gpuprov-lab-01")
    config = build_config(host, facts(8), H100_STACK, validate_vars(host))
    assert config == {
        "host": "gpuprov-lab-01", "level": "quick", "strict": False,
        "expect": {"gpu": "H100-SXM", "gpu_names": ["NVIDIA H100 80GB HBM3"], "count": 8, "driver": "570.148.08",
                   "cuda": None, "nccl": None, "cudnn": None, "nvswitch": True, "form_factor": "sxm", "bf16": True},
        "datasheet": {"bf16_tflops": 989, "fp16_tflops": 989, "tf32_tflops": 494.5, "mem_bw_gbs": 3350,
                      "pcie_gbs": 63.0},
        # published measurements (tests/unit/test_expected_figures.py names each source): MAMF bf16 794.5, DCGM's
        # memory bandwidth 2540, nvbandwidth Gen5 x16 55.43/55.06, nccl-tests#212 ~480 on 8 GPUs with NVSwitch
        "expected": {"bf16_tflops": 794.5, "fp16_tflops": 794.5, "tf32_tflops": round(794.5 / 989 * 494.5, 1),
                     "d2d_gbs": 2540.0, "h2d_gbs": 55.43, "d2h_gbs": 55.06, "allreduce_busbw_gbs": 480.0},
        "expected_basis": config["expected_basis"],
        "threshold_pct": 80.0, "workload": "llm-finetune", "data_dir": "/data", "shm_min_gib": 8.0,
        "container": None, "gpus_visible": True, "sizing": None, "min_batching_gain": None, "dcgm_level": None,
        "burn_in_seconds": None, "nccl_tests": None,
    }


def test_lab_host_variables(inventory):
    """The lab's CPU wheel settings come from the lab group; cluster_address from the host (else address)."""
    first, second = (validate_vars(inventory.host(n)) for n in ("gpuprov-lab-01", "gpuprov-lab-02"))
    assert (first.torch_wheel, first.torch_version, first.torch_index) == ("cpu", "latest", "")
    assert first.cluster_address == "172.20.0.2"
    assert second.cluster_address == "127.0.0.1"
    assert (second.outlier_pct, second.textfile_dir, second.rdzv_port) == (
        10.0, "/var/lib/prometheus/node-exporter", 29400)


def test_cuda_expected_from_the_wheel_variant(inventory):
    """With the resolver's cu128 wheel torch reports CUDA 12.8; its NCCL and cuDNN are the wheel's own."""
    host = inventory.host("gpuprov-lab-02")
    settings = dataclasses.replace(validate_vars(host), torch_wheel=None)   # not the lab's CPU wheel
    config = build_config(host, facts(4, docker=False), L40S_STACK, settings, level="burn-in", strict=True)
    assert (config["expect"]["cuda"], config["expect"]["nccl"], config["expect"]["cudnn"]) == ("12.8", None, None)
    assert config["expect"]["nvswitch"] is False and config["expect"]["form_factor"] == "pcie"
    assert config["datasheet"] == {"bf16_tflops": 362.05, "fp16_tflops": 362.05, "tf32_tflops": 183,
                                   "mem_bw_gbs": 864, "pcie_gbs": 31.5}
    assert (config["level"], config["strict"], config["workload"], config["data_dir"]) == ("burn-in", True, None,
                                                                                           None)


def test_ngc_image_expectations(inventory):
    """NGC PyTorch 24.05: CUDA 12.4.1, NCCL 2.21.5, cuDNN 9.1.0.70 (its release notes, gpuprov/data/ngc_pytorch)."""
    host = inventory.host("gpuprov-lab-01")
    config = build_config(host, facts(8), H100_STACK, validate_vars(host), image="nvcr.io/nvidia/pytorch:24.05-py3")
    assert {k: config["expect"][k] for k in ("cuda", "nccl", "cudnn")} == {"cuda": "12.4", "nccl": "2.21.5",
                                                                           "cudnn": "9.1.0.70"}
    # the suite runs inside the image: the container must list the GPUs of the host's facts
    assert config["container"] == {"runtime": "docker", "image": "nvcr.io/nvidia/pytorch:24.05-py3", "inside": True,
                                   "host_uuids": []}
    other = build_config(host, facts(8), H100_STACK, validate_vars(host), image="registry.local/train:1")
    assert {k: other["expect"][k] for k in ("cuda", "nccl", "cudnn")} == {"cuda": None, "nccl": None, "cudnn": None}


def test_no_gpus_visible_without_nvidia_smi(inventory):
    host = inventory.host("gpuprov-lab-01")
    bare = {"nvidia_smi": None, "pci_gpus": [{"device_id": "2330"}] * 8, "docker": None}
    config = build_config(host, bare, H100_STACK, validate_vars(host))
    assert config["gpus_visible"] is False and config["expect"]["count"] == 8


def test_threshold_per_gpu_model(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent("""\
        defaults:
          vars: {validate: {threshold_pct: {H100: 85, default: 75}, outlier_pct: 5, shm_min_gib: 16,
                            textfile_dir: /srv/node-exporter, image: "nvcr.io/nvidia/pytorch:25.04-py3",
                            sizing: {cpu_cores_per_gpu: 12}, min_batching_gain: 3, dcgm_level: 2,
                            burn_in_seconds: 600, nccl_tests: /opt/nccl-tests/build/all_reduce_perf}}
        hosts:
          a: {address: 192.0.2.1, vars: {hardware: {gpu: H100-SXM5, count: 8}}}
          b: {address: 192.0.2.2, vars: {hardware: {gpu: L40S, count: 4}}}
        """))
    inv = load_inventory(path)
    a, b = inv.host("a"), inv.host("b")
    config_a = build_config(a, facts(8), H100_STACK, validate_vars(a))
    config_b = build_config(b, facts(4), L40S_STACK, validate_vars(b))
    assert (config_a["threshold_pct"], config_b["threshold_pct"]) == (85.0, 75.0)
    assert config_a["shm_min_gib"] == 16.0
    assert {k: config_a[k] for k in ("sizing", "min_batching_gain", "dcgm_level", "burn_in_seconds", "nccl_tests")} \
        == {"sizing": {"cpu_cores_per_gpu": 12.0}, "min_batching_gain": 3.0, "dcgm_level": 2,
            "burn_in_seconds": 600.0, "nccl_tests": "/opt/nccl-tests/build/all_reduce_perf"}
    assert config_a["container"] == {"runtime": "docker", "image": "nvcr.io/nvidia/pytorch:25.04-py3"}
    settings = validate_vars(a)
    assert (settings.outlier_pct, settings.textfile_dir) == (5.0, "/srv/node-exporter")


def test_bad_variables_are_refused_when_the_inventory_is_loaded(tmp_path):
    """Checked once, at load, where written (tests/unit/test_inventory_variables.py has every variable's case)."""
    import yaml

    from gpuprov.inventory import InventoryError

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"gpu01": {"address": "192.0.2.1", "vars": {"workload": "training"}}}}))
    with pytest.raises(InventoryError) as caught:
        validate_vars(load_inventory(path).host("gpu01"))
    assert caught.value.errors == [f"{path}:5:17: hosts.gpu01.vars.workload: must be one of llm-finetune, cv, "
                                   "recsys, inference, not 'training'"]
    assert caught.value.exit_code == 2


def test_unknown_level_is_bad_input(inventory):
    host = inventory.host("gpuprov-lab-01")
    with pytest.raises(InputError, match="--level must be one of quick, burn-in"):
        build_config(host, facts(8), H100_STACK, validate_vars(host), level="slow")


def test_the_example_inventory_documents_the_validate_variables():
    from pathlib import Path

    example = load_inventory(Path(__file__).resolve().parents[2] / "inventories" / "example.yaml")
    for host in example.hosts.values():
        validate_vars(host)          # every host's variables pass the checks
    settings = validate_vars(example.host("hgx-01"))
    assert (settings.workload, settings.data_dir, settings.cluster_address) == ("llm-finetune", "/data",
                                                                                "10.1.1.11")
    assert settings.threshold_for("H100-SXM") == 85 and settings.rdzv_port == 29500
    assert validate_vars(example.host("hgx-02")).cluster_address == "10.1.0.12"   # default: the address


def test_a_torch_index_token_is_masked_in_every_later_output(tmp_path):
    import yaml

    from gpuprov.core.secrets import mask

    path = tmp_path / "inv.yaml"
    index = "https://ci-bot:s3cr3t-Tok9@pypi.internal/simple"
    path.write_text(yaml.safe_dump({"hosts": {"gpu01": {"address": "192.0.2.1",
                                                        "vars": {"validate": {"torch_index": index}}}}}))
    assert "s3cr3t-Tok9" in mask("pip said: 401 for s3cr3t-Tok9")   # a bare token is not known before
    validate_vars(load_inventory(path).host("gpu01"))
    assert "s3cr3t-Tok9" not in mask("pip said: 401 for s3cr3t-Tok9 (token s3cr3t-Tok9)")


def test_every_figure_the_suite_judges_is_one_the_controller_provides(inventory):
    """Each key a perf check reads from the config's `expected` block (torchutil.FIGURES) or reads by name from its
    `expected` or `datasheet` block is one build_config writes, and on an 8-GPU HGX H100 each has a value: no
    check skips for a key nobody provides (perf.allreduce once read allreduce_busbw_gbs, which nothing wrote)."""
    import re
    from pathlib import Path

    from gpuprov.smoke.torchutil import FIGURES

    host = inventory.host("gpuprov-lab-01")
    config = build_config(host, facts(8), H100_STACK, validate_vars(host))
    read = {("expected", key) for _, _, key in FIGURES.values()}
    smoke = Path(__file__).resolve().parents[2] / "gpuprov" / "smoke"
    for path in smoke.glob("*.py"):
        text = path.read_text()
        read |= set(re.findall(r"\b(expected|datasheet)(?:\.get\(|\[)\"(\w+)\"", text))
        for block in re.findall(r"config(?:\.get\(|\[)\"(expected|datasheet)\"", text):
            assert block in config, (path.name, block)
    assert read and {(block, key) for block, key in read if key not in config[block]} == set()
    assert all(config["expected"][key] is not None for _, _, key in FIGURES.values())
    assert all(config["expected_basis"][key].startswith(("measured", "derived")) for _, _, key in FIGURES.values())


def test_the_threshold_is_a_share_of_the_expected_figure(inventory):
    """An L40S host: bf16 expected 252.0 TFLOP/s (mag-/gpu_benchmark's measured best), not the 362.05 datasheet;
    four PCIe GPUs expect their PCIe copy figure as all-reduce bus bandwidth (marked fallback)."""
    host = inventory.host("gpuprov-lab-02")
    config = build_config(host, facts(4, docker=False), L40S_STACK, validate_vars(host))
    assert config["expected"]["bf16_tflops"] == 252.0 and config["datasheet"]["bf16_tflops"] == 362.05
    assert config["expected_basis"]["allreduce_busbw_gbs"].startswith("fallback")
    assert config["expected"]["allreduce_busbw_gbs"] == config["expected"]["h2d_gbs"]


# ------------------------------------------------------------------ an OS gpuprov has no stack data for

BULLSEYE = {"os": {"id": "debian", "version_id": "11", "pretty_name": "Debian GNU/Linux 11 (bullseye)", "key": None}}


def _bullseye_host(tmp_path, validate: str):
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent(f"""\
        hosts:
          old-node:
            address: 10.0.0.9
            vars:
              hardware: {{gpu: H100-SXM, count: 8, nvswitch: true}}
              {validate}
        """))
    return load_inventory(path).host("old-node")


def test_a_host_on_an_os_without_stack_data_must_name_its_torch_wheel(tmp_path):
    from gpuprov.validation.host import RunOptions, _stack

    host = _bullseye_host(tmp_path, "workload: llm-finetune")
    with pytest.raises(InputError) as caught:
        _stack(host, BULLSEYE, validate_vars(host), RunOptions(locks_dir=tmp_path / "locks"))
    assert caught.value.host == "old-node" and caught.value.step == "stack.resolve"
    assert "no stack data for Debian GNU/Linux 11 (bullseye)" in caught.value.message
    assert "validate.torch_wheel" in caught.value.hint


def test_a_host_on_an_os_without_stack_data_is_validated_without_a_stack(tmp_path):
    from gpuprov.validation.host import RunOptions, _stack

    host = _bullseye_host(tmp_path, "validate: {torch_wheel: cu128}")
    stack, lock, notices = _stack(host, BULLSEYE, validate_vars(host), RunOptions(locks_dir=tmp_path / "locks"))
    assert (stack, lock) == (None, None)
    assert notices == ["gpuprov has no stack data for Debian GNU/Linux 11 (bullseye) (its stacks cover ubuntu-22.04, "
                       "ubuntu-24.04, debian-12, rhel-9, rocky-9): the suite runs with validate.torch_wheel cu128 and "
                       "judges no driver or CUDA version against a stack"]
