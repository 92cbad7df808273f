"""The burn-in level's sustained load, judged on its own terms: every GPU runs matmuls at once for the burn-in
time while nvidia-smi is read every few seconds (SM clock, power, temperature, the active clock event reasons).
A GPU fails when its throughput over the last third drops more than MAX_DROP_PCT below its first minute, or when
a slowdown reason that means heat or a power fault (SLOWDOWN) was active under the load; the SW power cap, which a
datacenter GPU reaches under a heavy matmul by design, is recorded only. Without nvidia-smi's readings the drop is
still judged and the figures say why the readings are missing.
"""

from __future__ import annotations

import statistics
import threading
import time

from . import nvsmi

MAX_DROP_PCT = 10.0         # the last third may be this much slower than the first minute (outlier_pct's default)
FIRST_SECONDS = 60.0        # "the first minute" (the first third when the load is shorter than three minutes)
SAMPLE_SECONDS = 5.0
CHUNK_MATMULS = 10
TELEMETRY = ("index", "clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")   # new name, before driver 535
# NVML's nvmlClocksEventReason* bits (nvml.h; nvidia-smi prints the active mask as hex)
REASON_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
               0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
               0x80: "hw_power_brake_slowdown", 0x100: "display_clocks_setting"}
SLOWDOWN = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def reasons(mask: str | None) -> list[str] | None:
    """The reason names of nvidia-smi's active mask ("0x0000000000000004" -> ["sw_power_cap"])."""
    text = nvsmi.value(mask)
    if text is None:
        return None
    try:
        bits = int(text, 16)
    except ValueError:
        return None
    return [name for bit, name in REASON_BITS.items() if bits & bit]


def read_telemetry(ctx) -> tuple[list[dict], str]:
    """One reading of every GPU (numbers, or None where nvidia-smi has none), or [] and why not."""
    why = ""
    for field in REASON_FIELDS:
        fields = (*TELEMETRY, field)
        rc, out, err = ctx.run([nvsmi.SMI, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                               timeout=15)
        if rc != 0:
            why = f"nvidia-smi --query-gpu exited {rc}: {(err or out).strip()[:200]}"
            continue
        try:
            rows = nvsmi.parse_query_csv(out, fields)
        except nvsmi.SmiError as exc:
            return [], exc.message
        return [{"index": nvsmi.value(row["index"]), "sm_clock_mhz": nvsmi.number(row["clocks.sm"]),
                 "max_sm_clock_mhz": nvsmi.number(row["clocks.max.sm"]), "power_w": nvsmi.number(row["power.draw"]),
                 "power_limit_w": nvsmi.number(row["power.limit"]),
                 "temperature_c": nvsmi.number(row["temperature.gpu"]), "reasons": reasons(row[field])}
                for row in rows], ""
    return [], why


def load_gpu(torch, index: int, n: int, dtype, seconds: float, randn) -> list[tuple[float, float]]:
    """Matmuls on GPU `index` for `seconds`: (seconds since the start, seconds one matmul took) per chunk."""
    with torch.cuda.device(index):
        device = f"cuda:{index}"
        a, b = randn(torch, (n, n), index, device, dtype), randn(torch, (n, n), index + 100, device, dtype)
        out = torch.empty((n, n), device=device, dtype=dtype)
        chunks: list[tuple[float, float]] = []
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(CHUNK_MATMULS):
                torch.matmul(a, b, out=out)
            end.record()
            end.synchronize()
            chunks.append((time.monotonic() - began, start.elapsed_time(end) / 1000.0 / CHUNK_MATMULS))
        return chunks


def drop(chunks: list[tuple[float, float]], n: int, seconds: float) -> dict:
    """TFLOP/s of the first minute and of the last third (median of chunks), and the drop between them."""
    first_end = min(FIRST_SECONDS, seconds / 3)
    first = [took for at, took in chunks if at <= first_end] or [took for _, took in chunks[:1]]
    last = [took for at, took in chunks if at >= seconds * 2 / 3] or [took for _, took in chunks[-1:]]
    first_tflops = 2.0 * n**3 / statistics.median(first) / 1e12
    last_tflops = 2.0 * n**3 / statistics.median(last) / 1e12
    return {"first_minute_tflops": round(first_tflops, 2), "last_third_tflops": round(last_tflops, 2),
            "drop_pct": round(100.0 * (1 - last_tflops / first_tflops), 1), "chunks": len(chunks)}


def summarize(readings: list[list[dict]], index: str) -> dict:
    """One GPU's readings under load: SM clock, power and temperature (min, median, max) and the reasons seen."""
    rows = [row for reading in readings for row in reading if row["index"] == index]
    out: dict = {"samples": len(rows)}
    for key in ("sm_clock_mhz", "power_w", "temperature_c"):
        values = [row[key] for row in rows if row[key] is not None]
        if values:
            out[key] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    limits = [row["power_limit_w"] for row in rows if row["power_limit_w"] is not None]
    clocks = [row["max_sm_clock_mhz"] for row in rows if row["max_sm_clock_mhz"] is not None]
    if limits:
        out["power_limit_w"] = max(limits)
    if clocks:
        out["max_sm_clock_mhz"] = max(clocks)
    seen = sorted({name for row in rows for name in (row["reasons"] or ())})
    out["reasons"] = seen
    return out


def verdict(index: int, figures: dict) -> list[str]:
    """One GPU's failures under sustained load: a drop beyond MAX_DROP_PCT, a SLOWDOWN reason seen active."""
    failures = []
    if figures["drop_pct"] > MAX_DROP_PCT:
        failures.append(f"GPU {index} sustained matmul fell {figures['drop_pct']:g} % from its first minute "
                        f"({figures['first_minute_tflops']:g} -> {figures['last_third_tflops']:g} TFLOP/s over the "
                        f"last third; at most {MAX_DROP_PCT:g} % allowed)")
    slow = [name for name in figures.get("reasons", ()) if name in SLOWDOWN]
    if slow:
        failures.append(f"GPU {index} slowed down under sustained load: {', '.join(slow)} active (temperature up "
                        f"to {(figures.get('temperature_c') or {}).get('max')} C, power up to "
                        f"{(figures.get('power_w') or {}).get('max')} W)")
    return failures


def sustained(ctx, torch, gpus: int, n: int, dtype, seconds: float, randn) -> tuple[dict, list[str]]:
    """Every GPU under load at once for `seconds`, read by nvidia-smi meanwhile: each GPU's figures (throughput
    over the last third, the drop from the first minute, clocks, power, reasons) and the failures."""
    results: dict[int, list] = {}
    errors: list[str] = []

    def run(index: int) -> None:
        try:
            results[index] = load_gpu(torch, index, n, dtype, seconds, randn)
        except Exception as exc:
            errors.append(f"GPU {index}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(gpus)]
    for thread in threads:
        thread.start()
    readings: list[list[dict]] = []
    why = ""
    while any(thread.is_alive() for thread in threads):
        reading, why = read_telemetry(ctx)
        if reading:
            readings.append(reading)
        for thread in threads:
            thread.join(timeout=SAMPLE_SECONDS / max(1, len(threads)))
    if errors:
        raise RuntimeError("; ".join(errors))
    per_gpu: dict[str, dict] = {}
    failures: list[str] = []
    for index, chunks in sorted(results.items()):
        figures = {**drop(chunks, n, seconds), **(summarize(readings, str(index)) if readings else {})}
        per_gpu[str(index)] = figures
        failures += verdict(index, figures)
    report = {"seconds": round(seconds, 1), "max_drop_pct": MAX_DROP_PCT, "telemetry_samples": len(readings),
              "per_gpu": per_gpu}
    if not readings:
        report["telemetry"] = why or "no nvidia-smi reading"
    return report, failures
