"""The validation results as a Prometheus textfile for node_exporter's textfile collector (the text exposition
format, standard library only: the suite writes it on the host from its idle-GPU timer, and the controller's
`invoke validate` writes the same through gpuprov.validation.report.prometheus_textfile).

    gpuprov_check_ok{host,check}                     1 pass; 0 fail, warn or skip
    gpuprov_check_status{host,check,status}          1 for the check's status (pass, fail, warn, skip)
    gpuprov_matmul_tflops{host,gpu,dtype}            and gpuprov_matmul_threshold_tflops{host,gpu,dtype}
    gpuprov_copy_gbps{host,gpu,direction}            and gpuprov_copy_threshold_gbps{host,gpu,direction}
    gpuprov_allreduce_busbw_gbps{host}
    gpuprov_validate_timestamp_seconds{host}

A threshold is the pass line the check judged against: the datasheet's figure times its threshold_pct.
"""

from __future__ import annotations

import math
import os
import tempfile

from .core import STATUSES

MATMUL = ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops")
COPY = ("d2d_gbs", "h2d_gbs", "d2h_gbs")
HELP = {
    "gpuprov_check_ok": "1 when the validation check passed; 0 when it failed, warned or was skipped",
    "gpuprov_check_status": "1 for the validation check's status (pass, fail, warn or skip)",
    "gpuprov_matmul_tflops": "Dense matmul throughput per GPU (TFLOP/s)",
    "gpuprov_matmul_threshold_tflops": "The matmul throughput a GPU must reach to pass (TFLOP/s)",
    "gpuprov_copy_gbps": "Copy bandwidth per GPU (GB/s): d2d on the device, h2d and d2h from pinned host memory",
    "gpuprov_copy_threshold_gbps": "The copy bandwidth a GPU must reach to pass (GB/s)",
    "gpuprov_allreduce_busbw_gbps": "NCCL all-reduce bus bandwidth across the host's GPUs (GB/s)",
    "gpuprov_validate_timestamp_seconds": "When gpuprov validate last judged the host (Unix time)",
}


def escape(value: str) -> str:
    """A label value as the exposition format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def exposition(samples: dict[str, list[tuple[dict[str, str], float]]], help_text: dict[str, str]) -> str:
    """Gauge families in the text format: # HELP, # TYPE and one line per sample, in the order given."""
    lines = []
    for name, rows in samples.items():
        lines += [f"# HELP {name} {help_text[name]}", f"# TYPE {name} gauge"]
        for labels, value in rows:
            inner = ",".join(f'{key}="{escape(str(text))}"' for key, text in labels.items())
            lines.append(f"{name}{{{inner}}} {_number(value)}" if inner else f"{name} {_number(value)}")
    return "\n".join(lines) + "\n"


def per_gpu(figures: dict, names: tuple[str, ...]):
    """(gpu label, figure name, value) for each GPU of a perf result: its `per_gpu` figures, given as
    {"0": {"bf16_tflops": ..}, ...} or as a list of such mappings (in GPU order, or with an "index"); without
    them the result's own figure (the minimum over GPUs) with gpu="all"."""
    rows = figures.get("per_gpu")
    if isinstance(rows, dict):
        rows = [(str(index), values) for index, values in rows.items()]
    elif isinstance(rows, list):
        rows = [(str(values.get("index", position)) if isinstance(values, dict) else str(position), values)
                for position, values in enumerate(rows)]
    else:
        rows = []
    found = [(label, name, float(values[name])) for label, values in rows if isinstance(values, dict)
             for name in names if _is_number(values.get(name))]
    return found or [("all", name, float(figures[name])) for name in names if _is_number(figures.get(name))]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _threshold(result: dict, figure: str) -> float | None:
    """The pass line of one figure: its expected value times threshold_pct, where the result recorded both."""
    thresholds = result.get("thresholds") or {}
    expected, pct = (thresholds.get("expected") or {}).get(figure), thresholds.get("threshold_pct")
    return float(expected) * float(pct) / 100 if _is_number(expected) and _is_number(pct) else None


def validation_textfile(host: str, results: list[dict], timestamp: float, failed_run: bool = False) -> str:
    """The textfile of one host's validation results (`failed_run`: the run itself failed: check `validation`
    fails)."""
    names = ("gpuprov_check_ok", "gpuprov_check_status", "gpuprov_matmul_tflops", "gpuprov_matmul_threshold_tflops",
             "gpuprov_copy_gbps", "gpuprov_copy_threshold_gbps", "gpuprov_allreduce_busbw_gbps",
             "gpuprov_validate_timestamp_seconds")
    samples: dict[str, list] = {name: [] for name in names}
    checks = [(item["check"], item["status"]) for item in results] + ([("validation", "fail")] if failed_run else [])
    for check, status in checks:
        samples["gpuprov_check_ok"].append(({"host": host, "check": check}, 1 if status == "pass" else 0))
        samples["gpuprov_check_status"] += [({"host": host, "check": check, "status": state}, int(state == status))
                                            for state in STATUSES]
    for item in results:
        figures = item.get("figures") or {}
        if item["check"] == "perf.matmul":
            _perf(samples, "matmul", "dtype", host, item, per_gpu(figures, MATMUL), "_tflops")
        elif item["check"] == "perf.copy":
            _perf(samples, "copy", "direction", host, item, per_gpu(figures, COPY), "_gbs")
        elif item["check"] == "perf.allreduce" and _is_number(figures.get("busbw_gbs")):
            samples["gpuprov_allreduce_busbw_gbps"].append(({"host": host}, float(figures["busbw_gbs"])))
    samples["gpuprov_validate_timestamp_seconds"].append(({"host": host}, float(timestamp)))
    return exposition(samples, HELP)


def _perf(samples: dict, kind: str, label: str, host: str, result: dict, rows: list, suffix: str) -> None:
    unit = "tflops" if kind == "matmul" else "gbps"
    for gpu, figure, value in rows:
        labels = {"host": host, "gpu": gpu, label: figure.removesuffix(suffix)}
        samples[f"gpuprov_{kind}_{unit}"].append((labels, value))
        line = _threshold(result, figure)
        if line is not None:
            samples[f"gpuprov_{kind}_threshold_{unit}"].append((labels, line))


def write_textfile(path: str, text: str) -> None:
    """Replace `path` atomically: a hidden temporary file in its folder (node_exporter reads only *.prom), renamed."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".gpuprov-", dir=folder)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
