"""Simulated GPU faults on lab hosts: what the lab's stand-in nvidia-smi shows when a lab test tells it to.

A fault is a line `NAME [GPU]` in /etc/gpuprov-lab/faults on the lab host (GPU: the host's GPU index; without it
GPU 0, or for gpu-missing the last GPU). The names and what each changes are the simulated nvidia-smi's own
(`FAULTS` in files/standins/nvidia-smi, read from there so the two cannot disagree):

    gpu-missing         one GPU fewer in every answer (-L, --query-gpu count, -q -x attached_gpus, nvlink -s)
    ecc-uncorrectable   ecc.errors.uncorrected.{volatile,aggregate}.{device_memory,dram,total} = 1
    row-remap-pending   remapped_rows.pending = Yes
    row-remapped        ecc.errors.uncorrected.aggregate.{device_memory,dram,total} = 1 and
                        remapped_rows.uncorrectable = 1, nothing pending (an error a row remap resolved)
    throttle            clocks_event_reasons.hw_slowdown = Active (bit 0x8 of clocks_event_reasons.active)
    pcie-x8             pcie.link.width.current = 8 (max 16)
    nvlink-down         nvlink -s: "NVML: Unable to retrieve NVLink information as all links are inactive"
    driver-mismatch     every query: "Failed to initialize NVML: Driver/library version mismatch", rc 18 (and
                        `docker run --gpus` fails as nvidia-container-cli does)
    gpu-process         a compute process (pid 4242, python3, 1024 MiB) on the GPU
    gpu-busy            utilization.gpu = 100 % and gpu-process's compute process on the GPU (a GPU in use; the
                        lab's dcgm-exporter stand-in shows DCGM_FI_DEV_GPU_UTIL 100 for it)

    set_faults(host, "ecc-uncorrectable", Fault("pcie-x8", 3))   replace the host's faults
    clear_faults(host)                                           none
    get_faults(host) -> [Fault]
    with injected(host, "throttle"): ...                         set, then clear (also on error)
    write_command([...]) -> str                                  the shell command (for ssh, as root)

`host` is a LabHost, a container name or id, or a docker Container. The file lives in /etc, so a fault survives
a reboot of the lab host (as a broken GPU would); clear it when done.
"""

from __future__ import annotations

import ast
import functools
import shlex
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.lab.engine import container_of

FAULTS_FILE = "/etc/gpuprov-lab/faults"
SMI = Path(__file__).with_name("files") / "standins" / "nvidia-smi"


@functools.cache
def _smi_constants() -> dict:
    tree = ast.parse(SMI.read_text(encoding="utf-8"), str(SMI))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("FAULTS", "GLOBAL_FAULTS", "FAULT_PROCESS"):
                out[name] = ast.literal_eval(node.value)
    return out


def known_faults() -> dict[str, str]:
    """Fault name -> what it changes, as the simulated nvidia-smi defines them."""
    return dict(_smi_constants()["FAULTS"])


def global_faults() -> tuple[str, ...]:
    """Faults of the whole host (they take no GPU index)."""
    return tuple(_smi_constants()["GLOBAL_FAULTS"])


def fault_process() -> dict:
    """The compute process the gpu-process fault shows (pid, name, memory_mib)."""
    return dict(_smi_constants()["FAULT_PROCESS"])


@dataclass(frozen=True)
class Fault:
    """One simulated fault; `gpu` is the host's GPU index (None: the fault's default GPU)."""

    name: str
    gpu: int | None = None

    def __post_init__(self) -> None:
        faults = known_faults()
        if self.name not in faults:
            raise InputError(f"unknown lab fault {self.name!r}", step="lab faults",
                             hint=f"choose from: {', '.join(faults)}")
        if self.gpu is not None and (self.name in global_faults() or self.gpu < 0):
            raise InputError(f"lab fault {self.name} cannot take GPU {self.gpu}", step="lab faults",
                             hint="host-wide faults take no GPU; GPU indices start at 0")

    @property
    def line(self) -> str:
        return self.name if self.gpu is None else f"{self.name} {self.gpu}"

    @classmethod
    def parse(cls, text: str) -> Fault:
        """"ecc-uncorrectable", "ecc-uncorrectable 3" or "ecc-uncorrectable:3"."""
        words = text.replace(":", " ").split()
        if not words or len(words) > 2:
            raise InputError(f"bad lab fault {text!r}", step="lab faults", hint="want NAME or NAME GPU")
        try:
            gpu = int(words[1]) if len(words) == 2 else None
        except ValueError as exc:
            raise InputError(f"bad GPU index in lab fault {text!r}", step="lab faults") from exc
        return cls(words[0], gpu)


FaultSpec = Fault | str


def _faults(faults: Iterable[FaultSpec]) -> list[Fault]:
    return [f if isinstance(f, Fault) else Fault.parse(f) for f in faults]


def render(faults: Iterable[FaultSpec]) -> str:
    """The faults file for `faults` (empty text for none)."""
    return "".join(f.line + "\n" for f in _faults(faults))


def write_command(faults: Iterable[FaultSpec]) -> str:
    """A shell command (run as root on the lab host) that makes `faults` the host's faults."""
    text = render(faults)
    if not text:
        return f"rm -f {FAULTS_FILE}"
    return (f"mkdir -p {shlex.quote(str(Path(FAULTS_FILE).parent))} && printf %s {shlex.quote(text)} > "
            f"{FAULTS_FILE}.tmp && mv {FAULTS_FILE}.tmp {FAULTS_FILE}")


def _run(host, command: str) -> str:
    container = container_of(host)
    result = container.exec_run(["sh", "-c", command])
    output = result.output.decode(errors="replace")
    if result.exit_code != 0:
        raise GpuprovError(f"lab faults: `{command}` failed with exit code {result.exit_code}", host=container.name,
                           step="lab faults", command=command, output=output)
    return output


def set_faults(host, *faults: FaultSpec) -> list[Fault]:
    """Make exactly `faults` the lab host's faults (none clears them). Returns them."""
    parsed = _faults(faults)
    _run(host, write_command(parsed))
    return parsed


def clear_faults(host) -> None:
    _run(host, f"rm -f {FAULTS_FILE}")


def get_faults(host) -> list[Fault]:
    text = _run(host, f"cat {FAULTS_FILE} 2>/dev/null || true")
    return [Fault.parse(line.split("#", 1)[0]) for line in text.splitlines() if line.split("#", 1)[0].strip()]


@contextmanager
def injected(host, *faults: FaultSpec) -> Iterator[list[Fault]]:
    """The host shows `faults` inside the block; none afterwards."""
    parsed = set_faults(host, *faults)
    try:
        yield parsed
    finally:
        clear_faults(host)
