#!/usr/bin/env python3
"""gpuprov-health: the passive health check of one GPU host (seconds, no load, Python 3.9+ standard library only).

It runs `nvidia-smi -q -x` and `nvidia-smi nvlink -s` (with timeouts) and reads the kernel log, then checks: the
GPU count against the expected one, NVML's driver/library mismatch, volatile uncorrectable ECC errors, row remapping
(pending, failed), Xids since the last run, inactive NVLink links, fabric registration, PCIe link width and
persistence mode. Every finding carries a fault code and a repair action from the table that
`gpuprov.health.codes.render_program` inlines below (from gpuprov/data/health_codes.yaml).

Exit 0 when no fatal fault was found, 1 when one was (0 in Slurm mode, where the drain is the signal), 2 on bad
input. `--json` prints one JSON document,
`--textfile-dir DIR` writes DIR/gpuprov_health.prom atomically for node_exporter, and `--slurm` drains the node
with `gpuprov:<code> <text>` as the reason (within the circuit breaker) or resumes it when gpuprov drained it.
`--deep` adds DCGM's short diagnostic; `--epilog` (Slurm's Epilog) runs the checks in Slurm mode only after a
job that failed, the diagnostic among them when this run found a new fault or the last one ran `--deep-every`
seconds ago (a user's failing jobs do not cost a diagnostic each), and always exits 0. Defaults come from
/etc/gpuprov/health.json (written by deploy); arguments override them.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import math
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

CODES: dict = {}  # gpuprov:codes (filled in by gpuprov.health.codes.render_program)

CONFIG = "/etc/gpuprov/health.json"
STATE_DIR = "/var/lib/gpuprov-health"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
REASON_PREFIX = "gpuprov:"
TEXTFILE = "gpuprov_health.prom"
MISMATCH = "Driver/library version mismatch"
# HealthCheckProgram runs with a bare environment: look in the usual places after PATH. Only absolute entries:
# an empty or relative one would make which() search the working directory
SEARCH_PATH = os.pathsep.join([p for p in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(p)]
                              + ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
# "NVRM: Xid (PCI:0000:9b:00): 119, pid=..., ..." (older drivers omit "PCI:"); as gpuprov/smoke/xid.py parses it
XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
                 r"(?P<number>\d+),\s*(?P<message>.*?)\s*$")
# Timestamp: when the node's reason was set (slurmctld's clock, "2026-12-03T10:55:01"); the reason comes last
SINFO_FIELDS = "NodeList:0|,PartitionName:0|,StateComplete:0|,Timestamp:0|,Reason:0"
SETTLE_S = 2.0   # after a drain, wait this long before the recount (longer than the timestamp's one-second step)
DIAG_TIMEOUT_S = 120.0
DEEP_EVERY_S = 3600.0   # the Epilog's diagnostic after a failed job without a fault found: at most this often
RUN_LIMIT_S = 50.0   # Slurm kills a HealthCheckProgram after 60 s: every command ends within this from the start
STEP_S = 5.0         # the timeout of each Slurm command from the drain on (sinfo, scontrol answer within a second)
DEADLINE = math.inf  # time.monotonic() at which the run's limit is spent (set by main)
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# slurm.conf's HealthCheckProgram takes no arguments: deploy's file turns on Slurm mode ("slurm": true)
CONFIG_KEYS = {"expected_gpus": int, "expect_nvlink": bool, "max_drained_pct": (int, float), "textfile_dir": str,
               "slurm": bool}
LAST_RUN = "last.json"   # the last run's result document, in the state dir (the Epilog's: last-epilog.json)


class InputError(Exception):
    """Bad input (an argument, the config file): exit 2."""


def fault(code: str, gpu: str, detail: str) -> dict:
    """A finding with its action and severity from the inlined table (`XID_<n>` from its xids part)."""
    entry = CODES["xids"][code[4:]] if code.startswith("XID_") and code != "XID_UNKNOWN" else CODES["codes"][code]
    return {"code": code, "gpu": gpu, "action": entry["action"], "severity": entry["severity"], "text": detail}


def left() -> float:
    """Seconds left of the run's limit."""
    return DEADLINE - time.monotonic()


def run(argv: list, timeout: float) -> tuple:
    """(exit code, stdout, stderr) of a command run without a shell, by its absolute path, within `timeout` and the
    run's limit; exit code None when it could not run or timed out (the reason in stderr)."""
    exe = shutil.which(argv[0], path=SEARCH_PATH)
    if exe is None:
        return None, "", f"{argv[0]}: not found"
    timeout = min(timeout, left())
    if timeout <= 0:
        return None, "", f"{argv[0]}: not run: the run's time limit is spent"
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              errors="replace", check=False)
    except subprocess.TimeoutExpired:
        return None, "", f"{argv[0]}: no answer within {timeout:g} s"
    except OSError as exc:
        return None, "", f"{argv[0]}: {exc}"
    return done.returncode, done.stdout, done.stderr


def number(text: str | None) -> int | None:
    """An integer from nvidia-smi's text ('16x', '0'), None for N/A and the like."""
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def check_gpus(xml_text: str, expected: int | None, checks: dict) -> tuple:
    """Faults from `nvidia-smi -q -x` and the GPUs' PCI ids in nvidia-smi's order."""
    root = ET.fromstring(xml_text)
    gpus = root.findall("gpu")
    ids = [gpu.get("id", str(i)) for i, gpu in enumerate(gpus)]
    faults = []
    if expected is None:
        checks["gpu_count"] = f"skipped: no expected count ({len(gpus)} found)"
    elif len(gpus) < expected:
        faults.append(fault("GPU_MISSING", "", f"{len(gpus)} of {expected} GPUs"))
    for index, gpu in enumerate(gpus):
        gid = ids[index]
        volatile = gpu.find("ecc_errors/volatile")
        if volatile is not None:
            counts = [number(el.text) for el in volatile.iter() if "uncorrectable" in el.tag]
            double_bit = volatile.find("double_bit/total")   # schemas before v11
            counts.append(number(double_bit.text) if double_bit is not None else None)
            total = sum(c for c in counts if c)
            if total:
                faults.append(fault("ECC_UNCORRECTABLE", gid, f"{total} uncorrectable ECC errors (volatile)"))
        if gpu.findtext("remapped_rows/remapped_row_pending", "").strip() == "Yes":
            faults.append(fault("ROW_REMAP_PENDING", gid, "row remapping pending (reset the GPU to apply it)"))
        if gpu.findtext("remapped_rows/remapped_row_failure", "").strip() == "Yes":
            faults.append(fault("ROW_REMAP_FAILED", gid, "row remapping failed"))
        widest = number(gpu.findtext("pci/pci_gpu_link_info/link_widths/max_link_width"))
        width = number(gpu.findtext("pci/pci_gpu_link_info/link_widths/current_link_width"))
        if widest and width and width < widest:
            faults.append(fault("PCIE_DEGRADED", gid, f"PCIe link x{width} of x{widest}"))
        state = gpu.findtext("fabric/state", "N/A").strip()
        status = gpu.findtext("fabric/status", "N/A").strip()
        if state != "N/A" and (state != "Completed" or status not in ("Success", "N/A")):
            faults.append(fault("FABRIC_NOT_READY", gid, f"fabric state {state}, status {status}"))
        if gpu.findtext("persistence_mode", "").strip() == "Disabled":
            faults.append(fault("PERSISTENCE_OFF", gid, "persistence mode disabled"))
    return faults, ids


def parse_nvlink(text: str) -> dict:
    """`nvidia-smi nvlink -s` per GPU index: active and inactive link numbers, and whether NVLink is
    unsupported there (no NVLink, MIG mode)."""
    gpus: dict = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"GPU (\d+):", line)
        link = re.match(r"\s*Link (\d+): (.*)$", line)
        if head:
            current = gpus.setdefault(int(head.group(1)), {"active": [], "inactive": [], "unsupported": False})
        elif current is not None and link:
            key = "inactive" if "inactive" in link.group(2).lower() else "active"
            current[key].append(int(link.group(1)))
        elif current is not None and "all links are inactive" in line:
            current["inactive"].append("all")
        elif current is not None and ("not support" in line or "does not have" in line):
            current["unsupported"] = True
    return gpus


def check_nvlink(text: str, ids: list, expect: bool, checks: dict) -> list:
    """NVLINK_DOWN for each GPU with inactive links, where the host has NVLink: a GPU with an active link, or
    expect_nvlink set by deploy (a host whose links are all down looks like a host without NVLink)."""
    gpus = parse_nvlink(text)
    if not expect and not any(g["active"] for g in gpus.values()):
        checks["nvlink"] = "skipped: no active NVLink on this host"
        return []
    faults = []
    for index, gpu in sorted(gpus.items()):
        if gpu["inactive"] and not gpu["unsupported"]:
            name = ids[index] if index < len(ids) else f"GPU {index}"
            links = ", ".join(str(n) for n in gpu["inactive"])
            faults.append(fault("NVLINK_DOWN", name, f"inactive NVLink links: {links}"))
    return faults


class State:
    """What the last run saw (/var/lib/gpuprov-health/state.json): the kernel log position, the Xid faults of this
    boot and the deep check's faults (`deep`), kept until the host reboots (a new boot id) or `--clear-faults`.
    Runs at the same time (HealthCheckProgram, Epilogs) take turns: an exclusive flock on the folder's `lock` is held
    from the load through the save. `problem` says why the state could not be locked, read or saved ("" when it
    was); a run with a problem reads no kernel log and saves nothing."""

    def __init__(self, folder: str, boot_id: str, wait: float):
        self.path = os.path.join(folder, "state.json")
        self.folder = folder
        self.cursor = os.path.join(folder, "journal.cursor")
        self.new_cursor = ""   # journalctl's cursor file of this run, renamed to `cursor` after the save
        self.problem = ""
        self.lock_fd = -1
        self.data: dict = {"boot_id": boot_id, "xids": [], "deep": [], "kmsg_seq": -1, "files": {}}
        try:
            os.makedirs(folder, exist_ok=True)
            self.lock_fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            self.lock(wait)
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            self.problem = f"state dir {folder}: {getattr(exc, 'strerror', None) or exc}"
            return
        if isinstance(data, dict) and data.get("boot_id") == boot_id:
            self.data.update(data)
            return
        try:
            if os.path.lexists(self.cursor):
                os.unlink(self.cursor)
        except OSError as exc:
            self.problem = f"state dir {folder}: journal cursor: {exc.strerror}"

    def lock(self, wait: float) -> None:
        """Take the lock, waiting up to `wait` seconds for another run to let it go."""
        end = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise OSError(errno.EWOULDBLOCK, f"locked by another run for {wait:g} s") from None
                time.sleep(0.05)

    def save(self) -> None:
        """state.json, then the journal cursor (so that the log position never runs ahead of the saved faults)."""
        if self.problem:
            return
        try:
            write_atomic(self.path, json.dumps(self.data, sort_keys=True) + "\n")
            if self.new_cursor and os.path.exists(self.new_cursor):
                os.replace(self.new_cursor, self.cursor)
        except OSError as exc:
            self.problem = f"state dir {self.folder}: {exc.strerror or exc}"

    def close(self) -> None:
        """Let the lock go."""
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def read_kmsg(path: str, state: State) -> str:
    """Kernel messages from /dev/kmsg ("prio,seq,time,flags;text" records) after the last sequence number seen."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"kernel log {path}: {exc.strerror}") from exc
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:   # a record was overwritten before it was read: go on
                    continue
                raise
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    lines = []
    last = state.data["kmsg_seq"]
    for record in b"".join(chunks).decode("utf-8", "replace").splitlines():
        match = re.match(r"\d+,(\d+),\d+,[^;]*;(.*)$", record)
        if match and int(match.group(1)) > state.data["kmsg_seq"]:
            last = max(last, int(match.group(1)))
            lines.append(match.group(2))
    state.data["kmsg_seq"] = last
    return "\n".join(lines)


def read_file_log(path: str, state: State) -> str:
    """A text log (dmesg output, syslog) from the byte offset the last run stopped at (from 0 when it shrank)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            offset = state.data["files"].get(path, 0)
            fh.seek(offset if offset <= size else 0)
            data = fh.read()
            state.data["files"][path] = fh.tell()
    except OSError as exc:
        raise InputError(f"kernel log {path}: {exc.strerror}") from exc
    return data.decode("utf-8", "replace")


def read_kernel_log(source: str, state: State, timeout: float, checks: dict) -> str | None:
    """New kernel log text since the last run, from journald (its cursor file), /dev/kmsg or a file."""
    if source == "none":
        checks["xid"] = "skipped: --kernel-log none"
        return None
    if source == "auto":
        source = "journal" if shutil.which("journalctl", path=SEARCH_PATH) else "kmsg"
    if source == "journal":
        # journalctl moves the cursor of a copy; State.save renames it over the kept one after the state is saved
        state.new_cursor = state.cursor + ".new"
        try:
            if os.path.exists(state.cursor):
                shutil.copyfile(state.cursor, state.new_cursor)
            elif os.path.lexists(state.new_cursor):
                os.unlink(state.new_cursor)
        except OSError as exc:
            state.problem = f"state dir {state.folder}: journal cursor: {exc.strerror or exc}"
            checks["xid"] = f"skipped: {state.problem}"
            return None
        code, out, err = run(["journalctl", "-k", "-o", "cat", "--no-pager", "-q",
                              f"--cursor-file={state.new_cursor}"], timeout)
        if code == 1 and not out.strip() and not err.strip():
            return ""   # systemd 252's journalctl exits 1, silently, when there is no new entry (tried in the lab)
        if code != 0:
            checks["xid"] = f"skipped: journalctl failed: {err.strip()[:200]}"
            return None
        return out
    if source == "kmsg":
        try:
            return read_kmsg("/dev/kmsg", state)
        except InputError as exc:   # not root, or a container without /dev/kmsg: the other checks still count
            checks["xid"] = f"skipped: {exc}"
            return None
    if source.startswith("kmsg:"):
        return read_kmsg(source[5:], state)
    return read_file_log(source, state)


def check_xids(text: str, state: State) -> list:
    """Xid faults found in the new log text, added to this boot's, and all of this boot's returned."""
    known = {(f["code"], f["gpu"]) for f in state.data["xids"]}
    for line in text.splitlines():
        match = XID.search(line)
        if not match:
            continue
        code = f"XID_{int(match.group('number'))}"
        if code[4:] not in CODES["xids"]:
            code = "XID_UNKNOWN"
        gpu = match.group("pci").lower()
        if (code, gpu) not in known:
            known.add((code, gpu))
            text_ = clean(f"Xid {int(match.group('number'))}: {match.group('message')}", 160)
            state.data["xids"].append(fault(code, gpu, text_))
    return list(state.data["xids"])


def keep_deep(found: list, state: State) -> list:
    """The deep check's faults found now, added to those kept for this boot, and all of them returned: a routine run
    (no dcgmi diag) still counts them, so it does not resume a node the Epilog drained for one."""
    kept = {(f["code"], f["gpu"]): f for f in state.data["deep"]}
    for f in found:
        kept[(f["code"], f["gpu"])] = f
    state.data["deep"] = list(kept.values())
    return list(state.data["deep"])


def clean(text: str, limit: int) -> str:
    """One line of at most `limit` characters: control characters replaced."""
    text = CONTROL.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_atomic(path: str, content: str) -> None:
    """Write a file so that readers see the old or the new content, never a part."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpuprov-health-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
            os.fchmod(fh.fileno(), 0o644)   # on the open file: a path could be swapped for a link meanwhile
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def textfile_dir_problem(folder: str) -> str:
    """Why the textfile folder is refused ("" when it is not): it must be a folder itself (not a link), owned by
    root (or the user running the check) and writable by no one else, as the program runs as root."""
    try:
        info = os.lstat(folder)
    except OSError as exc:
        return f"textfile dir {folder}: {exc.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"textfile dir {folder}: not a folder" + (" (a symbolic link)" if stat.S_ISLNK(info.st_mode) else "")
    if info.st_uid not in (0, os.geteuid()):
        return f"textfile dir {folder}: owned by uid {info.st_uid}, not root: refused"
    if info.st_mode & 0o022:
        return f"textfile dir {folder}: writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}): refused"
    return ""


def label(value: str) -> str:
    """A Prometheus label value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def textfile(result: dict) -> str:
    """The node_exporter textfile of one run."""
    lines = [
        "# HELP gpuprov_health_ok 1 when the last passive health check found no fatal fault, else 0.",
        "# TYPE gpuprov_health_ok gauge",
        f"gpuprov_health_ok {1 if result['ok'] else 0}",
        "# HELP gpuprov_health_fault A fault the last check found (code, GPU, repair action, severity).",
        "# TYPE gpuprov_health_fault gauge",
    ]
    seen = set()
    for f in result["faults"]:
        key = (f["code"], f["gpu"], f["action"], f["severity"])
        if key not in seen:
            seen.add(key)
            code, gpu, action, severity = (label(v) for v in key)
            lines.append(f'gpuprov_health_fault{{code="{code}",gpu="{gpu}",action="{action}",severity="{severity}"}} 1')
    slurm = result.get("slurm") or {}
    lines += [
        "# HELP gpuprov_health_drained 1 when the node is drained by gpuprov's health check (Slurm), else 0.",
        "# TYPE gpuprov_health_drained gauge",
        f"gpuprov_health_drained {1 if slurm.get('drained_by_gpuprov') else 0}",
        "# HELP gpuprov_health_held_back 1 when a drain was held back by the circuit breaker, else 0.",
        "# TYPE gpuprov_health_held_back gauge",
        f"gpuprov_health_held_back {1 if slurm.get('held_back') else 0}",
        "# HELP gpuprov_health_last_run_timestamp_seconds When the check last ran (Unix time).",
        "# TYPE gpuprov_health_last_run_timestamp_seconds gauge",
        f"gpuprov_health_last_run_timestamp_seconds {result['time']:.3f}",
    ]
    return "\n".join(lines) + "\n"


def node_rows(argv: list, timeout: float) -> list | None:
    """sinfo's rows (one per node and partition) as (node, partition, state, reason time, reason); None when sinfo
    could not answer. StateComplete is the base state and a `+flag` per flag (`mixed+drain`); the reason comes
    last, as it may hold the separator (the form gpuprov/rollout/slurm.py uses, checked against Slurm 22.05).
    No `-a`: sinfo 22.05 refuses it beside `-p` ("Conflicting options, -a and -p"), and `-n`/`-p` name what to show."""
    code, out, _ = run(["sinfo", "-h", "-N", *argv, "-O", SINFO_FIELDS], timeout)
    if code != 0:
        return None
    rows = []
    for line in out.splitlines():
        parts = line.split("|", 4)
        if len(parts) == 5:
            rows.append((parts[0].strip(), parts[1].strip(), parts[2].strip().lower(), parts[3].strip(),
                         parts[4].strip()))
    return rows


def drained(state: str) -> bool:
    """Whether sinfo's StateComplete has the drain flag (shown as draining or drained elsewhere)."""
    return "drain" in state.split("+")


def allowed(nodes: int, max_pct: float) -> int:
    """How many of a partition's `nodes` gpuprov may hold drained at once: max_pct of them, rounded up, so that a
    partition smaller than 100 / max_pct nodes still allows one (0 % allows none)."""
    share = nodes * max_pct / 100.0
    return min(nodes, math.ceil(share - 1e-9))   # 1e-9: 10 % of 30 nodes is 3, not 4 (3.0000000000000004)


def ours(rows: list) -> list:
    """The nodes drained with a gpuprov: reason, in the order all runs agree on: when the reason was set, then
    the name."""
    return [name for _, name in sorted({(r[3], r[0]) for r in rows if drained(r[2])
                                        and r[4].startswith(REASON_PREFIX)})]


def breaker(node: str, partitions: list, max_pct: float, timeout: float) -> tuple:
    """(hold back?, why) before a drain: held back when any of the node's partitions already has its allowed
    count of nodes drained by gpuprov (`allowed`), or when sinfo cannot say."""
    for part in partitions:
        rows = node_rows(["-p", part], timeout)
        if rows is None:
            return True, f"sinfo could not list partition {part}"
        nodes = {r[0] for r in rows}
        others = [name for name in ours(rows) if name != node]
        if len(others) >= allowed(len(nodes), max_pct):
            return True, (f"partition {part} has {len(others)} of {len(nodes)} nodes drained by gpuprov "
                          f"(limit {max_pct:g}% = {allowed(len(nodes), max_pct)} nodes)")
    return False, ""


def recount(node: str, partitions: list, max_pct: float, timeout: float) -> tuple:
    """(keep the drain?, why) after it: runs on other nodes may have drained in the same instant. In every
    partition the node must be among the first `allowed` of gpuprov's drains in their agreed order (reason time,
    then name). A run sees every drain ranked before its own (those were set before it, or in the same second and
    so at least SETTLE_S before its recount), so the nodes that keep their drain are always among the first
    `allowed`: the limit holds. None when sinfo cannot say (after a drain: given up, fail closed)."""
    for part in partitions:
        rows = node_rows(["-p", part], timeout)
        if rows is None:
            return None, f"sinfo could not list partition {part} after the drain"
        order = ours(rows)
        limit = allowed(len({r[0] for r in rows}), max_pct)
        if node in order and order.index(node) >= limit:
            return False, (f"partition {part} has {len(order)} of {len({r[0] for r in rows})} nodes drained by "
                           f"gpuprov at once (limit {max_pct:g}% = {limit} nodes); {node} drained after "
                           f"{', '.join(order[:limit]) or 'none'}")
    return True, ""


def give_up(out: dict, node: str, why: str, timeout: float) -> dict:
    """Resume a node whose gpuprov drain ranks past the breaker's limit, after reading its reason again: only a
    drain that is still gpuprov's is lifted (an admin may have drained it since)."""
    rows = node_rows(["-n", node], timeout)
    if rows is None:
        out.update(action="resume after the recount failed", held_back=True,
                   why=f"{why}; not resumed: sinfo could not read the reason again")
        return out
    if not rows or not drained(rows[0][2]) or not rows[0][4].startswith(REASON_PREFIX):
        now = (rows[0][2], rows[0][4]) if rows else ("", "")
        out.update(action="none", state=now[0], reason=now[1], held_back=False,
                   why=f"{why}; not resumed: the node is no longer drained by gpuprov (reason {now[1]!r})")
        return out
    code, _, err = run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout)
    out.update(action="held back" if code == 0 else "resume after the recount failed", held_back=True,
               why=why if code == 0 else f"{why}; {err.strip()[:200]}")
    return out


def slurm(result: dict, node: str, max_pct: float, timeout: float, settle: float, trusted: bool) -> dict:
    """Drain the node on a fatal fault (within the breaker, recounted `settle` seconds after the drain, only with
    time left for the recount and a resume) or resume it when it passes, gpuprov drained it and the state this
    run relied on (`trusted`: Xids, the deep check's faults) was read and saved."""
    fatal = [f for f in result["faults"] if f["severity"] == "fatal"]
    rows = node_rows(["-n", node], timeout)
    if not rows:
        why = "sinfo could not answer" if rows is None else f"sinfo lists no node {node}"
        return {"node": node, "action": "none", "why": why, "held_back": bool(fatal)}
    state, reason = rows[0][2], rows[0][4]
    partitions = sorted({r[1] for r in rows})
    ours = reason.startswith(REASON_PREFIX)
    out = {"node": node, "state": state, "reason": reason, "action": "none", "held_back": False}
    if not fatal:
        if drained(state) and ours and not trusted:
            out["why"] = "not resumed: the state (Xids, the deep check's faults) could not be read or saved"
        elif drained(state) and ours:
            code, _, err = run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout)
            out.update(action="resume" if code == 0 else "resume failed", why=err.strip()[:200])
        return out
    if drained(state) and not ours:
        out["why"] = "drained by someone else: left as it is"
        return out
    if drained(state):   # a run stopped between its drain and its recount leaves a drain past the limit: recount
        out["why"] = "already drained by gpuprov"
        keep, why = recount(node, partitions, max_pct, timeout)
        return give_up(out, node, why, timeout) if keep is False else out
    hold, why = breaker(node, partitions, max_pct, timeout)
    if hold:
        out.update(action="held back", held_back=True, why=why)
        return out
    step = min(timeout, STEP_S)
    needed = settle + (len(partitions) + 3) * step   # the drain, the recount, the reason read again, a resume
    if left() < needed:
        out.update(action="held back", held_back=True,
                   why=f"not drained: {max(left(), 0):.0f} s of the run's limit left, a drain needs {needed:g} s "
                       "(the drain, the recount and a resume)")
        return out
    first = fatal[0]
    more = f" (+{len(fatal) - 1} more)" if len(fatal) > 1 else ""
    gpu = f" {first['gpu']}" if first["gpu"] else ""
    text = clean(f"{REASON_PREFIX}{first['code']} {first['text']}{gpu}{more}", 240)
    code, _, err = run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={text}"], step)
    out.update(action="drain" if code == 0 else "drain failed", why=err.strip()[:200], new_reason=text)
    if code != 0:
        return out
    time.sleep(settle)
    keep, why = recount(node, partitions, max_pct, step)
    # past the limit, or sinfo cannot say: this node gives its drain up (resume), and says so as the breaker does
    return out if keep else give_up(out, node, why, step)


def check_diag(timeout: float, checks: dict) -> list:
    """DCGM_DIAG_FAILED for each test result `dcgmi diag -r 1 -j` reports as Fail; skipped without dcgmi or when
    the diagnostic cannot start (no JSON results: no host engine is no finding about a GPU)."""
    code, out, err = run(["dcgmi", "diag", "-r", "1", "-j"], timeout)
    if code is None:
        checks["dcgm_diag"] = f"skipped: {clean(err, 200)}"
        return []
    try:
        categories = json.loads(out)["DCGM Diagnostic"]["test_categories"]
    except (ValueError, KeyError, TypeError):
        checks["dcgm_diag"] = f"skipped: dcgmi diag gave no results (exit {code}): {clean(out + err, 200)}"
        return []
    faults = []
    for category in categories:
        for test in category.get("tests", []):
            for item in test.get("results", []):
                if str(item.get("status", "")).lower() == "fail":
                    gpu = f"GPU {item['entity_id']}" if "entity_id" in item else ""
                    info = clean(str(item.get("info") or item.get("warnings") or ""), 120)
                    faults.append(fault("DCGM_DIAG_FAILED", gpu, f"dcgmi diag -r 1: {test.get('name')} failed"
                                        + (f": {info}" if info else "")))
    return faults


def deep_due(faults: list, data: dict, every: float, now: float) -> tuple:
    """Whether the Epilog runs the diagnostic after a failed job: when this run found a fault with a repair action
    that the last diagnostic did not see (a sign of the hardware), else when the last diagnostic ran `every`
    seconds ago or more, so that a user's failing jobs do not cost a diagnostic each; (due, why not)."""
    seen = {tuple(key) for key in data.get("deep_seen") or () if isinstance(key, list) and len(key) == 2}
    if any(f["action"] != "NONE" and (f["code"], f["gpu"]) not in seen for f in faults):
        return True, ""
    last = data.get("deep_at")
    if not isinstance(last, (int, float)) or isinstance(last, bool) or not math.isfinite(last) or last > now:
        return True, ""
    if now - last >= every:
        return True, ""
    return False, (f"no new fault found, and the last diagnostic ran {now - last:.0f} s ago (at most one in "
                   f"--deep-every {every:g} s)")


def job_failed(env: dict) -> bool:
    """Whether the job an Epilog runs after failed: SLURM_JOB_EXIT_CODE2 (`<exit>:<signal>`) other than 0:0, else
    SLURM_JOB_EXIT_CODE (the wait(2) status) other than 0 (slurm.conf(5), 22.05: both given to Epilog)."""
    pair = env.get("SLURM_JOB_EXIT_CODE2", "").strip()
    if pair:
        return pair != "0:0"
    return env.get("SLURM_JOB_EXIT_CODE", "0").strip() not in ("", "0")


def load_config(path: str) -> dict:
    """deploy's settings for this host; {} when the file is absent."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    for key, value in data.items():
        kind = CONFIG_KEYS.get(key)
        if kind is None:
            raise InputError(f"{path}: {key}: unknown key (known: {', '.join(sorted(CONFIG_KEYS))})")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise InputError(f"{path}: {key}: wrong type {type(value).__name__}")
    return data


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuprov-health", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=CONFIG, help=f"settings written by deploy (default {CONFIG})")
    parser.add_argument("--expected-gpus", type=int, help="GPUs this host must show")
    parser.add_argument("--expect-nvlink", action="store_true", default=None, help="fail inactive links even "
                        "when no link of the host is active")
    parser.add_argument("--kernel-log", default="auto", help="auto, journal, kmsg, kmsg:PATH, none, or a text "
                        "log file (dmesg output) (default auto: journal where journalctl exists, else kmsg)")
    parser.add_argument("--state-dir", default=STATE_DIR, help=f"where the last position is kept ({STATE_DIR})")
    parser.add_argument("--boot-id-file", default=BOOT_ID, help=argparse.SUPPRESS)
    parser.add_argument("--clear-faults", "--clear-xids", dest="clear_faults", action="store_true",
                        help="forget this boot's kept Xids and deep-check faults (after a GPU reset or a repair)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds each command may take (default 10)")
    parser.add_argument("--run-limit", type=float, default=RUN_LIMIT_S, help="seconds the whole run may take "
                        f"(default {RUN_LIMIT_S:g}; Slurm kills a HealthCheckProgram after 60 s; --deep adds "
                        f"{DIAG_TIMEOUT_S:g})")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--textfile-dir", help="write gpuprov_health.prom there (node_exporter's textfile dir)")
    parser.add_argument("--slurm", action="store_true", help="drain on failure, resume when gpuprov drained")
    parser.add_argument("--node", help="Slurm node name (default: the short host name)")
    parser.add_argument("--max-drained-pct", type=float, help="circuit breaker: share of a partition that may be "
                        "drained by gpuprov (default 10)")
    parser.add_argument("--settle", type=float, default=SETTLE_S, help="seconds between a drain and the breaker's "
                        f"recount (default {SETTLE_S:g})")
    parser.add_argument("--deep", action="store_true", help="also run DCGM's short diagnostic (dcgmi diag -r 1)")
    parser.add_argument("--epilog", action="store_true", help="as Slurm's Epilog: after a failed job only, the "
                        "checks in Slurm mode with the diagnostic when a new fault is found or --deep-every has "
                        "passed; always exit 0")
    parser.add_argument("--deep-every", type=float, default=DEEP_EVERY_S, help="the Epilog's diagnostic when no "
                        f"new fault was found: at most once in this many seconds (default {DEEP_EVERY_S:g})")
    args = parser.parse_args(argv)
    if args.max_drained_pct is not None and not 0 <= args.max_drained_pct <= 100:
        raise InputError(f"--max-drained-pct {args.max_drained_pct:g}: expected 0 to 100")
    if not 0 < args.run_limit <= 3600:
        raise InputError(f"--run-limit {args.run_limit:g}: expected more than 0, at most 3600 seconds")
    if not 0 <= args.deep_every <= 7 * 86400:
        raise InputError(f"--deep-every {args.deep_every:g}: expected 0 to 604800 seconds")
    if not 0 <= args.settle <= 30:
        raise InputError(f"--settle {args.settle:g}: expected 0 to 30 seconds (Slurm stops the program at 60)")
    return args


def gather(args: argparse.Namespace, config: dict) -> tuple:
    """Run every check: the result document (without the Slurm part), and why the state could not be locked, read
    or saved ("" when it was)."""
    checks: dict = {}
    faults: list = []
    expected = args.expected_gpus if args.expected_gpus is not None else config.get("expected_gpus")
    expect_nvlink = args.expect_nvlink if args.expect_nvlink is not None else config.get("expect_nvlink", False)
    code, out, err = run(["nvidia-smi", "-q", "-x"], args.timeout)
    ids: list = []
    if MISMATCH in out + err:
        faults.append(fault("DRIVER_MISMATCH", "", clean((out + err).strip(), 200)))
    elif code != 0:
        why = err.strip() if code is None else f"exit {code}: {(out + err).strip()}"
        faults.append(fault("SMI_FAILED", "", clean(f"nvidia-smi -q -x: {why}", 200)))
    else:
        try:
            gpu_faults, ids = check_gpus(out, expected, checks)
            faults += gpu_faults
        except ET.ParseError as exc:
            faults.append(fault("SMI_FAILED", "", f"nvidia-smi -q -x: unreadable XML: {exc}"))
    if ids:
        code, out, err = run(["nvidia-smi", "nvlink", "-s"], args.timeout)
        if code is None:
            faults.append(fault("SMI_FAILED", "", clean(f"nvidia-smi nvlink -s: {err}", 200)))
        else:
            faults += check_nvlink(out + err, ids, expect_nvlink, checks)
    boot_id = ""
    if os.path.exists(args.boot_id_file):
        with open(args.boot_id_file, encoding="utf-8") as fh:
            boot_id = fh.read().strip()
    # the diagnostic takes minutes: it runs while the state's lock is not held, so other runs need not wait for it
    deep = check_diag(max(args.timeout, DIAG_TIMEOUT_S), checks) if args.deep and ids else []
    state = State(args.state_dir, boot_id, max(0.0, min(2 * args.timeout, left() / 2)))
    epilog_deep = bool(args.epilog and ids and state.problem)   # when the last diagnostic is unknown: run it
    try:
        if not state.problem:
            if args.clear_faults:
                state.data["xids"], state.data["deep"] = [], []
            log = read_kernel_log(args.kernel_log, state, args.timeout, checks)
            faults += check_xids(log or "", state)
            if args.epilog and ids:
                epilog_deep, why = deep_due(faults, state.data, args.deep_every, time.time())
                if not epilog_deep:
                    checks["dcgm_diag"] = f"skipped: {why}"
            deep = keep_deep(deep, state)
            state.save()
    finally:
        state.close()
    if epilog_deep:
        seen = sorted([f["code"], f["gpu"]] for f in faults if f["action"] != "NONE")
        found = check_diag(max(args.timeout, DIAG_TIMEOUT_S), checks)
        state = State(args.state_dir, boot_id, max(0.0, min(2 * args.timeout, left() / 2)))
        try:
            if not checks.get("dcgm_diag", "").startswith("skipped"):   # it ran: the next one is due in an hour
                state.data["deep_at"], state.data["deep_seen"] = time.time(), seen
            deep = deep + found if state.problem else keep_deep(found, state)
            state.save()
        finally:
            state.close()
    faults += deep
    if state.problem:
        checks.setdefault("xid", f"skipped: {state.problem}")
        faults.append(fault("STATE_FAILED", "", clean(state.problem, 200)))
    for name, codes in (("gpu_count", ["GPU_MISSING"]), ("driver", ["DRIVER_MISMATCH", "SMI_FAILED"]),
                        ("ecc", ["ECC_UNCORRECTABLE"]), ("row_remap", ["ROW_REMAP_PENDING", "ROW_REMAP_FAILED"]),
                        ("xid", ["XID_"]), ("nvlink", ["NVLINK_DOWN"]), ("fabric", ["FABRIC_NOT_READY"]),
                        ("pcie", ["PCIE_DEGRADED"]), ("persistence", ["PERSISTENCE_OFF"]),
                        ("state", ["STATE_FAILED"]),
                        *((("dcgm_diag", ["DCGM_DIAG_FAILED"]),) if args.deep or epilog_deep or deep else ())):
        found = [f for f in faults if any(f["code"].startswith(c) for c in codes)]
        if found:
            checks[name] = "fail" if any(f["severity"] == "fatal" for f in found) else "warn"
        else:
            checks.setdefault(name, "ok")
    ok = not any(f["severity"] == "fatal" for f in faults)
    return {"ok": ok, "time": time.time(), "checks": checks, "faults": faults, "slurm": None}, state.problem


def alert(message: str) -> None:
    """An alert on stderr and in the system log (Slurm keeps a HealthCheckProgram's output only when it fails)."""
    print(f"gpuprov-health: ALERT: {message}", file=sys.stderr)
    try:
        import syslog

        syslog.openlog("gpuprov-health")
        syslog.syslog(syslog.LOG_WARNING, f"ALERT: {message}")
    except (ImportError, OSError):
        pass


def run_checks(args: argparse.Namespace) -> tuple:
    """The checks, the Slurm part (--slurm, or "slurm": true) and the textfile: the result document, also kept as
    the state dir's last.json, and the problems of keeping it (state, textfile, last.json), which never stop the
    Slurm part (InputError on bad input)."""
    config = load_config(args.config)
    result, state_problem = gather(args, config)
    problems = [state_problem] if state_problem else []
    textfile_dir = args.textfile_dir or config.get("textfile_dir")
    if args.slurm or config.get("slurm"):
        # slurmd 22.05 sets SLURMD_NODENAME for HealthCheckProgram (and Epilog); else the short host name
        node, source = ((args.node, "--node") if args.node else
                        (os.environ["SLURMD_NODENAME"], "SLURMD_NODENAME") if os.environ.get("SLURMD_NODENAME")
                        else (socket.gethostname().split(".")[0], "hostname"))
        if not NODE_NAME.fullmatch(node):   # Slurm reads `,`, `[` and spaces as several nodes
            raise InputError(f"node name {node!r}: expected letters, digits, '.', '_' and '-'")
        max_pct = args.max_drained_pct if args.max_drained_pct is not None else config.get("max_drained_pct", 10)
        if not 0 <= max_pct <= 100:
            raise InputError(f"{args.config}: max_drained_pct {max_pct:g}: expected 0 to 100")
        part = slurm(result, node, float(max_pct), args.timeout, args.settle, not state_problem)
        still = part["action"] in ("drain", "resume failed", "resume after the recount failed") or (
            part["action"] == "none" and drained(part.get("state", "")) and part.get("reason", "").startswith(
                REASON_PREFIX))
        result["slurm"] = {**part, "node_from": source, "drained_by_gpuprov": still}
    if args.epilog:
        result["epilog"] = {"job": os.environ.get("SLURM_JOB_ID", ""),
                            "exit": os.environ.get("SLURM_JOB_EXIT_CODE2", os.environ.get("SLURM_JOB_EXIT_CODE"))}
    if textfile_dir:
        problem = textfile_dir_problem(textfile_dir)
        if not problem:
            try:
                write_atomic(os.path.join(textfile_dir, TEXTFILE), textfile(result))
            except OSError as exc:
                problem = f"textfile dir {textfile_dir}: {exc.strerror or exc}"
        problems += [problem] if problem else []
    if not state_problem:
        try:
            name = "last-epilog.json" if args.epilog else LAST_RUN
            write_atomic(os.path.join(args.state_dir, name), json.dumps(result, sort_keys=True) + "\n")
        except OSError as exc:
            problems.append(f"state dir {args.state_dir}: {exc.strerror or exc}")
    return result, problems


def main(argv: list | None = None) -> int:
    if not CODES:
        print("gpuprov-health: no fault code table: install the program rendered by gpuprov.health.codes",
              file=sys.stderr)
        return 2
    global DEADLINE
    epilog = "--epilog" in (sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if args.epilog:
            if not job_failed(dict(os.environ)):
                return 0
            args.slurm = True
        DEADLINE = time.monotonic() + args.run_limit + (DIAG_TIMEOUT_S if args.deep or args.epilog else 0.0)
        result, problems = run_checks(args)
    except InputError as exc:
        print(f"gpuprov-health: {clean(str(exc), 500)}", file=sys.stderr)
        return 0 if epilog else 2   # a failing Epilog would drain the node itself, past the breaker
    for problem in problems:
        print(f"gpuprov-health: {clean(problem, 500)}", file=sys.stderr)
    slurm_part = result["slurm"] or {}
    if slurm_part.get("held_back"):
        alert(f"drain of {slurm_part['node']} held back: {slurm_part['why']}")
    if problems:
        alert(f"results not kept: {'; '.join(problems)}")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for f in result["faults"]:
            where = f" gpu={f['gpu']}" if f["gpu"] else ""
            print(f"{f['severity'].upper()} {f['code']}{where} action={f['action']}: {f['text']}")
        if slurm_part:
            print(f"slurm: {slurm_part['action']} {slurm_part['node']} {slurm_part.get('why', '')}".rstrip())
        print("gpuprov-health: " + ("ok" if result["ok"] else "failing"))
    # Slurm mode: the drain is the signal, and a non-zero exit would make slurmd log a failure on every run; an
    # Epilog that exits non-zero drains the node with Slurm's own reason, past the breaker
    # the state or an output that could not be kept is exit 2 (also in Slurm mode: slurmd then logs the output)
    if args.epilog:
        return 0
    return 2 if problems else 0 if result["ok"] or slurm_part else 1


if __name__ == "__main__":
    sys.exit(main())
