"""The lab's dcgm-exporter stand-in (files/standins/dcgm-exporter-standin) against the simulated nvidia-smi: run on
127.0.0.1, scraped over HTTP, judged by prometheus_client's parser; its stand-in package; gpuprov's counters file;
and the simulated nvidia-smi's gpu-busy fault.

Expected values come from the real captures (tests/fixtures/nvidia-smi-query-csv), the contract's field list, the
fault definitions (gpuprov.lab.faults) and NVML's clocks event reason bits, never from the stand-in's own tables.
"""

from __future__ import annotations

import csv
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.lab import H100, L40S, capture, changes, field_of, make_root, query, set_faults, snapshot
from prometheus_client.parser import text_string_to_metric_families

from gpuprov.lab import faults as lab_faults
from gpuprov.lab import standins
from gpuprov.stack.data import table

REPO = Path(__file__).resolve().parents[2]
COUNTERS = REPO / "gpuprov/data/dcgm-counters.csv"
STANDIN = standins.FILES / "dcgm-exporter-standin"
DRIVER = "590.48.01"
# The contract's DCGM fields (/tmp/h/monitoring_contract.md, "Metrics") and their Prometheus types; the driver
# version is a label (type "label" in dcgm-exporter's counters file).
CONTRACT = {
    "DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_FB_USED": "gauge", "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_POWER_USAGE": "gauge", "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter", "DCGM_FI_DEV_ROW_REMAP_PENDING": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter", "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "gauge", "DCGM_FI_DEV_POWER_VIOLATION": "counter",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "counter",
}
LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
# NVML (nvml.h): nvmlClocksEventReasonGpuIdle, nvmlClocksThrottleReasonHwSlowdown
GPU_IDLE, HW_SLOWDOWN = 0x1, 0x8


def counters_file(path: Path) -> list[list[str]]:
    """The records of a dcgm-exporter counters file, read as the real exporter does (# comments, 3 fields)."""
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return [[f.strip(" ") for f in row] for row in csv.reader(lines) if row]


def captured(name: str) -> dict[str, str]:
    """A capture's values by field name, units dropped ("69.85 W" -> "69.85")."""
    titles, values = capture(name)
    out = {}
    for title, value in zip(titles, values, strict=True):
        unit = title.partition(" [")[2].rstrip("]")
        out[field_of(title)] = value[: -len(unit) - 1] if unit and value.endswith(" " + unit) else value
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def smi_path(tmp_path: Path, root: Path) -> dict[str, str]:
    """An environment whose `nvidia-smi` is the simulated one on `root`'s files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{standins.FILES / "nvidia-smi"}" "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DCGM_EXPORTER_") and k != "NODE_NAME"}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "GPUPROV_LAB_STANDIN_ROOT": str(root)}


@contextmanager
def running(env: dict[str, str], *args: str):
    """The stand-in serving on 127.0.0.1: yields its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(STANDIN), "-a", f"127.0.0.1:{port}", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the stand-in exited with {proc.returncode}: {proc.communicate()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the stand-in did not listen")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read().decode()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(text: str) -> dict[tuple[str, str], float]:
    """(metric, gpu) -> value of every series (by family: the parser names counter samples NAME_total)."""
    return {(f.name, s.labels["gpu"]): s.value for f in families(text).values() for s in f.samples}


@pytest.fixture
def hgx(tmp_path):
    root = make_root(tmp_path, "hgx-h100", DRIVER, persistence=True, fabric=True)
    env = smi_path(tmp_path, root)
    with running(env, "-f", str(COUNTERS)) as url:
        yield root, url


# ---------------------------------------------------------------------------------------------- the data

def test_counters_file_lists_exactly_the_contracts_fields():
    records = counters_file(COUNTERS)
    assert all(len(r) == 3 for r in records)
    assert {r[0]: r[1] for r in records if r[1] != "label"} == CONTRACT
    assert [r[0] for r in records if r[1] == "label"] == ["DCGM_FI_DRIVER_VERSION"]
    data = table("dcgm_exporter")
    assert {name: row["type"] for name, row in data["fields"].items()} == CONTRACT
    assert set(data["label_fields"]) == {"DCGM_FI_DRIVER_VERSION"}


def test_every_dcgm_release_has_its_exporter_and_image():
    data = table("dcgm_exporter")
    assert set(data["releases"]) == set(table("dcgm")["releases"])
    for dcgm, row in data["releases"].items():
        assert row["image_tag"] == f"{dcgm}-{row['exporter']}-{data['image_variant']}"
    assert data["releases"]["4.2.3"]["image_tag"] == "4.2.3-4.1.3-ubuntu22.04"
    assert data["clocks_event_reasons"]["hw_slowdown"] == HW_SLOWDOWN
    assert data["clocks_event_reasons"]["sw_thermal_slowdown"] == 0x20
    assert data["clocks_event_reasons"]["hw_thermal_slowdown"] == 0x40


# ---------------------------------------------------------------------------------------- the stand-in

def test_metrics_have_dcgm_names_types_and_labels(hgx, tmp_path):
    root, url = hgx
    status, content_type, text = get(url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    found = families(text)
    assert {name: f.type for name, f in found.items()} == CONTRACT
    smi = query(root, ["index", "uuid", "pci.bus_id", "name"])
    assert len(smi) == 8
    for name, family in found.items():
        extra = ["err_code", "err_msg"] if name == "DCGM_FI_DEV_XID_ERRORS" else []
        assert [list(s.labels) for s in family.samples] == [LABELS + extra] * 8, name
        for sample, gpu in zip(family.samples, smi, strict=True):
            expected = {"gpu": gpu["index"], "UUID": gpu["uuid"], "pci_bus_id": gpu["pci.bus_id"],
                        "device": f"nvidia{gpu['index']}", "modelName": "NVIDIA H100 80GB HBM3",
                        "Hostname": socket.gethostname(), "DCGM_FI_DRIVER_VERSION": DRIVER}
            if extra:
                expected |= {"err_code": "0", "err_msg": "No Error"}
            assert sample.labels == expected, name
    # the label order and value formats of dcgm-exporter's template (a real scrape prints these lines so)
    xid = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_XID_ERRORS{"))
    assert re.fullmatch(r'DCGM_FI_DEV_XID_ERRORS\{gpu="0",UUID="GPU-[0-9a-f-]{36}",pci_bus_id="00000000:18:00\.0",'
                        r'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="[^"]+",'
                        r'DCGM_FI_DRIVER_VERSION="590\.48\.01",err_code="0",err_msg="No Error"\} 0', xid)
    power = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    assert power.endswith(" 69.850000")
    assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" in text


def test_values_are_the_h100_captures(hgx):
    _, url = hgx
    cap = captured(H100)
    expected = {
        "DCGM_FI_DEV_GPU_UTIL": float(cap["utilization.gpu"]), "DCGM_FI_DEV_FB_USED": float(cap["memory.used"]),
        "DCGM_FI_DEV_FB_FREE": float(cap["memory.free"]), "DCGM_FI_DEV_GPU_TEMP": float(cap["temperature.gpu"]),
        "DCGM_FI_DEV_POWER_USAGE": float(cap["power.draw"]), "DCGM_FI_DEV_SM_CLOCK": float(cap["clocks.current.sm"]),
        "DCGM_FI_DEV_XID_ERRORS": 0.0,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": float(cap["ecc.errors.uncorrected.volatile.total"]),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": float(cap["ecc.errors.corrected.volatile.total"]),
        "DCGM_FI_DEV_ROW_REMAP_PENDING": float(cap["remapped_rows.pending"] == "Yes"),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": float(cap["remapped_rows.uncorrectable"]),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": float(cap["remapped_rows.failure"] == "Yes"),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(int(cap["clocks_event_reasons.active"], 16)),
        # NVML counts violations in ns; nvidia-smi prints the counters in us
        "DCGM_FI_DEV_POWER_VIOLATION": 1000.0 * int(cap["clocks_event_reasons_counters.sw_power_cap"]),
        "DCGM_FI_DEV_THERMAL_VIOLATION": 1000.0 * (int(cap["clocks_event_reasons_counters.sw_thermal_slowdown"]) +
                                                   int(cap["clocks_event_reasons_counters.hw_thermal_slowdown"])),
    }
    assert expected["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == GPU_IDLE and expected["DCGM_FI_DEV_GPU_UTIL"] == 0
    assert values(get(url + "/metrics")[2]) == {(m, str(g)): v for m, v in expected.items() for g in range(8)}


def test_l40s_counts_its_captured_power_capping_in_ns(tmp_path):
    root = make_root(tmp_path, "l40s", "595.80")
    with running(smi_path(tmp_path, root), "-f", str(COUNTERS)) as url:
        got = values(get(url + "/metrics")[2])
    cap = captured(L40S)
    assert {g for _, g in got} == {"0", "1", "2", "3"}
    assert got[("DCGM_FI_DEV_POWER_VIOLATION", "2")] == 1000.0 * int(cap["clocks_event_reasons_counters.sw_power_cap"])
    assert got[("DCGM_FI_DEV_GPU_UTIL", "0")] == float(cap["utilization.gpu"])
    assert got[("DCGM_FI_DEV_POWER_USAGE", "0")] == float(cap["power.draw"])


@pytest.mark.parametrize("fault,expected", [
    ("ecc-uncorrectable 3", {("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "3"): 1.0}),
    ("row-remap-pending", {("DCGM_FI_DEV_ROW_REMAP_PENDING", "0"): 1.0}),
    ("throttle 5", {("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "5"): float(GPU_IDLE | HW_SLOWDOWN)}),
    ("gpu-process 2", {("DCGM_FI_DEV_FB_USED", "2"): float(lab_faults.fault_process()["memory_mib"]),
                       ("DCGM_FI_DEV_FB_FREE", "2"): float(81081 - lab_faults.fault_process()["memory_mib"])}),
    ("gpu-busy", {("DCGM_FI_DEV_GPU_UTIL", "0"): 100.0,
                  ("DCGM_FI_DEV_FB_USED", "0"): float(lab_faults.fault_process()["memory_mib"]),
                  ("DCGM_FI_DEV_FB_FREE", "0"): float(81081 - lab_faults.fault_process()["memory_mib"])}),
    ("gpu-busy 6", {("DCGM_FI_DEV_GPU_UTIL", "6"): 100.0,
                    ("DCGM_FI_DEV_FB_USED", "6"): float(lab_faults.fault_process()["memory_mib"]),
                    ("DCGM_FI_DEV_FB_FREE", "6"): float(81081 - lab_faults.fault_process()["memory_mib"])}),
])
def test_each_fault_changes_exactly_its_series_at_the_next_scrape(hgx, fault, expected):
    root, url = hgx
    before = values(get(url + "/metrics")[2])
    set_faults(root, fault)
    after = values(get(url + "/metrics")[2])
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if before[k] != v} == expected
    set_faults(root)
    assert values(get(url + "/metrics")[2]) == before


def test_gpu_missing_drops_the_gpus_series(hgx):
    root, url = hgx
    uuids = [r["uuid"] for r in query(root, ["uuid"])]
    set_faults(root, "gpu-missing")
    found = families(get(url + "/metrics")[2])
    assert set(found) == set(CONTRACT)
    for family in found.values():
        assert [s.labels["UUID"] for s in family.samples] == uuids[:7]
        assert [s.labels["gpu"] for s in family.samples] == [str(i) for i in range(7)]


def test_driver_mismatch_serves_no_gpu_series(hgx):
    root, url = hgx
    set_faults(root, "driver-mismatch")
    status, _, text = get(url + "/metrics")
    assert status == 200 and families(text) == {}
    set_faults(root)
    assert set(families(get(url + "/metrics")[2])) == set(CONTRACT)


def test_only_metrics_is_served(hgx):
    _, url = hgx
    with pytest.raises(urllib.error.HTTPError) as err:
        get(url + "/")
    assert err.value.code == 404


def test_the_counters_file_chooses_the_fields(tmp_path):
    root = make_root(tmp_path, "a100-pcie", "570.148.08")
    counters = tmp_path / "two.csv"
    counters.write_text("# two fields, no driver label\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                        "DCGM_FI_DEV_ROW_REMAP_PENDING,   gauge, Whether remapping of rows is pending\n")
    env = {**smi_path(tmp_path, root), "DCGM_EXPORTER_COLLECTORS": str(counters)}
    with running(env) as url:  # the counters file from the real exporter's environment variable
        found = families(get(url + "/metrics")[2])
    assert {n: f.type for n, f in found.items()} == {"DCGM_FI_DEV_GPU_TEMP": "gauge",
                                                     "DCGM_FI_DEV_ROW_REMAP_PENDING": "gauge"}
    assert [list(s.labels) for s in found["DCGM_FI_DEV_GPU_TEMP"].samples] == [LABELS[:-1]] * 2


@pytest.mark.parametrize("line,message", [
    ("DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).", "could not find DCGM field"),
    ("DCGM_FI_DEV_GPU_TEMP, gauge", "expected 3 fields"),
    ("DCGM_FI_DEV_GPU_TEMP, bucket, GPU temperature (in C).", "could not find Prometheus metric type"),
])
def test_bad_counters_files_stop_it_at_start(tmp_path, line, message):
    counters = tmp_path / "bad.csv"
    counters.write_text(line + "\n")
    proc = subprocess.run([sys.executable, str(STANDIN), "-f", str(counters), "-a", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1 and message in proc.stderr


def test_unknown_flags_fail_and_version_answers(tmp_path):
    proc = subprocess.run([sys.executable, str(STANDIN), "--kubernetes"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 1 and "flag provided but not defined: --kubernetes" in proc.stderr
    proc = subprocess.run([sys.executable, str(STANDIN), "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("dcgm-exporter version ") and "gpuprov lab stand-in" in proc.stdout


# ------------------------------------------------------------------------------------------ the package

def test_package_is_nvidias_name_and_version_with_its_layout(tmp_path):
    spec = standins.dcgm_exporter_spec("4.4.1")
    assert (spec.name, spec.version, spec.upstream) == ("datacenter-gpu-manager-exporter", "4.6.0-1", "4.6.0")
    assert standins.dcgm_exporter_spec("4.2.3").version == "4.1.3-1"
    assert standins.dcgm_exporter_spec("9.9.9") is None
    contents = standins.package_contents(spec, {})
    assert contents.links["usr/bin/dcgm-exporter"] == "/usr/lib/gpuprov-lab/dcgm-exporter-standin"
    script = contents.files["usr/lib/gpuprov-lab/dcgm-exporter-standin"]
    assert script[1] == 0o755 and b'VERSION = "4.4.1-4.6.0"' in script[0]
    unit = contents.files["lib/systemd/system/nvidia-dcgm-exporter.service"][0].decode()
    assert "ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv\n" in unit
    assert "gpuprov lab stand-in" in unit
    default = tmp_path / "default-counters.csv"
    default.write_bytes(contents.files["etc/dcgm-exporter/default-counters.csv"][0])
    assert {r[0] for r in counters_file(default)} <= set(CONTRACT) | {"DCGM_FI_DRIVER_VERSION"}
    control = standins.control_text(spec, "amd64", 12)
    assert "Package: datacenter-gpu-manager-exporter\nVersion: 4.6.0-1\n" in control
    assert f"Description: {standins.NOT_NVIDIA}\n" in control


@pytest.mark.tool
def test_the_mirror_carries_the_exporter_of_each_stacks_dcgm(tmp_path):
    from helpers.lab import KERNEL, mirror_stack

    old, new = mirror_stack("570", "570.148.08"), mirror_stack("580", "580.95.05")
    new["dcgm"] = {"version": "4.4.1", "packages": [{"name": "datacenter-gpu-manager-4-core", "version": "1:4.4.1-1"}]}
    specs = standins.standin_packages([old, new], KERNEL)
    exporters = sorted((s.version, s.role) for s in specs if s.name == "datacenter-gpu-manager-exporter")
    assert exporters == [("4.1.3-1", "dcgm_exporter"), ("4.6.0-1", "dcgm_exporter")]
    deb = standins.build_debs([standins.dcgm_exporter_spec("4.4.1")], tmp_path, {})[0]
    assert deb.name == "datacenter-gpu-manager-exporter_4.6.0-1_amd64.deb"
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^lrwxrwxrwx .* \./usr/bin/dcgm-exporter -> /usr/lib/gpuprov-lab/dcgm-exporter-standin$",
                     listing, re.M)
    for path in ("./usr/lib/gpuprov-lab/dcgm-exporter-standin", "./etc/dcgm-exporter/default-counters.csv",
                 "./lib/systemd/system/nvidia-dcgm-exporter.service"):
        assert re.search(rf" {re.escape(path)}$", listing, re.M), path


def test_the_shipped_default_counters_serve(tmp_path):
    root = make_root(tmp_path, "hgx-h100", DRIVER)
    default = tmp_path / "default-counters.csv"
    default.write_text(standins._template(standins.EXPORTER_DEFAULT_COUNTERS))
    with running(smi_path(tmp_path, root), "--collectors", str(default)) as url:
        found = families(get(url + "/metrics")[2])
    assert set(found) == {r[0] for r in counters_file(default) if r[1] != "label"}


# ----------------------------------------------------------------------------- the gpu-busy fault (nvidia-smi)

def test_gpu_busy_changes_exactly_utilization_and_its_process(tmp_path):
    root = make_root(tmp_path, "hgx-h100", DRIVER, persistence=True, fabric=True)
    before = snapshot(root)
    memory = lab_faults.fault_process()["memory_mib"]
    free = int(captured(H100)["memory.free"])
    set_faults(root, "gpu-busy 4")
    assert changes(before, snapshot(root)) == {(4, "utilization.gpu"): "100 %", (4, "memory.used"): f"{memory} MiB",
                                               (4, "memory.free"): f"{free - memory} MiB"}
    env = {**os.environ, "GPUPROV_LAB_STANDIN_ROOT": str(root)}
    out = subprocess.run([sys.executable, str(standins.FILES / "nvidia-smi"), "--query-compute-apps=pid,gpu_bus_id",
                          "--format=csv,noheader"], capture_output=True, text=True, env=env, check=True).stdout
    assert out.splitlines() == [f"{lab_faults.fault_process()['pid']}, {before[4]['pci.bus_id']}"]
    # with gpu-process on the same GPU the process is still one
    set_faults(root, "gpu-busy 4", "gpu-process 4")
    assert changes(before, snapshot(root))[(4, "memory.used")] == f"{memory} MiB"


def test_gpu_busy_is_a_known_gpu_fault():
    assert "gpu-busy" in lab_faults.known_faults() and "gpu-busy" not in lab_faults.global_faults()
    assert lab_faults.Fault.parse("gpu-busy 3").line == "gpu-busy 3"
