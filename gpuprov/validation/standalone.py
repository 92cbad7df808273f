"""The validation suite on a bare GPU machine: the front end of the bundle `invoke validate.bundle` builds
(gpuprov.validation.bundle; its __main__.py refuses a Python before 3.9, then calls main here), run as
`python3 gpuprov-smoke.pyz [--level quick|burn-in] [--only CHECKS] ...`.

It needs nothing but Python 3.9 or newer (and torch, a CUDA build, for the GPU checks): no gpuprov, no PyYAML.
It finds the machine's GPUs (nvidia-smi; the PCI devices in sysfs where nvidia-smi cannot answer) and its
NVSwitches (NVIDIA PCI devices whose ids the GPU catalog names: /sys/bus/pci/devices/*/{vendor,device}, what
`lspci -n -d 10de:` lists, no lspci needed), takes the suite config the controller would send for that many GPUs
of that model with or without NVSwitch from the bundle's catalog.json (built from gpuprov/data/gpus.yaml by the
controller's own build_config), unpacks the suite into a private temporary folder (torchrun runs ddp_worker.py
as a file) and runs it there with this interpreter (`python -m smoke`). It prints every check's verdict and every
figure it measured, the judged ones against their expected figure (with its source) and the threshold; the
suite's JSON document goes to --json. Exit status: the suite's (0 all passed, 1 a check failed), 2 for bad
usage or a machine the bundle cannot describe.

This file runs on the hosts: standard library only, Python 3.9 and newer (vermin judges it in the tests).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import zipfile

CATALOG = "catalog.json"
SUITE = "smoke"
PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA = "0x10de"
GPU_QUERY = ("index", "name", "pci.device_id")
UNITS = {"tflops": "TFLOP/s", "gbs": "GB/s"}
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")   # suite_config.IMAGE_PATTERN
BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from smoke.runner import main; raise SystemExit(main())"


class UsageError(Exception):
    """Bad arguments, or a machine the bundle cannot describe: exit 2."""


# ------------------------------------------------------------------------------------------------ the machine

def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def pci_devices(root: str = PCI_DEVICES) -> list[dict]:
    """NVIDIA's PCI devices from sysfs: address, device id ("2330") and class ("0x030200")."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        folder = os.path.join(root, name)
        if read_text(os.path.join(folder, "vendor")) != NVIDIA:
            continue
        device = (read_text(os.path.join(folder, "device")) or "").lower()
        out.append({"address": name, "device": device[2:] if device.startswith("0x") else device,
                    "class": (read_text(os.path.join(folder, "class")) or "").lower()})
    return out


def pci_gpus(devices: list[dict]) -> list[dict]:
    """The GPUs among NVIDIA's PCI devices: PCI base class 03 (display controller: VGA 0300, 3D 0302)."""
    return [d for d in devices if d["class"].startswith("0x03")]


def nvswitches(devices: list[dict], catalog: dict) -> list[dict]:
    """The NVSwitches among NVIDIA's PCI devices (class 0x068000, "Bridge"), by the catalog's NVSwitch ids, as
    the controller counts them from lspci."""
    ids = set(catalog["nvswitch_pci_ids"])
    return [d for d in devices if d["device"] in ids]


def smi_gpus(timeout: float = 60.0) -> tuple[list[dict], str]:
    """The GPUs nvidia-smi lists (index, name, PCI device id), or [] and why not."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no nvidia-smi on PATH (no NVIDIA driver)"
    try:
        done = subprocess.run([smi, "--query-gpu=" + ",".join(GPU_QUERY), "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [], f"nvidia-smi did not answer within {timeout:g} s"
    if done.returncode != 0:
        text = (done.stdout + done.stderr).strip().splitlines()
        return [], f"nvidia-smi exited {done.returncode}: {text[0][:200] if text else 'no output'}"
    gpus = []
    for line in done.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != len(GPU_QUERY):
            continue
        device = parts[2].lower()
        gpus.append({"index": parts[0], "name": parts[1],
                     "device": device[2:6] if device.startswith("0x") else device[:4]})
    return gpus, "" if gpus else "nvidia-smi lists no GPU"


def find_model(catalog: dict, name: str | None, device: str | None) -> str | None:
    """The catalog key of a GPU by its nvidia-smi name (or a catalog key or alias), else by its PCI device id."""
    if name:
        key = catalog["names"].get(name.strip().casefold())
        if key:
            return key
    return catalog["pci_ids"].get((device or "").lower())


# ------------------------------------------------------------------------------------------------ the config

def topology(count: int | None, nvswitch: bool, catalog: dict) -> str:
    """The key of a topology in a model's stored configs: "8/nvswitch", "2/pcie" ("1/pcie" without a count; a
    count beyond the catalog's largest is stored under the largest)."""
    return f"{min(max(count or 1, 1), catalog['max_gpus'])}/{'nvswitch' if nvswitch else 'pcie'}"


def suite_config(catalog: dict, *, host: str, model: str | None, count: int | None, nvswitch: bool, level: str,
                 strict: bool, gpus_visible: bool, burn_in_seconds: float | None = None,
                 threshold_pct: float | None = None, image: str | None = None) -> dict:
    """The suite config the controller sends (suite_config.build_config) for this machine: the model's stored
    config and the figures of its topology, with this run's host, level and settings (`image`: the inventory's
    validate.image, which host.container starts)."""
    entry = catalog["models"][model] if model else catalog["no_model"]
    config = copy.deepcopy(entry["config"])
    for block, values in entry["topologies"].get(topology(count, nvswitch, catalog), {}).items():
        config[block].update(values)
    config["expect"].update(count=count, nvswitch=nvswitch)
    config.update(host=host, level=level, strict=strict, gpus_visible=gpus_visible, burn_in_seconds=burn_in_seconds,
                  container={"runtime": "docker", "image": image} if image else None)
    if threshold_pct is not None:
        config["threshold_pct"] = threshold_pct
    return config


def describe(catalog: dict, args, devices: list[dict] | None = None) -> tuple[dict, list[str]]:
    """The config for this machine and notes on how it was found."""
    notes = []
    gpus, why = smi_gpus()
    devices = pci_devices() if devices is None else devices
    on_pci = pci_gpus(devices)
    if why:
        notes.append(f"GPUs: {why}" + (f"; {len(on_pci)} NVIDIA GPU(s) on PCI" if on_pci else
                                        "; the suite runs on the CPU (its fallback), judged against no GPU"))
    if args.gpu:
        model = find_model(catalog, args.gpu, None)
        if model is None:
            raise UsageError(f"--gpu {args.gpu}: not a model of the GPU catalog (keys: "
                             f"{', '.join(sorted(catalog['models']))})")
    else:
        found = {find_model(catalog, g["name"], g["device"]) for g in gpus} or \
                {find_model(catalog, None, d["device"]) for d in on_pci}
        named = sorted({g["name"] for g in gpus} or {d["device"] for d in on_pci})
        if len(found) > 1:
            raise UsageError(f"GPUs of different models ({', '.join(named)}): give the model to judge with --gpu")
        model = found.pop() if found else None
        if named and model is None:
            notes.append(f"GPU {', '.join(named)}: not in the GPU catalog, so no figure is judged (name the "
                         "nearest model with --gpu to judge against it)")
    switches = nvswitches(devices, catalog)
    if args.nvswitch:
        nvswitch = args.nvswitch == "yes"
    else:
        nvswitch = bool(switches)
        if model and not catalog["models"][model]["nvswitch_on_pci"] and not switches:
            notes.append(f"{model}: its baseboard's NVSwitches are no PCI devices; on an HGX/DGX give "
                         "--nvswitch yes")
    found_by = "--nvswitch" if args.nvswitch else f"{len(switches)} NVSwitch PCI device(s) in {PCI_DEVICES}"
    notes.append(f"NVSwitch: {'yes' if nvswitch else 'no'} ({found_by})")
    count = len(gpus) or len(on_pci) or None
    config = suite_config(catalog, host=socket.gethostname(), model=model, count=count, nvswitch=nvswitch,
                          level=args.level, strict=args.strict, gpus_visible=bool(gpus),
                          burn_in_seconds=args.burn_in_seconds, threshold_pct=args.threshold_pct, image=args.image)
    return config, notes


# ------------------------------------------------------------------------------------------------ running it

def archive_path() -> str:
    """The bundle this file runs from."""
    folder = os.path.dirname(os.path.abspath(__file__))
    if not zipfile.is_zipfile(folder):
        raise UsageError(f"{__file__} is not inside a gpuprov-smoke bundle (build one with invoke validate.bundle)")
    return folder


def unpack(archive: str, folder: str) -> None:
    """The suite's files from the bundle into `folder` (a private temporary folder)."""
    with zipfile.ZipFile(archive) as bundle:
        for name in bundle.namelist():
            if not name.startswith(SUITE + "/") or name.endswith("/") or ".." in name.split("/"):
                continue
            target = os.path.join(folder, *name.split("/"))
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            with bundle.open(name) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)


def interpreter_flags() -> list[str]:
    """This interpreter's isolation flags, for the suite's interpreter (-I, -E, -s, -S)."""
    if sys.flags.isolated:
        return ["-I"] + (["-S"] if sys.flags.no_site else [])
    return [flag for flag, on in (("-E", sys.flags.ignore_environment), ("-s", sys.flags.no_user_site),
                                  ("-S", sys.flags.no_site)) if on]


def run_suite(archive: str, config: dict, args) -> tuple[int, dict | None, str]:
    """The suite in a private temporary folder: its exit status, its document (None when it printed none) and
    the last of what it printed on stdout."""
    folder = tempfile.mkdtemp(prefix="gpuprov-bundle-")
    process = None
    try:
        unpack(archive, folder)
        path = os.path.join(folder, "config.json")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=1)
        argv = [sys.executable, *interpreter_flags(), "-c", BOOT, folder, "--config", path, "--level", args.level,
                *(["--strict"] if args.strict else []), *(["--only", args.only] if args.only else []),
                *(["--textfile", os.path.abspath(args.textfile)] if args.textfile else [])]   # the runner's cwd: folder
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=folder)
        out, _ = process.communicate()
    finally:
        if process is not None and process.poll() is None:   # stopped: the runner takes its running check down
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)
    lines = out.strip().splitlines()
    try:
        document = json.loads(lines[-1]) if lines else None
    except ValueError:
        document = None
    return process.returncode, document if isinstance(document, dict) else None, "\n".join(lines[-5:])


# ------------------------------------------------------------------------------------------------ the report

def _shown(value) -> str:
    text = f"{value:g}" if isinstance(value, float) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 240 else text[:237] + "..."


def figure_lines(result: dict) -> list[str]:
    """Every figure of one result; a judged one against its expected figure, the threshold and the source."""
    thresholds = result.get("thresholds") or {}
    expected, basis = thresholds.get("expected") or {}, thresholds.get("expected_basis") or {}
    lines = []
    for figure, value in (result.get("figures") or {}).items():
        if figure == "per_gpu" and isinstance(value, dict):   # a line per GPU (best matmul shapes, copies)
            lines += [f"    per_gpu {gpu}: {_shown(row)}" for gpu, row in value.items()]
            continue
        line = f"    {figure}: {_shown(value)}"
        unit = UNITS.get(figure.rsplit("_", 1)[-1], "")
        if unit and isinstance(value, (int, float)):
            line += f" {unit}"
            reference = expected.get(figure)
            if isinstance(reference, (int, float)) and reference:
                line += (f" = {100 * value / reference:.1f} % of the expected {reference:g} {unit} (needs "
                         f"{thresholds.get('threshold_pct', 0):g} %; {basis.get(figure, 'no source recorded')})")
            elif figure in expected:
                line += " (nothing expected of this GPU here: not judged)"
        lines.append(line)
    return lines


def report(document: dict, config: dict, notes: list[str]) -> str:
    expect = config["expect"]
    versions = document.get("versions") or {}
    gpus = f"{expect['count']} x {expect.get('gpu') or 'GPU not in the catalog'}" if expect.get("count") else \
        "no GPU (the CPU fallback)"
    head = [f"gpuprov-smoke on {document.get('host')}: {gpus} ({'with' if expect.get('nvswitch') else 'no'} "
            f"NVSwitch), level {document.get('level')}, {document.get('seconds', 0):.1f} s",
            "versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v is not None),
            *(f"note: {note}" for note in notes)]
    body = []
    for result in document.get("results") or []:
        body.append(f"{result.get('status', '?').upper():4} {result.get('check')} ({result.get('seconds', 0):.1f} s):"
                    f" {result.get('reason')}")
        body += figure_lines(result)
    counts = {}
    for result in document.get("results") or []:
        counts[result.get("status")] = counts.get(result.get("status"), 0) + 1
    tail = "checks: " + ", ".join(f"{counts[s]} {s}" for s in ("pass", "warn", "skip", "fail") if s in counts)
    return "\n".join([*head, *body, tail]) + "\n"


# ------------------------------------------------------------------------------------------------ main

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuprov-smoke.pyz", description="gpuprov's validation suite on this "
                                     "machine, without gpuprov (see bench/README.md)")
    parser.add_argument("--level", choices=("quick", "burn-in"), default="quick")
    parser.add_argument("--burn-in-seconds", type=float, help="load time of the burn-in (default 60)")
    parser.add_argument("--only", help="comma-separated check names or group prefixes (host, perf, ...)")
    parser.add_argument("--strict", action="store_true", help="skip and warn count as fail")
    parser.add_argument("--gpu", help="judge against this catalog model (default: the one nvidia-smi names)")
    parser.add_argument("--nvswitch", choices=("yes", "no"), help="override the NVSwitch PCI devices found")
    parser.add_argument("--threshold-pct", type=float, help="percent of the expected figures needed (default 80)")
    parser.add_argument("--image", help="host.container: this image (docker run --gpus all) must see every GPU")
    parser.add_argument("--json", help="write the suite's JSON document here ('-': stdout, the report on stderr)")
    parser.add_argument("--textfile", help="also write a Prometheus textfile here")
    parser.add_argument("--print-config", action="store_true", help="print the suite config and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    say = sys.stderr if args.json == "-" else sys.stdout
    try:
        if args.burn_in_seconds is not None and not 0 < args.burn_in_seconds <= 366 * 86400:
            raise UsageError(f"--burn-in-seconds {args.burn_in_seconds:g}: must be above 0 and at most a year")
        if args.threshold_pct is not None and not 0 < args.threshold_pct <= 100:
            raise UsageError(f"--threshold-pct {args.threshold_pct:g}: must be above 0 and at most 100")
        if args.image is not None and not IMAGE.fullmatch(args.image):
            raise UsageError(f"--image {args.image!r}: must be an image reference like repo/name:tag")
        archive = archive_path()
        with zipfile.ZipFile(archive) as bundle:
            catalog = json.loads(bundle.read(CATALOG))
        config, notes = describe(catalog, args)
    except UsageError as exc:
        print(f"gpuprov-smoke: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(config, indent=1, sort_keys=True))
        return 0
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        rc, document, tail = run_suite(archive, config, args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if document is None:
        print(f"gpuprov-smoke: the suite (exit {rc}) printed no result document" + (f": {tail}" if tail else ""),
              file=sys.stderr)
        return rc or 2
    if args.json == "-":
        sys.stdout.write(json.dumps(document) + "\n")
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
    say.write(report(document, config, [*notes, f"catalog: {catalog['source']}"]))
    say.flush()
    return rc
