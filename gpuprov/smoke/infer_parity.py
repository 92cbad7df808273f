"""infer.parity: one model's outputs agree between eager PyTorch, torch.compile and an ONNX export run by ONNX
Runtime, within stated tolerances (in the result's thresholds); and ONNX Runtime's session really runs on the
provider asked for: a CUDA session that silently fell back to the CPU fails.

The comparisons run in fp32 with TF32 off in PyTorch. ONNX Runtime's CUDA provider may use TF32 for matmuls and
convolutions, so its tolerance on a GPU is wider. torch.compile without a working compiler toolchain (or ONNX
Runtime / onnx not installed) is a skip of that part, never a failure, and the other part is judged on its own: the
check passes or fails on what ran (`compared` in its figures names it) and is a skip only when neither part ran.
"""

from __future__ import annotations

import io
import time
import warnings

from .core import FAIL, PASS, SKIP, Result, check
from .torchutil import (
    cnn,
    compiler_missing,
    first_line,
    json_number,
    private_cache,
    quadrant_batch,
    toolchain_error,
    torch_check,
)

NAME = "infer.parity"
TOLERANCES = {  # (device, comparison) -> rtol, atol as numpy.allclose / torch.allclose apply them
    ("cpu", "compile"): {"rtol": 1e-4, "atol": 1e-5},
    ("cpu", "onnx"): {"rtol": 1e-4, "atol": 1e-5},
    ("cuda", "compile"): {"rtol": 1e-3, "atol": 1e-4},
    ("cuda", "onnx"): {"rtol": 1e-2, "atol": 1e-2},
}
BATCH, IMAGE = 8, 32


def provider_problem(asked: list[str], got: list[str], available: list[str]) -> str:
    """"" when the session runs on the provider asked for first; else the silent fall-back, named."""
    if asked[0] in got:
        return ""
    return (f"asked ONNX Runtime for {asked[0]}, the session runs on {', '.join(got) or 'no provider'} (it fell "
            f"back without an error; providers this onnxruntime offers: {', '.join(available) or 'none'})")


def compare(torch, reference, other, rtol: float, atol: float) -> tuple[bool, dict]:
    """allclose(other, reference) and the largest absolute and relative differences."""
    other = torch.as_tensor(other).to(reference.device, reference.dtype)
    difference = (other - reference).abs()
    figures = {"max_abs": json_number(float(difference.max()), 9),
               "max_rel": json_number(float((difference / reference.abs().clamp_min(1e-12)).max()), 9)}
    return bool(torch.allclose(other, reference, rtol=rtol, atol=atol)), figures


def export_onnx(torch, model, example) -> tuple[bytes, str]:
    """The model as ONNX bytes, with a dynamic batch axis: the TorchScript exporter, else torch.export's."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is deprecated, not gone
            torch.onnx.export(model, (example,), buffer, dynamo=False, input_names=["images"], output_names=["logits"],
                              dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
        return buffer.getvalue(), "torchscript"
    except Exception as legacy:  # removed in a later torch, or this model does not script
        try:
            program = torch.onnx.export(model, (example,), dynamo=True, input_names=["images"],
                                        output_names=["logits"])
            return program.model_proto.SerializeToString(), "dynamo"
        except Exception as exc:
            raise RuntimeError(f"ONNX export failed: {first_line(legacy)}; torch.export: {first_line(exc)}") from exc


def onnx_part(torch, target, model, images, reference) -> tuple[str, str, dict]:
    """(status, message, figures) of eager against ONNX Runtime."""
    try:
        import onnx  # noqa: F401  (the TorchScript exporter needs it)
        import onnxruntime
    except Exception as exc:
        return SKIP, f"ONNX not run: {first_line(exc)}", {}
    tolerance = TOLERANCES[(target.device, "onnx")]
    try:
        data, exporter = export_onnx(torch, model, images)
        asked = (["CUDAExecutionProvider", "CPUExecutionProvider"] if target.cuda else ["CPUExecutionProvider"])
        if target.cuda and hasattr(onnxruntime, "preload_dlls"):
            onnxruntime.preload_dlls()  # the CUDA and cuDNN libraries of the nvidia-* wheels torch brought
        session = onnxruntime.InferenceSession(data, providers=asked)
        got, available = session.get_providers(), onnxruntime.get_available_providers()
        figures = {"exporter": exporter, "providers": got, "onnxruntime": onnxruntime.__version__}
        problem = provider_problem(asked, got, available)
        if problem:
            return FAIL, problem, figures
        output = session.run(["logits"], {"images": images.cpu().numpy()})[0]
    except Exception as exc:
        return FAIL, f"ONNX Runtime run failed: {first_line(exc)}", {}
    same, differences = compare(torch, reference, output, **tolerance)
    figures.update({f"onnx_{key}": value for key, value in differences.items()})
    if not same:
        return FAIL, (f"ONNX Runtime ({got[0]}) differs from eager: largest difference {differences['max_abs']:.3g}"
                      f" (rtol {tolerance['rtol']:g}, atol {tolerance['atol']:g})"), figures
    return PASS, f"ONNX Runtime on {got[0]} matches (largest difference {differences['max_abs']:.3g})", figures


def compile_part(torch, target, model, images, reference) -> tuple[str, str, dict]:
    """(status, message, figures) of eager against torch.compile."""
    missing = compiler_missing(torch, target)
    if missing:
        return SKIP, f"torch.compile not run: {missing}", {}
    tolerance = TOLERANCES[(target.device, "compile")]
    began = time.monotonic()
    try:
        with torch.inference_mode():
            output = torch.compile(model)(images)
    except Exception as exc:
        if toolchain_error(exc):
            return SKIP, f"torch.compile not run, the compiler toolchain failed: {first_line(exc)}", {}
        return FAIL, f"torch.compile failed: {first_line(exc)}", {}
    figures = {"compile_s": round(time.monotonic() - began, 2)}
    same, differences = compare(torch, reference, output, **tolerance)
    figures.update({f"compile_{key}": value for key, value in differences.items()})
    if not same:
        return FAIL, (f"torch.compile differs from eager: largest difference {differences['max_abs']:.3g} "
                      f"(rtol {tolerance['rtol']:g}, atol {tolerance['atol']:g})"), figures
    return PASS, f"torch.compile matches (largest difference {differences['max_abs']:.3g})", figures


@check(NAME, timeout=300)
@torch_check(NAME)
def run(ctx, torch, target, start: float) -> Result:
    device = "cuda:0" if target.cuda else "cpu"
    if target.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = cnn(torch).to(device).eval()
    images = quadrant_batch(torch, BATCH, IMAGE)[0].to(device)
    with torch.inference_mode():
        reference = model(images)
    with private_cache():   # TorchInductor's kernels (and torch.onnx's dynamo exporter's files) in a private folder
        parts = {"compile": compile_part(torch, target, model, images, reference),
                 "onnx": onnx_part(torch, target, model, images, reference)}
    figures = {"device": target.describe(first_gpu=True), "batch": BATCH,
               "compared": [name for name, (status, _, _) in parts.items() if status != SKIP]}
    for _, _, part in parts.values():
        figures.update(part)
    thresholds = {"compile": TOLERANCES[(target.device, "compile")], "onnx": TOLERANCES[(target.device, "onnx")],
                  "provider": "CUDAExecutionProvider" if target.cuda else "CPUExecutionProvider"}
    statuses = [status for status, _, _ in parts.values()]
    status = FAIL if FAIL in statuses else PASS if PASS in statuses else SKIP   # a part not run hides no verdict
    reason = f"eager on {target.describe(first_gpu=True)}: " + "; ".join(message for _, message, _ in parts.values())
    return Result(NAME, status, reason, figures, thresholds, time.monotonic() - start)
