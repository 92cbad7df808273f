"""Reading nvidia-smi: the four invocations the suite makes, their parsers, and how a failed call is reported.

The suite reads nvidia-smi only through these commands (never its human table), so a simulated nvidia-smi (the
lab's) must answer exactly them:

1. ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` where FIELDS is, comma-joined in this order::

       index,pci.bus_id,uuid,name,driver_version,memory.total,compute_cap,persistence_mode,ecc.mode.current,
       ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,retired_pages.pending,
       mig.mode.current

   One line per GPU, values separated by ", ", no header, no units (``memory.total`` in MiB as a bare number);
   a value a GPU does not have prints as ``[N/A]`` (``[Not Supported]`` on some fields and drivers). Used by
   host.gpus, host.driver, host.persistence, host.ecc, sizing and the runner's recorded versions.
2. ``nvidia-smi -q -x``: the full XML report (DTD ``nvsmi_device_v11``/``v12``). Read per ``<gpu id=BUS>``:
   ``product_name``, ``uuid``, ``persistence_mode``, ``fb_memory_usage/total``, ``mig_mode/current_mig``,
   ``pci/pci_gpu_link_info/{pcie_gen/{max_link_gen,current_link_gen},link_widths/{max_link_width,current_link_width}}``,
   ``ecc_mode/current_ecc``, ``ecc_errors/{volatile,aggregate}/*uncorrectable*``, ``retired_pages/pending_retirement``,
   ``remapped_rows/{remapped_row_corr,remapped_row_unc,remapped_row_pending,remapped_row_failure}`` (or the text
   ``N/A``), ``clocks_event_reasons/clocks_event_reason_*`` (``clocks_throttle_reasons/clocks_throttle_reason_*``
   before driver 535), ``fabric/{state,status}``, ``processes/process_info/{pid,type,process_name,used_memory}``;
   and at the top ``driver_version``, ``cuda_version``, ``attached_gpus``. Used by host.gpus (processes),
   host.ecc (row remapping), host.pcie, host.clocks and host.fabric; and by the controller's facts
   (gpuprov.facts.parsers.parse_nvidia_smi_xml reads the host's ``-q -x`` with :func:`parse_q_xml`).
3. ``nvidia-smi nvlink -s``: per GPU a ``GPU i: NAME (UUID: ...)`` line, then ``Link n: 26.562 GB/s`` or
   ``Link n: <inactive>`` lines, or a one-line message (``NVML: Unable to retrieve NVLink information as all links
   are inactive``, ``Device does not have or support Nvlink``, ``Nvlink queries are not supported for Devices in
   MIG mode``). Used by host.nvlink.
4. ``nvidia-smi -L``: ``GPU i: NAME (UUID: GPU-...)`` per GPU (MIG devices indented below). Run inside the
   container by host.container, and on the host to compare.

A failing nvidia-smi prints one of NVIDIA's messages instead (``Failed to initialize NVML: Driver/library version
mismatch``; ``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver``; ``No devices were
found``); :func:`classify_failure` names which, and :func:`unavailable` turns it into a result: the check that owns
the cause (host.driver for a missing or mismatched driver, host.gpus for no devices) fails, the others skip with
a reason that points at it, so one fault fails one check.

MIG: `mig.mode.current` says which GPUs are in MIG mode (:func:`mig_gpus`; train.ddp skips there, a CUDA process
seeing one MIG instance). A CUDA device named `NAME MIG <profile>` is a MIG instance: :func:`mig_judgement` gives
its share of the GPU from NVIDIA's MIG profile table (compute slices of 7, or of 4 or 2 on the GPUs that have
fewer), against which perf.matmul judges it; perf.copy, whose figures follow memory slices, skips it.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from .core import FAIL, SKIP, Result

SMI = "nvidia-smi"

QUERY_FIELDS = (
    "index",
    "pci.bus_id",
    "uuid",
    "name",
    "driver_version",
    "memory.total",
    "compute_cap",
    "persistence_mode",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
    "mig.mode.current",
)

QUERY_ARGV = [SMI, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]
XML_ARGV = [SMI, "-q", "-x"]
NVLINK_ARGV = [SMI, "nvlink", "-s"]
LIST_ARGV = [SMI, "-L"]

# Values nvidia-smi prints where a GPU has no value for a field.
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "[GPU requires reset]",
                 "[Insufficient Permissions]", "")


class SmiError(Exception):
    """nvidia-smi did not answer: `kind` is missing | mismatch | no_driver | no_devices | timeout | failed."""

    def __init__(self, kind: str, message: str, argv: list[str] | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.argv = argv or []


def value(raw: str | None) -> str | None:
    """A field's value, None where nvidia-smi printed N/A or an error marker."""
    if raw is None:
        return None
    text = raw.strip()
    return None if text in NOT_AVAILABLE else text


def number(raw: str | None) -> float | None:
    """A field as a number (units already stripped), None when absent or not numeric."""
    text = value(raw)
    if text is None:
        return None
    match = re.match(r"^-?\d+(?:\.\d+)?", text)
    return float(match.group(0)) if match else None


def _rows(text: str) -> list[list[str]]:
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    return [[cell.strip() for cell in row] for row in reader if row and any(cell.strip() for cell in row)]


def parse_query_csv(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[dict[str, str]]:
    """`--query-gpu=FIELDS --format=csv,noheader,nounits` output: one dict per GPU, keyed by field name."""
    out = []
    for number_, row in enumerate(_rows(text), 1):
        if len(row) != len(fields):
            raise SmiError("failed", f"nvidia-smi --query-gpu line {number_} has {len(row)} values for "
                                     f"{len(fields)} fields: {', '.join(row)[:200]}")
        out.append(dict(zip(fields, row)))  # lengths checked above (zip's strict= is Python 3.10+)
    return out


_UNIT = re.compile(r"^(?P<name>.+?)\s*\[(?P<unit>[^\]]+)\]$")


def parse_query_csv_with_header(text: str) -> list[dict[str, str]]:
    """`--query-gpu=... --format=csv` output (header row, values with units): one dict per GPU keyed by the
    field name with its unit removed (`memory.total [MiB]` -> `memory.total`), values without the unit
    (`81559 MiB` -> `81559`), as `--format=csv,noheader,nounits` would print them."""
    rows = _rows(text)
    if not rows:
        return []
    names, units = [], []
    for cell in rows[0]:
        match = _UNIT.match(cell)
        names.append(match.group("name") if match else cell)
        units.append(match.group("unit") if match else None)
    out = []
    for row in rows[1:]:
        if len(row) != len(names):
            raise SmiError("failed", f"nvidia-smi --query-gpu row has {len(row)} values for {len(names)} columns")
        entry = {}
        for name, unit, cell in zip(names, units, row):  # lengths checked above (strict= is Python 3.10+)
            if unit and cell.endswith(" " + unit):
                cell = cell[: -len(unit) - 1]
            entry[name] = cell
        out.append(entry)
    return out


def classify_failure(rc: int, out: str, err: str) -> SmiError:
    """Name why an nvidia-smi call failed, from its exit code and NVIDIA's messages."""
    text = (out + "\n" + err).strip()
    last = next((line.strip() for line in text.splitlines() if line.strip()), "") if text else ""
    if rc == 127:
        return SmiError("missing", "nvidia-smi not found: the NVIDIA driver's user-space tools are not installed")
    if rc == 124:
        return SmiError("timeout", err.strip() or "nvidia-smi timed out")
    if "Driver/library version mismatch" in text:
        lib = re.search(r"NVML library version:\s*(\S+)", text)
        return SmiError("mismatch", "driver/library version mismatch: the loaded kernel module differs from the "
                                    "user-space NVML library" + (f" ({lib.group(1)})" if lib else "")
                                    + "; reboot or reload the nvidia module")
    if "couldn't communicate with the NVIDIA driver" in text or "NVIDIA driver is not loaded" in text:
        return SmiError("no_driver", "nvidia-smi cannot communicate with the NVIDIA driver (kernel module not "
                                     "loaded)")
    if "No devices were found" in text:
        return SmiError("no_devices", "nvidia-smi: No devices were found")
    return SmiError("failed", f"nvidia-smi exited {rc}: {last[:300]}")


def _call(ctx, argv: list[str], timeout: float) -> str:
    rc, out, err = ctx.run(argv, timeout=timeout)
    if rc != 0:
        error = classify_failure(rc, out, err)
        error.argv = argv
        raise error
    return out


def query(ctx, timeout: float = 30.0) -> list[dict[str, str]]:
    """Run the suite's one `--query-gpu` invocation; raises SmiError."""
    rows = parse_query_csv(_call(ctx, QUERY_ARGV, timeout))
    if not rows:
        raise SmiError("no_devices", "nvidia-smi --query-gpu listed no GPU")
    return rows


def query_xml(ctx, timeout: float = 60.0) -> dict[str, Any]:
    """Run `nvidia-smi -q -x` and parse it; raises SmiError."""
    text = _call(ctx, XML_ARGV, timeout)
    try:
        return parse_q_xml(text)
    except ET.ParseError as exc:
        raise SmiError("failed", f"nvidia-smi -q -x printed no valid XML ({exc})", XML_ARGV) from exc


# The owner of each failure kind: that check fails, the others skip and point at it.
OWNER = {"missing": "host.driver", "mismatch": "host.driver", "no_driver": "host.driver",
         "no_devices": "host.gpus"}


def gpus_expected(ctx) -> bool:
    """Whether the controller says this host has GPUs (expected count, or its facts)."""
    return bool(ctx.expect("count") or ctx.config.get("gpus_visible"))


def unavailable(ctx, check: str, error: SmiError, seconds: float = 0.0) -> Result:
    """The result of a check whose nvidia-smi call failed (see the module docstring)."""
    figures = {"nvidia_smi_error": error.kind}
    if error.kind == "missing" and not gpus_expected(ctx):
        return Result(check, SKIP, "no GPU expected on this host and nvidia-smi is not installed", figures,
                      seconds=seconds)
    owner = OWNER.get(error.kind)
    if owner and owner != check:
        return Result(check, SKIP, f"cannot query the GPUs ({error.message}); judged by {owner}", figures,
                      seconds=seconds)
    return Result(check, FAIL, error.message, figures, seconds=seconds)


def smi_check(name: str):
    """The nvidia-smi error path of a check, as a decorator: `body(ctx, start)` runs, and an SmiError it raises
    (from query, query_xml, load.sample_xml or a `raise classify_failure(...)`) becomes `unavailable`."""

    def wrap(body: Callable[[Any, float], Result]) -> Callable[[Any], Result]:
        @functools.wraps(body)
        def run(ctx) -> Result:
            start = time.monotonic()
            try:
                return body(ctx, start)
            except SmiError as error:
                return unavailable(ctx, name, error, time.monotonic() - start)

        return run

    return wrap


# ---- -q -x ----------------------------------------------------------------------------------------------------


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    match = re.match(r"^(\d+)", text.strip())
    return int(match.group(1)) if match else None


def _uncorrectable(node: ET.Element | None) -> int | None:
    """Sum of the `*uncorrectable*` counters of an ecc_errors/volatile or aggregate block (None: all N/A)."""
    if node is None:
        return None
    counts = [_int(child.text) for child in node if "uncorrectable" in child.tag]
    counts = [c for c in counts if c is not None]
    return sum(counts) if counts else None


def _reasons(gpu: ET.Element) -> dict[str, bool] | None:
    """Clock event (throttle) reasons: reason name -> active, both the current and the pre-535 element names."""
    for block, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                          ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        node = gpu.find(block)
        if node is not None:
            out = {}
            for child in node:
                name = child.tag.removeprefix(prefix)
                text = (child.text or "").strip()
                if text in ("Active", "Not Active"):
                    out[name] = text == "Active"
            return out
    return None


def _remapped(gpu: ET.Element) -> dict[str, Any] | None:
    node = gpu.find("remapped_rows")
    if node is None or len(node) == 0:
        return None  # "N/A": not supported (pre-Ampere) or not readable (MIG enabled)
    return {
        "correctable": _int(_text(node, "remapped_row_corr")),
        "uncorrectable": _int(_text(node, "remapped_row_unc")),
        "pending": _text(node, "remapped_row_pending"),
        "failure": _text(node, "remapped_row_failure"),
    }


def _processes(gpu: ET.Element) -> list[dict[str, Any]]:
    node = gpu.find("processes")
    if node is None:
        return []
    out = []
    for proc in node.findall("process_info"):
        out.append({"pid": _int(_text(proc, "pid")), "type": _text(proc, "type"),
                    "name": _text(proc, "process_name"), "used_mib": _int(_text(proc, "used_memory"))})
    return out


def parse_q_xml(text: str) -> dict[str, Any]:
    """`nvidia-smi -q -x`: the top-level versions and one dict per `<gpu>` (see the module docstring)."""
    root = ET.fromstring(text.strip().encode())
    gpus = []
    for gpu in root.findall("gpu"):
        link = gpu.find("pci/pci_gpu_link_info")
        fabric = gpu.find("fabric")
        gpus.append({
            "bus_id": gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
            "name": _text(gpu, "product_name"),
            "uuid": _text(gpu, "uuid"),
            "persistence_mode": _text(gpu, "persistence_mode"),
            "memory_total_mib": _int(_text(gpu, "fb_memory_usage/total")),
            "mig_mode": _text(gpu, "mig_mode/current_mig"),
            "pcie": {
                "max_gen": _int(_text(link, "pcie_gen/max_link_gen")),
                "current_gen": _int(_text(link, "pcie_gen/current_link_gen")),
                "max_width": _int(_text(link, "link_widths/max_link_width")),
                "current_width": _int(_text(link, "link_widths/current_link_width")),
            },
            "ecc_mode": _text(gpu, "ecc_mode/current_ecc"),
            "uncorrectable_volatile": _uncorrectable(gpu.find("ecc_errors/volatile")),
            "uncorrectable_aggregate": _uncorrectable(gpu.find("ecc_errors/aggregate")),
            "sram_uncorrectable_aggregate": _int(_text(gpu, "ecc_errors/aggregate/sram_uncorrectable")),
            "retired_pending": _text(gpu, "retired_pages/pending_retirement"),
            "remapped_rows": _remapped(gpu),
            "clock_reasons": _reasons(gpu),
            "fabric": None if fabric is None else {"state": _text(fabric, "state"),
                                                    "status": _text(fabric, "status")},
            "processes": _processes(gpu),
        })
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": _int(_text(root, "attached_gpus")),
        "gpus": gpus,
    }


# ---- nvlink -s and -L --------------------------------------------------------------------------------------------

_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>[^)]+)\)\s*$")
_LINK_LINE = re.compile(r"^\s*Link (?P<link>\d+): (?P<state>.+?)\s*$")
_SPEED = re.compile(r"^(?P<gbs>\d+(?:\.\d+)?) GB/s$")


def parse_nvlink_status(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi nvlink -s`: per GPU {index, name, uuid, links: {n: GB/s or None when inactive}, message}.

    `message` is the line nvidia-smi printed in place of the links (all inactive, not supported, MIG mode)."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        head = _GPU_LINE.match(line.strip())
        if head:
            gpus.append({"index": int(head.group("index")), "name": head.group("name"),
                         "uuid": head.group("uuid"), "links": {}, "message": None})
            continue
        link = _LINK_LINE.match(line)
        if link and gpus:
            speed = _SPEED.match(link.group("state"))
            gpus[-1]["links"][int(link.group("link"))] = float(speed.group("gbs")) if speed else None
            continue
        if gpus:
            current = gpus[-1]
            current["message"] = line.strip() if current["message"] is None else current["message"] + " " + line.strip()
    return gpus


def parse_list(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi -L`: the GPUs ({index, name, uuid}); MIG device lines below a GPU are not GPUs."""
    out = []
    for line in text.splitlines():
        match = _GPU_LINE.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if match:
            out.append({"index": int(match.group("index")), "name": match.group("name"), "uuid": match.group("uuid")})
    return out


# ---- MIG -----------------------------------------------------------------------------------------------------------

# A MIG device as CUDA names it (NVIDIA MIG user guide: `NVIDIA H100 80GB HBM3 MIG 1g.10gb`); parse_list skips the
# lines `nvidia-smi -L` prints for MIG devices below their GPU.
_CUDA_MIG_NAME = re.compile(r"^(?P<gpu>.+?) MIG (?P<profile>\S+)$")
# A MIG device's name (MIG user guide, "MIG Device Names"): [<C>c.]<G>g.<memory>gb[+me]: a compute instance of C
# compute slices (all G of its GPU instance when no `c.` part) and the GPU instance's memory.
MIG_PROFILE = re.compile(r"^(?:(?P<ci>\d+)c\.)?(?P<gi>\d+)g\.\d+gb(?:\+[a-z.]+)?$")
# Compute slices of a whole GPU (MIG user guide, "Supported MIG Profiles": a 1g profile has 1/7 of the SMs on A100,
# H100, H200, B200; "Supported GPUs": at most 4 instances on A30 and RTX PRO 6000 Blackwell, 2 on RTX PRO 5000/4500).
COMPUTE_SLICES = 7
FEWER_COMPUTE_SLICES = (("A30", 4), ("RTX PRO 6000", 4), ("RTX PRO 5000", 2), ("RTX PRO 4500", 2))
# The figures of a datasheet that scale with an instance's compute slices (matmul throughput).
COMPUTE_FIGURE_SUFFIX = "_tflops"


def compute_slices(gpu_name: str) -> int:
    """How many compute slices a GPU has in MIG mode (COMPUTE_SLICES unless FEWER_COMPUTE_SLICES names it)."""
    return next((slices for model, slices in FEWER_COMPUTE_SLICES if model in gpu_name), COMPUTE_SLICES)


def mig_slices(profile: str) -> int | None:
    """The compute slices of a MIG device profile (`1g.10gb` 1, `1c.3g.40gb` 1, `7g.80gb` 7), None if unknown."""
    match = MIG_PROFILE.match(profile)
    return int(match.group("ci") or match.group("gi")) if match else None


def mig_gpus(ctx) -> list[str]:
    """The host's GPUs in MIG mode (`mig.mode.current` Enabled) as `GPU i (BUS)`; none when nvidia-smi does not
    answer (the checks that own that fail on it)."""
    try:
        rows = query(ctx)
    except SmiError:
        return []
    return [f"GPU {row['index']} ({row['pci.bus_id']})" for row in rows if value(row["mig.mode.current"]) == "Enabled"]


@dataclasses.dataclass(frozen=True)
class MigJudgement:
    """How a perf check judges the devices CUDA shows: against `share` of the whole GPU's figures (1 off MIG),
    `note` saying so; `skip` says why it cannot be judged at all."""

    share: Fraction = Fraction(1)
    note: str = ""
    skip: str = ""

    def scaled(self, figures: dict) -> dict:
        """Expected (datasheet) figures with the compute ones (COMPUTE_FIGURE_SUFFIX) scaled to the share."""
        if self.share == 1:
            return figures
        return {key: (float(item) * self.share if key.endswith(COMPUTE_FIGURE_SUFFIX) and isinstance(item, (int, float))
                      and not isinstance(item, bool) else item) for key, item in figures.items()}

    def config(self, config: dict) -> dict:
        """A check's config with its `expected` compute figures scaled to the share, and `expected_basis` saying so."""
        if self.share == 1:
            return config
        expected = config.get("expected") or {}
        basis = dict(config.get("expected_basis") or {})
        for key in expected:
            if key.endswith(COMPUTE_FIGURE_SUFFIX):
                basis[key] = f"{basis.get(key) or 'the GPU'}, times {self.share} ({self.note})"
        return {**config, "expected": self.scaled(expected), "expected_basis": basis}

    def skipped(self, check: str, start: float) -> Result:
        return Result(check, SKIP, self.skip, {"mig": self.skip}, seconds=time.monotonic() - start)

    def not_scaled(self, check: str, what: str, start: float) -> Result | None:
        """The skip of a check whose figures do not follow compute slices (`what`: copies follow an instance's
        memory slices and copy engines) on a MIG instance smaller than its GPU; None on whole GPUs."""
        if self.skip:
            return self.skipped(check, start)
        if self.share == 1:
            return None
        instance = self.note.split(":")[0]
        reason = f"{instance}: {what}, not judged against the whole GPU's figures"
        return Result(check, SKIP, reason, {"mig": instance}, seconds=time.monotonic() - start)


def mig_judgement(ctx, names: tuple[str, ...]) -> MigJudgement:
    """The share of its GPU each CUDA device (by its CUDA name) has: a MIG instance of C compute slices of a GPU of
    N is judged against C/N of that GPU's compute figures (the MIG user guide's "Fraction of SMs"). Skipped when
    the devices have different shares, or nvidia-smi reports MIG mode but CUDA names no MIG device."""
    if not any(_CUDA_MIG_NAME.match(name) for name in names):
        enabled = mig_gpus(ctx) if names else []
        if enabled:
            return MigJudgement(skip=f"MIG is enabled on {', '.join(enabled)} but CUDA names no MIG device "
                                     f"({', '.join(names)}): the share of the GPU measured is unknown, not judged")
        return MigJudgement()
    shares = set()
    for name in names:
        match = _CUDA_MIG_NAME.match(name)
        slices = mig_slices(match.group("profile")) if match else None
        if match is None or slices is None:
            return MigJudgement(skip=f"cannot tell the share of its GPU {name!r} has (MIG): not judged")
        shares.add((Fraction(slices, compute_slices(match.group("gpu"))), match.group("profile"), match.group("gpu")))
    if len(shares) > 1:
        return MigJudgement(skip="MIG devices of different sizes (" + ", ".join(sorted(names)) + "): not judged")
    share, profile, gpu = shares.pop()
    return MigJudgement(share, f"MIG {profile} of {gpu}: judged against {share.numerator}/{share.denominator} of "
                               "the GPU's compute figures (its compute slices)")
