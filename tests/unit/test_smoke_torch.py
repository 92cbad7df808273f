"""The suite's torch checks on this machine's CPU: each check's pass (or measured-skip) path for real, the fail
paths from bad inputs, and the verdict functions with literal expected texts (formulas from NCCL-tests' and
NVIDIA's documents, numbers worked by hand)."""

from __future__ import annotations

import copy
import io
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuprov.smoke import (  # noqa: E402
    ddp_worker,
    infer_latency,
    infer_parity,
    perf_allreduce,
    perf_copy,
    perf_matmul,
    torchutil,
    train_cnn,
    train_compile,
    train_dataloader,
    train_ddp,
    train_transformer,
)
from gpuprov.smoke.core import REGISTRY, Context  # noqa: E402

QUICK = {"level": "quick", "gpus_visible": False}
# what an H100 SXM is expected to reach, as published: bf16 794.5 TFLOP/s (stas00/ml-engineering@744d01e MAMF
# table), device-to-device 2540 GB/s (NVIDIA/DCGM@72fa3fe nvvs/diag-skus.yaml.in, id 2330), host-to-device 55.43
# and device-to-host 55.06 GB/s on PCIe Gen5 x16 (nvbandwidth, stas00/ml-engineering@744d01e network/README.md)
H100_SXM = {"bf16_tflops": 794.5, "d2d_gbs": 2540, "h2d_gbs": 55.43, "d2h_gbs": 55.06}


def run(module, config: dict | None = None):
    return module.run(Context({**QUICK, **(config or {})}))


@pytest.fixture
def cuda_build_without_gpu(monkeypatch):
    """torch as a CUDA 12.8 build that sees no GPU (this CPU wheel sees none)."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


NO_GPU = (f"torch {torch.__version__} is built for CUDA 12.8 but sees no GPU, while nvidia-smi lists GPUs on "
          "this host")


# --- the checks registered -------------------------------------------------------------------------------------

def test_every_torch_check_is_registered_with_a_timeout():
    names = {"train.transformer", "train.cnn", "train.dataloader", "train.ddp", "train.compile", "infer.parity",
             "infer.latency", "perf.matmul", "perf.copy", "perf.allreduce"}
    assert names <= REGISTRY.keys()
    for name in names:
        assert REGISTRY[name].timeout > 0
        assert REGISTRY[name].levels == ("quick", "burn-in")


# --- training ----------------------------------------------------------------------------------------------------

def test_transformer_trains_and_its_loss_falls_on_cpu():
    result = run(train_transformer)
    assert result.status == "pass", result.reason
    assert result.reason.startswith("transformer block training on CPU (1 thread)")
    assert result.figures["steps"] == 12
    assert result.figures["loss_last"] < result.figures["loss_first"]
    assert result.thresholds == {"loss_window": 3, "max_loss_ratio": 0.9}


def test_cnn_trains_and_its_loss_falls_on_cpu():
    result = run(train_cnn)
    assert result.status == "pass", result.reason
    assert result.reason.startswith("CNN training on CPU (1 thread)")
    assert result.figures["images_per_s"] > 0


def test_dataloader_with_workers_delivers_every_sample_once():
    result = run(train_dataloader)
    assert result.status == "pass", result.reason
    workers = result.figures["workers"]
    assert workers >= 2
    assert result.figures["workers_seen"] == list(range(workers))
    assert result.figures["pin_memory"] is False          # pinned only with CUDA
    assert result.figures["steps"] == 256 // 32


def test_dataloader_worker_error_fails_the_check(monkeypatch):
    def broken(self, index):
        raise ValueError("sample unreadable")

    monkeypatch.setattr(train_dataloader, "worker_count", lambda: 2)
    monkeypatch.setattr(train_dataloader.QuadrantImages, "__getitem__", broken)
    result = run(train_dataloader)
    # The failed iterator's workers wait for its garbage collection, which joins each for 5 s. In the suite the
    # check's process exits instead; here the test ends them.
    for worker in multiprocessing.active_children():
        worker.terminate()
        worker.join()
    assert result.status == "fail"
    assert result.reason.startswith("DataLoader with 2 workers failed: ValueError: Caught ValueError in DataLoader "
                                    "worker process ")


def test_delivery_problems_name_what_went_wrong():
    problems = train_dataloader.delivery_problems([0, 1, 1, 3], 5, {0}, 2, 1)
    assert problems == ["2 of 5 sample(s) never arrived (first: [2, 4])",
                        "1 sample(s) arrived more than once (first: [1])",
                        "worker(s) [1] of 2 delivered no batch",
                        "1 batch(es) not in pinned memory although pin_memory=True"]
    assert train_dataloader.delivery_problems([1, 0, 2], 3, {0, 1}, 2, 0) == []


def test_loss_verdicts():
    assert torchutil.loss_verdict([4.0, 3.5, 3.0, 2.0, 1.5, 1.0]) == (
        "", {"steps": 6, "loss_first": 3.5, "loss_last": 1.5, "loss_ratio": 0.4286})
    reason, figures = torchutil.loss_verdict([4.0] * 6)
    assert reason == ("loss did not fall: 4 (mean of the last 3 steps) against 4 (mean of the first 3), ratio "
                      "1.000 where at most 0.9 is needed")
    reason, figures = torchutil.loss_verdict([3.0, 2.0, 1.0, float("nan"), 1.0, 1.0])
    assert reason == "loss is not finite at step 4 of 6 (nan)"
    assert figures["loss_last"] == "nan"                   # JSON has no NaN
    assert torchutil.loss_verdict([1.0, 2.0])[0] == "only 2 training steps ran, 6 are needed to judge the loss"


def test_training_fails_when_torch_built_for_cuda_sees_no_gpu(cuda_build_without_gpu):
    result = run(train_transformer, {"gpus_visible": True})
    assert (result.status, result.reason) == ("fail", NO_GPU)


def test_no_torch_is_a_skip_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    result = run(train_cnn)
    assert (result.status, result.reason) == (
        "skip", "torch is not importable (ModuleNotFoundError: import of torch halted; None in sys.modules)")



TORCH_CHECKS = (train_transformer, train_cnn, train_dataloader, train_ddp, train_compile, infer_parity, infer_latency,
                perf_matmul, perf_copy, perf_allreduce)


@pytest.mark.parametrize("module", TORCH_CHECKS, ids=lambda module: module.NAME)
def test_every_torch_check_skips_without_torch_under_its_own_name(monkeypatch, module):
    monkeypatch.setitem(sys.modules, "torch", None)
    result = run(module)
    assert (result.check, result.status) == (module.NAME, "skip")
    assert result.reason.startswith("torch is not importable (ModuleNotFoundError: ")


@pytest.mark.parametrize("module", [train_transformer, train_cnn, train_dataloader, train_ddp, train_compile,
                                    infer_parity, infer_latency], ids=lambda module: module.NAME)
def test_a_cuda_torch_without_gpus_fails_before_the_work(cuda_build_without_gpu, module):
    result = run(module, {"gpus_visible": True})
    assert (result.check, result.status, result.reason) == (module.NAME, "fail", NO_GPU)


def test_sizes_follow_the_device_and_only_burn_in_is_not_quick():
    table = {("cpu", "quick"): 1, ("cpu", "burn-in"): 2, ("cuda", "quick"): 3, ("cuda", "burn-in"): 4}
    gpu = torchutil.Target("cuda", 1, ("NVIDIA H100 80GB HBM3",))
    assert [torchutil.sized(table, torchutil.Target("cpu"), level) for level in ("quick", "burn-in", "other")] == [
        1, 2, 1]
    assert [torchutil.sized(table, gpu, level) for level in ("quick", "burn-in")] == [3, 4]

# --- DDP ---------------------------------------------------------------------------------------------------------

def test_ddp_over_two_gloo_ranks_with_torchrun():
    result = run(train_ddp)
    assert result.status == "pass", result.reason
    figures = result.figures
    assert (figures["backend"], figures["world_size"]) == ("gloo", 2)
    assert figures["allreduce_expected"] == 3.0            # rank 0 adds 1, rank 1 adds 2
    assert figures["max_param_diff"] == 0.0
    assert figures["hosts"] == {socket.gethostname(): 2}
    assert result.reason.startswith("DDP over 2 ranks (gloo) on CPU (1 thread): all-reduce exact (every element 3), "
                                  "parameters equal on every rank after 10 steps, loss ")


def test_allreduce_bandwidth_on_cpu_is_measured_not_judged():
    result = run(perf_allreduce, {"expected": {"allreduce_busbw_gbs": 400.0}})
    assert result.status == "skip"
    assert result.reason.startswith("no GPU: measured on CPU, not judged against the datasheet (all-reduce of 8 MiB "
                                    "over 2 ranks (gloo): bus bandwidth ")
    assert result.figures["busbw_gbs"] > 0
    assert result.figures["busbw_gbs"] == result.figures["algbw_gbs"]     # 2(n-1)/n = 1 for n = 2


def test_bus_bandwidth_is_the_nccl_tests_formula():
    assert ddp_worker.bus_bandwidth(100.0, 8) == 175.0      # 100 * 2 * 7 / 8
    assert ddp_worker.bus_bandwidth(100.0, 2) == 100.0


def test_worker_problems_name_the_ranks():
    report = {"world_size": 2,
              "allreduce": {"expected": 3.0, "per_rank": [{"wrong": 0, "min": 3.0, "max": 3.0},
                                                          {"wrong": 5, "min": 2.0, "max": 3.0}]},
              "train": {"steps": 10, "losses_per_rank": [[1.0, 0.5], [1.0, float("nan")]], "max_param_diff": 0.5}}
    assert ddp_worker.problems_of(report, 3) == [
        "2 ranks joined, 3 expected",
        "all-reduce result wrong on rank(s) 1 (5 elements, values 2..3, 3 expected)",
        "DDP loss not finite on rank(s) [1]",
        "parameters differ between ranks after 10 DDP steps (largest difference 0.5, at most 1e-06 allowed)"]


def test_worker_refuses_to_run_outside_torchrun():
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, train_ddp.WORKER], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stderr == "ddp_worker: run me under torchrun (RANK and WORLD_SIZE are not set)\n"


def test_worker_refuses_an_address_no_interface_has(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert ddp_worker.main(["--bind-addr", "192.0.2.1"]) == 2      # TEST-NET-1 (RFC 5737)
    assert capsys.readouterr().err == "ddp_worker: no network interface has the address 192.0.2.1\n"
    assert ddp_worker.interface_of("127.0.0.1") == "lo"


def test_multi_node_torchrun_command_line():
    argv = train_ddp.torchrun_argv(8, ["--bench-mb", "256", "--expect-world-size", "16"],
                                   rdzv_endpoint="10.0.0.11:29400", nnodes=2, node_rank=1, local_addr="10.0.0.12",
                                   python="/opt/gpuprov/venv/bin/python", worker="/opt/gpuprov/smoke/ddp_worker.py")
    assert argv == ["/opt/gpuprov/venv/bin/python", "-m", "torch.distributed.run", "--nnodes=2",
                    "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.11:29400",
                    "--rdzv-id=gpuprov-smoke", "--rdzv-conf=join_timeout=60", "--max-restarts=0", "--node-rank=1",
                    "--local-addr=10.0.0.12", "/opt/gpuprov/smoke/ddp_worker.py", "--bench-mb", "256",
                    "--expect-world-size", "16"]


def test_worker_report_is_found_among_other_output():
    stdout = ('NCCL INFO Bootstrap : Using eth0:10.0.0.11<0>\n{"not": "it"}\n'
              '{"ddp_worker": 1, "ok": true, "world_size": 16}\nW1201 a warning\n')
    assert train_ddp.parse_worker_output(stdout) == {"ddp_worker": 1, "ok": True, "world_size": 16}
    assert train_ddp.parse_worker_output("torchrun: rendezvous timed out\n") is None


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hung_process_group_is_killed_whole_at_the_timeout():
    script = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(120)']); print(child.pid, flush=True); time.sleep(120)")
    rc, out, err = torchutil.run_group([sys.executable, "-c", script], timeout=2)
    assert rc == 124   # killed: left alone, the script would have ended with 0 after 120 s
    assert err.endswith("timed out after 2 s")
    child = int(out.split()[0])
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child)


# --- torch.compile -----------------------------------------------------------------------------------------------

@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)


def test_compile_without_a_compiler_is_a_skip(no_compiler):
    result = run(train_compile)
    assert (result.status, result.reason) == (
        "skip", "torch.compile not run: no C++ compiler (g++, c++ or clang++) for TorchInductor's CPU code")


def test_toolchain_failures_are_told_from_torch_failures():
    assert torchutil.toolchain_error(RuntimeError("fatal error: Python.h: No such file or directory"))
    assert not torchutil.toolchain_error(RuntimeError("CUDA error: an illegal memory access was encountered"))


@pytest.mark.tool
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script_method, used inside torch
def test_compiled_training_matches_eager_and_its_loss_falls():
    result = run(train_compile)
    assert result.status == "pass", result.reason
    assert result.figures["first_loss_compiled"] == pytest.approx(result.figures["first_loss_eager"], rel=2e-2)
    assert result.thresholds["first_loss_rtol"] in (1e-4, 2e-2)


# --- inference ---------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's TorchScript ONNX exporter is deprecated
def test_parity_of_eager_compile_and_onnx_runtime():
    result = run(infer_parity)
    assert result.status == "pass", result.reason
    assert result.figures["providers"] == ["CPUExecutionProvider"]
    assert result.thresholds["onnx"] == {"rtol": 1e-4, "atol": 1e-5}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's TorchScript ONNX exporter is deprecated
def test_parity_without_a_compiler_is_judged_on_onnx_runtime_alone(no_compiler):
    result = run(infer_parity)
    assert result.status == "pass", result.reason
    assert result.reason.startswith("eager on CPU (1 thread)")
    assert ("torch.compile not run: no C++ compiler (g++, c++ or clang++) for TorchInductor's CPU code; ONNX "
            "Runtime on CPUExecutionProvider matches") in result.reason
    assert result.figures["compared"] == ["onnx"] and "compile_max_abs" not in result.figures


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's TorchScript ONNX exporter is deprecated
def test_parity_without_a_compiler_fails_when_onnx_runtime_differs(no_compiler, monkeypatch):
    export = infer_parity.export_onnx

    def export_other_weights(torch_, model, example):   # the exported model is not the one eager runs
        other = copy.deepcopy(model)
        with torch.no_grad():
            next(other.parameters()).add_(0.5)
        return export(torch_, other, example)

    monkeypatch.setattr(infer_parity, "export_onnx", export_other_weights)
    result = run(infer_parity)
    assert result.status == "fail", result.reason
    assert "ONNX Runtime (CPUExecutionProvider) differs from eager: largest difference" in result.reason
    assert result.figures["compared"] == ["onnx"] and result.figures["onnx_max_abs"] > 1e-5


def test_parity_with_neither_compiler_nor_onnx_runtime_is_a_skip(no_compiler, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)   # import onnxruntime raises ImportError
    result = run(infer_parity)
    assert result.status == "skip", result.reason
    assert "torch.compile not run: no C++ compiler" in result.reason and "; ONNX not run: " in result.reason
    assert result.figures["compared"] == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's TorchScript ONNX exporter is deprecated
def test_a_cuda_session_that_fell_back_to_the_cpu_fails():
    import onnxruntime

    buffer = io.BytesIO()
    torch.onnx.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),), buffer, dynamo=False)
    asked = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.warns(UserWarning):  # onnxruntime only warns when it cannot give the provider asked for
        session = onnxruntime.InferenceSession(buffer.getvalue(), providers=asked)
    assert session.get_providers() == ["CPUExecutionProvider"]
    problem = infer_parity.provider_problem(asked, session.get_providers(),
                                            ["AzureExecutionProvider", "CPUExecutionProvider"])
    assert problem == ("asked ONNX Runtime for CUDAExecutionProvider, the session runs on CPUExecutionProvider (it "
                       "fell back without an error; providers this onnxruntime offers: AzureExecutionProvider, "
                       "CPUExecutionProvider)")
    assert infer_parity.provider_problem(asked, ["CUDAExecutionProvider", "CPUExecutionProvider"], []) == ""


def test_latency_at_batch_1_and_32_and_the_batching_gain():
    result = run(infer_latency)
    assert result.status == "pass", result.reason
    figures = result.figures
    for batch in (1, 32):
        assert 0 < figures[f"b{batch}_p50_ms"] <= figures[f"b{batch}_p99_ms"]
    assert figures["batching_gain"] == round(figures["b32_per_s"] / figures["b1_per_s"], 2)


def test_latency_fails_when_batching_gains_less_than_asked():
    result = run(infer_latency, {"min_batching_gain": 1e6})
    assert result.status == "fail"
    assert result.reason.startswith("batching gains too little on CPU (1 thread)")
    assert result.reason.endswith("(at least 1e+06x needed)")


def test_percentile_is_nearest_rank():
    values = [float(value) for value in range(100, 0, -1)]
    assert (torchutil.percentile(values, 50), torchutil.percentile(values, 99)) == (50.0, 99.0)
    assert torchutil.percentile([3.0, 1.0, 2.0], 99) == 3.0


# --- performance -------------------------------------------------------------------------------------------------

def test_matmul_on_cpu_is_measured_and_not_judged():
    result = run(perf_matmul, {"expected": H100_SXM})
    assert result.status == "skip"
    assert result.reason.startswith("no GPU: measured on CPU, not judged against the datasheet (CPU (1 thread), "
                                    "512x512 matmul: bf16 ")
    for figure in ("bf16_tflops", "fp16_tflops", "fp32_tflops"):
        assert result.figures[figure] > 0
    assert "pct_of_expected" not in result.figures


def test_copy_on_cpu_is_measured_and_not_judged():
    result = run(perf_copy, {"expected": H100_SXM})
    assert result.status == "skip"
    assert result.figures["d2d_gbs"] > 0
    assert "h2d_gbs" not in result.figures


def test_matmul_fails_with_both_numbers_when_the_gpus_are_expected(cuda_build_without_gpu):
    result = run(perf_matmul, {"gpus_visible": True, "expected": H100_SXM, "threshold_pct": 80})
    assert result.status == "fail"
    bf16 = result.figures["bf16_tflops"]
    assert result.reason.startswith(NO_GPU + "; bf16 matmul ")
    assert (f"bf16 matmul {bf16:.4g} TFLOP/s is {100 * bf16 / 794.5:.1f} % of the expected 794.5 TFLOP/s (at "
            "least 80 % needed)") in result.reason
    assert result.thresholds["expected"]["bf16_tflops"] == 794.5


def test_datasheet_verdicts_name_both_numbers():
    failures, pct = torchutil.judge_figures({"d2d_gbs": 2900.0, "h2d_gbs": 30.0}, H100_SXM, 80, "GPU 2: ")
    assert pct == {"d2d_gbs": 114.2, "h2d_gbs": 54.1}         # 2900 / 2540, 30 / 55.43
    assert failures == ["GPU 2: host-to-device copy (pinned) 30 GB/s is 54.1 % of the expected 55.43 GB/s (at "
                        "least 80 % needed)"]
    failures, pct = torchutil.judge_figures({"bf16_tflops": 0.5, "tf32_tflops": 400.0},
                                            {"bf16_tflops": 989, "tf32_tflops": None}, 80)
    assert failures == ["bf16 matmul 0.5 TFLOP/s is 0.1 % of the expected 989 TFLOP/s (at least 80 % needed)"]
    assert pct == {"bf16_tflops": 0.1}                          # tf32 has no expected figure: not judged


def test_a_gpu_below_the_threshold_fails_and_a_missing_figure_is_a_skip():
    gpu = torchutil.Target("cuda", 8, ("NVIDIA H100 80GB HBM3",) * 8)
    thresholds = torchutil.expected_thresholds(["busbw_gbs"], {"threshold_pct": 80})
    skipped = torchutil.perf_result("perf.allreduce", gpu, summary="bus bandwidth 350 GB/s",
                                    figures={"busbw_gbs": 350.0}, failures=[], judged={}, wanted=["busbw_gbs"],
                                    thresholds=thresholds, start=time.monotonic())
    assert (skipped.status, skipped.reason) == (
        "skip", "no expected figure to judge against (allreduce_busbw_gbs): bus bandwidth 350 GB/s")
    failures, judged = torchutil.judge_figures({"busbw_gbs": 300.0}, {"allreduce_busbw_gbs": 400.0}, 80)
    failed = torchutil.perf_result("perf.allreduce", gpu, summary="", figures={"busbw_gbs": 300.0},
                                   failures=failures, judged=judged, wanted=["busbw_gbs"], thresholds=thresholds,
                                   start=time.monotonic())
    assert (failed.status, failed.reason) == (
        "fail", "all-reduce bus bandwidth 300 GB/s is 75.0 % of the expected 400 GB/s (at least 80 % needed)")
    assert failed.figures["pct_of_expected"] == {"busbw_gbs": 75.0}


def test_two_nodes_meet_at_one_rendezvous_and_rank_0_reports():
    port = torchutil.free_port()
    worker_args = ["--backend", "gloo", "--bind-addr", "127.0.0.1", "--bench-mb", "1", "--bench-iters", "3",
                   "--expect-world-size", "2", "--deadline", "100"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(train_ddp.torchrun_argv(1, worker_args, rdzv_endpoint=f"127.0.0.1:{port}", nnodes=2,
                                                      node_rank=rank, local_addr="127.0.0.1"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=110) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    reports = [report for report in (train_ddp.parse_worker_output(out) for out, _ in outputs) if report]
    assert len(reports) == 1                                   # rank 0 alone prints, on whichever node it is
    report = reports[0]
    assert (report["ok"], report["world_size"], report["nodes"]) == (True, 2, 2)
    assert report["allreduce"]["expected"] == 3.0
    assert report["hosts"] == {socket.gethostname(): 2}
    assert report["bench"]["busbw_gbs"] == report["bench"]["algbw_gbs"]
