"""The whole validation suite on this machine's GPUs, without SSH: `bench/gpu_check.sh` (see bench/README.md).

The suite config is the one `invoke validate` would write for this machine (gpuprov.validation.suite_config.
build_config): the GPU model the catalog names for what nvidia-smi reports, their count, NVSwitches when lspci shows
them, the expected (published, measured) figures, the datasheet and the 80 % threshold; no provisioned stack, so the
driver is judged for a driver/library mismatch only. The suite runs from this checkout (`python -m gpuprov.smoke`,
the same code validate copies to hosts) with this Python, which must have torch; then the reports are written as
validate writes them (JSON, JUnit, Prometheus textfile) into bench/results/, the performance figures are printed as
a percentage of the expected figure (with its source) and of the datasheet, and the check table comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
LIMIT_S = 300   # the issue: the whole suite on one machine with GPUs in under 5 minutes


def nvidia_smi(*args: str) -> str:
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("gpu_check: no nvidia-smi on PATH: this machine has no NVIDIA driver")
    done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gpu_check: nvidia-smi {' '.join(args)} failed (exit {done.returncode}): "
                         f"{(done.stdout + done.stderr).strip()[:300]}")
    return done.stdout


def machine_facts() -> tuple[dict, list[dict], int]:
    """What build_config reads from facts: nvidia-smi's GPUs, the PCI GPUs; and the NVSwitches lspci lists."""
    gpus = []
    for line in nvidia_smi("--query-gpu=index,name,uuid,pci.device_id,driver_version",
                           "--format=csv,noheader,nounits").splitlines():
        index, name, uuid, device, driver = (part.strip() for part in line.split(","))
        gpus.append({"index": int(index), "name": name, "uuid": uuid, "device_id": device[2:6].lower(),
                     "driver_version": driver})
    switches = 0
    if shutil.which("lspci"):
        from gpuprov.catalog import is_nvswitch

        listing = subprocess.run(["lspci", "-n", "-d", "10de:"], capture_output=True, text=True, check=False).stdout
        switches = sum(1 for line in listing.splitlines() if len(line.split()) >= 3
                       and is_nvswitch(line.split()[2].split(":")[-1]))
    smi = {"driver_version": gpus[0]["driver_version"] if gpus else None, "gpus": gpus}
    return smi, [{"device_id": g["device_id"]} for g in gpus], switches


def build(level: str, image: str | None) -> tuple[dict, object]:
    """The suite config for this machine, and its catalog model."""
    from gpuprov.catalog import find
    from gpuprov.inventory import Host
    from gpuprov.validation.suite_config import build_config, validate_vars

    smi, pci, switches = machine_facts()
    if not smi["gpus"]:
        raise SystemExit("gpu_check: nvidia-smi lists no GPU")
    names = sorted({g["name"] for g in smi["gpus"]})
    model = find(names[0])
    if model is None or len(names) > 1:
        raise SystemExit(f"gpu_check: the GPU catalog (gpuprov/data/gpus.yaml) has no single model for {names}")
    hardware = {"gpu": model.key, "count": len(smi["gpus"]), "nvswitch": switches > 0}
    host = Host(name=socket.gethostname(), address="127.0.0.1", vars={"hardware": hardware,
                                                                       **({"validate": {"image": image}} if image
                                                                          else {})})
    config = build_config(host, {"nvidia_smi": smi, "pci_gpus": pci}, None, validate_vars(host), level=level)
    return config, model


def percentages(results: list[dict], config: dict) -> list[str]:
    """The perf figures as a percentage of the model's expected figure (published measurements, with the basis the
    config records) and of the datasheet (copies against the memory bandwidth and the PCIe link)."""
    sheet, expected, basis = config["datasheet"], config.get("expected") or {}, config.get("expected_basis") or {}
    lines = []
    by_check = {r["check"]: r["figures"] for r in results}
    against = {"perf.matmul": [("bf16_tflops", "bf16_tflops", "TFLOP/s"), ("fp16_tflops", "fp16_tflops", "TFLOP/s"),
                               ("tf32_tflops", "tf32_tflops", "TFLOP/s")],
               "perf.copy": [("d2d_gbs", "mem_bw_gbs", "GB/s"), ("h2d_gbs", "pcie_gbs", "GB/s"),
                             ("d2h_gbs", "pcie_gbs", "GB/s")],
               "perf.allreduce": [("allreduce_busbw_gbs", None, "GB/s")]}
    for check, pairs in against.items():
        if str((by_check.get(check) or {}).get("device", "")).startswith("CPU"):
            lines.append(f"{check}: measured on the CPU (torch sees no GPU), not a percentage of any GPU figure")
            continue
        for figure, datasheet, unit in pairs:
            value = (by_check.get(check) or {}).get(figure)
            if not isinstance(value, (int, float)):
                continue
            parts = [f"{check} {figure}: {value:g} {unit}"]
            if expected.get(figure):
                parts.append(f"{100 * value / expected[figure]:.1f}% of the expected {expected[figure]:g} "
                             f"({basis.get(figure, 'no basis recorded')})")
            if datasheet and sheet.get(datasheet):
                parts.append(f"{100 * value / sheet[datasheet]:.1f}% of the datasheet's {sheet[datasheet]:g} "
                             f"({datasheet})")
            lines.append(" = ".join(parts[:1]) + (" = " + "; ".join(parts[1:]) if parts[1:] else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick", choices=("quick", "burn-in"))
    parser.add_argument("--only", help="comma list of checks (default: every check of the level)")
    parser.add_argument("--image", help="also check that this container image sees every GPU (host.container)")
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args(argv)

    from gpuprov import report as reports
    from gpuprov.validation.host import HostValidation, exit_code
    from gpuprov.validation.suite import parse_document

    config, model = build(args.level, args.image)
    config["strict"] = args.strict
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config, indent=2))
        command = [sys.executable, "-m", "gpuprov.smoke", "--config", str(path), "--level", args.level,
                   *(["--strict"] if args.strict else []), *(["--only", args.only] if args.only else [])]
        print(f"gpu_check: {config['expect']['count']} x {model.key}; "
              f"{' '.join(command[1:])}", file=sys.stderr, flush=True)
        started, began = time.time(), time.monotonic()
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})   # progress on stderr as it runs
        wall = time.monotonic() - began
    document = parse_document(config["host"], done.stdout, "", done.returncode, " ".join(command))
    run = HostValidation(config["host"], address="127.0.0.1", level=args.level, strict=args.strict,
                         gpu=model.key, started=started, seconds=wall, config=config,
                         env={"mode": "local", "python": sys.executable}, versions=document["versions"],
                         suite_seconds=document["seconds"], results=document["results"])
    entry = run.to_dict()
    finished = time.time()
    payload = {"tool": "bench/gpu_check.sh", "level": args.level, "wall_s": round(wall, 1), "limit_s": LIMIT_S,
               "percentages": percentages(entry["results"], config), "hosts": [entry],
               "finished_epoch": finished}
    report = reports.write_json_report(RESULTS, "gpu-check", payload)
    junit = reports.write_report_sibling(report, "gpu-check", ".xml", reports.junit_report([entry]))
    textfile = reports.write_report_sibling(report, "gpu-check", ".prom", reports.prometheus_textfile(entry, finished))
    print(f"versions: {json.dumps(entry['versions'], sort_keys=True)}")
    for line in payload["percentages"]:
        print(line)
    print(f"report: {report}\njunit: {junit}\ntextfile: {textfile}")
    print(f"whole suite: {wall:.1f} s wall ({'under' if wall < LIMIT_S else 'OVER'} the {LIMIT_S} s target)")
    reports.validate_tables([entry])   # the table last
    return exit_code([entry])


if __name__ == "__main__":
    sys.exit(main())
