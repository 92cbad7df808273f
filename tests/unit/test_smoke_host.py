"""The suite's host-level checks (gpuprov/smoke/host_*.py, sizing, software, tools_*) and nvidia-smi parsers.

Inputs are the real captures in tests/fixtures/ (a byte-for-byte copy of ../shared/fixtures/; provenance in its
README). Expected values were read by eye from those captures and are written here literally. Where a fault has
no capture, the test changes one value of a real capture, with the value taken from another real capture (the
-q text captures give the hardware-slowdown reasons, the fabric state and the row-remapping fields that the two
-q -x captures lack) and says so. Commands run through `ctx.run`, which each test replaces with a fake host that
answers the suite's exact nvidia-smi invocations.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path

import pytest

from gpuprov.smoke import (
    host_clocks,
    host_container,
    host_driver,
    host_ecc,
    host_fabric,
    host_gpus,
    host_nvlink,
    host_pcie,
    host_persistence,
    host_shm,
    nvsmi,
    sizing,
    software,
    tools_dcgm,
    tools_nccl_tests,
)
from gpuprov.smoke.core import Context

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H100_CSV = "nvidia-smi-query-csv/h100-sxm5-80gb_query-gpu-allfields_590.48.01_idle.csv"
H100_LOAD_CSV = "nvidia-smi-query-csv/h100-sxm5-80gb_query-gpu-allfields_590.48.01_load.csv"
H200_CSV = "nvidia-smi-query-csv/h200-sxm-141gb_query-gpu-allfields_590.48.01_idle.csv"
L40S_CSV = "nvidia-smi-query-csv/l40s_query-gpu-allfields_595.80_idle.csv"
A100_XML = "nvidia-smi-q-xml/a100-sxm4-80gb_nvidia-smi-q-x_535.54.03.xml"
T4_XML = "nvidia-smi-q-xml/t4_nvidia-smi-q-x_515.105.01.xml"
H100_NVLINK = "nvidia-smi-nvlink/h100-sxm5-80gb_nvlink-s_590.48.01.txt"
A100_NVLINK = "nvidia-smi-nvlink/a100-sxm4-80gb-x8_nvlink-status.txt"
ALL_INACTIVE = "errors/a100-sxm4-80gb_nvlink-s_all-links-inactive.txt"
L40S_NO_NVLINK = "errors/l40s_nvlink-s_not-supported_595.80.txt"
MIG_NVLINK = "errors/h100-sxm5-80gb-mig-enabled_nvlink-s_not-supported-in-mig_590.48.01.txt"

# NVIDIA's messages as nvidia-smi prints them (the lab's stand-in prints the same words; no capture exists, see
# the fixtures README "Gaps").
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.148\n"
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
             "NVIDIA driver is installed and running.\n")


def fixture(relative: str) -> str:
    return (FIXTURES / relative).read_text()


def once(text: str, old: str, new: str) -> str:
    """Replace a substring that occurs exactly once in a real capture."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def noheader_nounits(capture: str, fields=nvsmi.QUERY_FIELDS, **changes: str) -> str:
    """What `--query-gpu=FIELDS --format=csv,noheader,nounits` prints on the host a `--format=csv` capture was
    taken on: the capture's columns for FIELDS, in that order, the unit in the header removed from each value.
    `changes` replaces values (field name with `__` for `.`)."""
    rows = list(csv.reader(io.StringIO(capture), skipinitialspace=True))
    header, data = rows[0], rows[1:]
    names = [re.sub(r" \[[^\]]+\]$", "", cell.strip()) for cell in header]
    units = [(re.search(r"\[([^\]]+)\]$", cell.strip()) or [None, None])[1] for cell in header]
    lines = []
    for row in data:
        values = {}
        for name, unit, cell in zip(names, units, row, strict=True):
            cell = cell.strip()
            if unit and cell.endswith(" " + unit):
                cell = cell[: -len(unit) - 1]
            values[name] = cell
        for key, new in changes.items():
            values[key.replace("__", ".")] = new
        lines.append(", ".join(values[f] for f in fields))
    return "\n".join(lines) + "\n"


class FakeHost:
    """ctx.run for a host whose commands answer from captures: {argv prefix tuple: (rc, stdout, stderr)}."""

    def __init__(self, answers: dict):
        self.answers = {tuple(k): v for k, v in answers.items()}
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout=30.0):
        self.calls.append(list(argv))
        for prefix in sorted(self.answers, key=len, reverse=True):
            if tuple(argv[: len(prefix)]) == prefix:
                return self.answers[prefix]
        return 127, "", f"{argv[0]}: not found"


def make_ctx(config: dict, answers: dict) -> Context:
    ctx = Context(config)
    ctx.run = FakeHost(answers)
    return ctx


def smi(csv_text: str | None = None, xml: str | None = None, nvlink: str | None = None, listing: str | None = None):
    """Answers for the suite's nvidia-smi invocations."""
    answers = {}
    if csv_text is not None:
        answers[tuple(nvsmi.QUERY_ARGV)] = (0, csv_text, "")
    if xml is not None:
        answers[tuple(nvsmi.XML_ARGV)] = (0, xml, "")
    if nvlink is not None:
        answers[tuple(nvsmi.NVLINK_ARGV)] = (0, nvlink, "")
    if listing is not None:
        answers[tuple(nvsmi.LIST_ARGV)] = (0, listing, "")
    return answers


H100_EXPECT = {"gpu": "H100-SXM5-80GB", "gpu_names": ["NVIDIA H100 80GB HBM3"], "count": 1, "driver": "590.48.01",
               "form_factor": "sxm", "nvswitch": True}


# ---- parsers on the real captures ----------------------------------------------------------------------------------


def test_query_csv_with_header_h100_capture():
    (gpu,) = nvsmi.parse_query_csv_with_header(fixture(H100_CSV))
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["driver_version"] == "590.48.01"
    assert gpu["pci.bus_id"] == "00000000:00:09.0"
    assert gpu["memory.total"] == "81559"
    assert gpu["compute_cap"] == "9.0"
    assert gpu["persistence_mode"] == "Enabled"
    assert gpu["ecc.mode.current"] == "Enabled"
    assert gpu["ecc.errors.uncorrected.volatile.total"] == "0"
    assert gpu["retired_pages.pending"] == "[N/A]"
    assert gpu["remapped_rows.pending"] == "No"
    assert gpu["clocks_event_reasons.gpu_idle"] == "Active"
    assert gpu["clocks_event_reasons_counters.sw_power_cap"] == "0"
    assert gpu["utilization.gpu"] == "0"
    assert gpu["fabric.state"] == "Completed"
    assert nvsmi.value(gpu["retired_pages.pending"]) is None
    assert nvsmi.number(gpu["memory.total"]) == 81559


def test_query_csv_with_header_l40s_and_h200_captures():
    (l40s,) = nvsmi.parse_query_csv_with_header(fixture(L40S_CSV))
    assert (l40s["name"], l40s["driver_version"], l40s["memory.total"]) == ("NVIDIA L40S", "595.80", "46068")
    assert l40s["persistence_mode"] == "Disabled"
    assert l40s["compute_cap"] == "8.9"
    assert l40s["clocks_event_reasons_counters.sw_power_cap"] == "200740215"
    assert l40s["fabric.state"] == "N/A"
    assert l40s["mig.mode.current"] == "[N/A]"
    (h200,) = nvsmi.parse_query_csv_with_header(fixture(H200_CSV))
    assert (h200["name"], h200["memory.total"], h200["pci.bus_id"]) == ("NVIDIA H200", "143771", "00000000:83:00.0")


def test_query_csv_noheader_columns_follow_the_requested_fields():
    (gpu,) = nvsmi.parse_query_csv(noheader_nounits(fixture(H100_LOAD_CSV)))
    assert gpu["index"] == "0"
    assert gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["memory.total"] == "81559"
    assert gpu["mig.mode.current"] == "Disabled"
    with pytest.raises(nvsmi.SmiError, match="has 2 values for 13 fields"):
        nvsmi.parse_query_csv("0, NVIDIA H100 80GB HBM3\n")


def test_q_xml_a100_capture():
    report = nvsmi.parse_q_xml(fixture(A100_XML))
    assert (report["driver_version"], report["cuda_version"], report["attached_gpus"]) == ("535.54.03", "12.2", 4)
    (gpu,) = report["gpus"]
    assert gpu["bus_id"] == "00000000:01:00.0"
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu["persistence_mode"] == "Disabled"
    assert gpu["mig_mode"] == "Enabled"
    assert gpu["pcie"] == {"max_gen": 4, "current_gen": 4, "max_width": 16, "current_width": 16}
    assert gpu["ecc_mode"] == "Enabled"
    assert (gpu["uncorrectable_volatile"], gpu["uncorrectable_aggregate"]) == (0, 0)
    assert gpu["retired_pending"] == "N/A"
    assert gpu["remapped_rows"] is None  # <remapped_rows>N/A</remapped_rows>: MIG is enabled
    assert gpu["clock_reasons"] == {
        "gpu_idle": False, "applications_clocks_setting": False, "sw_power_cap": False, "hw_slowdown": False,
        "hw_thermal_slowdown": False, "hw_power_brake_slowdown": False, "sync_boost": False,
        "sw_thermal_slowdown": False, "display_clocks_setting": False}
    assert gpu["fabric"] == {"state": "N/A", "status": "N/A"}
    assert gpu["processes"] == []


def test_q_xml_t4_capture_old_schema_link_at_x8_and_processes():
    report = nvsmi.parse_q_xml(fixture(T4_XML))
    assert (report["driver_version"], report["cuda_version"], report["attached_gpus"]) == ("515.105.01", "11.7", 1)
    (gpu,) = report["gpus"]
    assert (gpu["bus_id"], gpu["name"]) == ("00000000:00:1E.0", "Tesla T4")
    assert gpu["pcie"] == {"max_gen": 3, "current_gen": 3, "max_width": 16, "current_width": 8}
    assert gpu["retired_pending"] == "No"
    assert gpu["fabric"] is None  # the v11 schema has no <fabric>
    assert len(gpu["clock_reasons"]) == 9 and not any(gpu["clock_reasons"].values())  # <clocks_throttle_reasons>
    assert gpu["processes"] == [
        {"pid": 675, "type": "G", "name": "/usr/lib/xorg/Xorg", "used_mib": 22},
        {"pid": 5762, "type": "C", "name": "python", "used_mib": 1005},
    ]


def test_nvlink_status_h100_and_a100_captures():
    (h100,) = nvsmi.parse_nvlink_status(fixture(H100_NVLINK))
    assert (h100["index"], h100["name"], h100["message"]) == (0, "NVIDIA H100 80GB HBM3", None)
    assert h100["links"] == {n: 26.562 for n in range(18)}
    a100 = nvsmi.parse_nvlink_status(fixture(A100_NVLINK))
    assert [g["index"] for g in a100] == list(range(8))
    assert all(g["links"] == {n: 25.0 for n in range(12)} for g in a100)
    assert a100[0]["uuid"] == "GPU-5269b708-678a-b1a8-60f0-c90406537486"


def test_nvlink_status_error_captures():
    (gpu6,) = nvsmi.parse_nvlink_status(fixture(ALL_INACTIVE))
    assert gpu6["index"] == 6 and gpu6["links"] == {}
    assert gpu6["message"] == "NVML: Unable to retrieve NVLink information as all links are inactive"
    (l40s,) = nvsmi.parse_nvlink_status(fixture(L40S_NO_NVLINK))
    assert l40s["message"] == "Device does not have or support Nvlink"
    (mig,) = nvsmi.parse_nvlink_status(fixture(MIG_NVLINK))
    assert mig["message"] == "Nvlink queries are not supported for Devices in MIG mode"


def test_nvlink_status_inactive_link():
    # nvidia-smi prints a link that is down as "Link N: <inactive>"; link 3 of the H100 capture, taken down.
    text = once(fixture(H100_NVLINK), "Link 3: 26.562 GB/s", "Link 3: <inactive>")
    (gpu,) = nvsmi.parse_nvlink_status(text)
    assert gpu["links"][3] is None and gpu["links"][2] == 26.562


def gpu_lines(relative: str) -> str:
    """The `GPU i: NAME (UUID: ...)` lines of an nvlink capture: the line format `nvidia-smi -L` prints."""
    return "".join(line + "\n" for line in fixture(relative).splitlines() if line.startswith("GPU "))


def test_list_parses_gpu_lines_and_skips_mig_devices():
    gpus = nvsmi.parse_list(gpu_lines(A100_NVLINK))
    assert len(gpus) == 8
    assert gpus[7] == {"index": 7, "name": "NVIDIA A100-SXM4-80GB",
                       "uuid": "GPU-754035b4-4708-efcd-b261-623aea38bcad"}
    assert gpus[0]["uuid"] == "GPU-5269b708-678a-b1a8-60f0-c90406537486"
    mig = "  MIG 1g.10gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)\n"
    with_mig = gpu_lines(H100_NVLINK) + mig
    assert [g["index"] for g in nvsmi.parse_list(with_mig)] == [0]


def test_classify_failure_names_nvidias_messages():
    assert nvsmi.classify_failure(18, MISMATCH, "").kind == "mismatch"
    assert "570.148" in nvsmi.classify_failure(18, MISMATCH, "").message
    assert nvsmi.classify_failure(9, NO_DRIVER, "").kind == "no_driver"
    assert nvsmi.classify_failure(6, "No devices were found\n", "").kind == "no_devices"
    assert nvsmi.classify_failure(127, "", "nvidia-smi: not found").kind == "missing"
    assert nvsmi.classify_failure(124, "", "nvidia-smi -q -x: timed out after 60 s").kind == "timeout"


# ---- host.gpus ------------------------------------------------------------------------------------------------------


def test_gpus_pass_when_count_and_model_match():
    ctx = make_ctx({"expect": H100_EXPECT}, smi(noheader_nounits(fixture(H100_CSV)), fixture(A100_XML)))
    result = host_gpus.run(ctx)
    assert result.status == "pass", result.reason
    assert result.figures["count"] == 1 and result.figures["names"] == ["NVIDIA H100 80GB HBM3"]


def test_gpus_fail_on_missing_gpu_and_wrong_model():
    answers = smi(noheader_nounits(fixture(H100_CSV)), fixture(A100_XML))
    result = host_gpus.run(make_ctx({"expect": dict(H100_EXPECT, count=8)}, answers))
    assert result.status == "fail"
    assert "1 GPUs on the host, the inventory says 8" in result.reason
    a100 = {"gpu": "A100-SXM4-80GB", "gpu_names": ["NVIDIA A100-SXM4-80GB"], "count": 1}
    result = host_gpus.run(make_ctx({"expect": a100}, answers))
    assert result.status == "fail"
    assert "GPU 0 (00000000:00:09.0) is a NVIDIA H100 80GB HBM3, expected NVIDIA A100-SXM4-80GB" in result.reason


def test_gpus_fail_on_a_compute_process_not_on_a_display_server():
    t4 = {"gpu": "T4", "gpu_names": ["NVIDIA H100 80GB HBM3"], "count": 1}
    ctx = make_ctx({"expect": t4}, smi(noheader_nounits(fixture(H100_CSV)), fixture(T4_XML)))
    result = host_gpus.run(ctx)
    assert result.status == "fail"
    assert "runs pid 5762 python (1005 MiB)" in result.reason
    assert "Xorg" not in result.reason
    assert result.figures["graphics_processes"] == ["GPU 0 (00000000:00:1E.0) runs pid 675 /usr/lib/xorg/Xorg (22 MiB)"]


def test_gpus_skip_without_expectation_and_without_gpus():
    answers = smi(noheader_nounits(fixture(H100_CSV)), fixture(A100_XML))
    assert host_gpus.run(make_ctx({}, answers)).status == "skip"
    none = {tuple(nvsmi.QUERY_ARGV): (6, "No devices were found\n", "")}
    result = host_gpus.run(make_ctx({"gpus_visible": False}, none))
    assert result.status == "skip" and "none expected" in result.reason
    result = host_gpus.run(make_ctx({"expect": {"count": 8}}, none))
    assert result.status == "fail" and result.reason == "nvidia-smi: No devices were found"


# ---- host.driver ----------------------------------------------------------------------------------------------------


def test_driver_pass_exact_and_branch(monkeypatch, tmp_path):
    monkeypatch.setattr(host_driver, "PROC_VERSION", str(tmp_path / "absent"))
    answers = smi(noheader_nounits(fixture(H100_CSV)))
    assert host_driver.run(make_ctx({"expect": {"driver": "590.48.01"}}, answers)).status == "pass"
    assert host_driver.run(make_ctx({"expect": {"driver": "590"}}, answers)).status == "pass"
    result = host_driver.run(make_ctx({"expect": {"driver": "570.148.08"}}, answers))
    assert result.status == "fail" and result.reason == "driver 590.48.01 is loaded, 570.148.08 was provisioned"
    result = host_driver.run(make_ctx({"expect": {"driver": None}}, answers))
    assert result.status == "skip" and result.figures["driver_version"] == "590.48.01"


def test_driver_mismatch_fails_host_driver_only(monkeypatch, tmp_path):
    monkeypatch.setattr(host_driver, "PROC_VERSION", str(tmp_path / "absent"))
    answers = {tuple(nvsmi.QUERY_ARGV): (18, MISMATCH, ""), tuple(nvsmi.XML_ARGV): (18, MISMATCH, "")}
    config = {"expect": H100_EXPECT}
    result = host_driver.run(make_ctx(config, answers))
    assert result.status == "fail" and "driver/library version mismatch" in result.reason
    answers[tuple(nvsmi.NVLINK_ARGV)] = (18, MISMATCH, "")
    for module in (host_gpus, host_persistence, host_ecc, host_pcie, host_clocks, host_nvlink, host_fabric):
        other = module.run(make_ctx(config, answers))
        assert other.status == "skip", module.NAME
        assert other.reason.endswith("judged by host.driver")


def test_a_failing_nvidia_smi_on_the_host_skips_the_container_check_for_host_driver():
    result = host_container.run(make_ctx(CONTAINER, {tuple(nvsmi.LIST_ARGV): (18, MISMATCH, "")}))
    assert (result.status, result.figures) == ("skip", {"nvidia_smi_error": "mismatch"})
    assert result.reason.endswith("judged by host.driver")

def test_driver_records_the_kernel_module(monkeypatch, tmp_path):
    # /proc/driver/nvidia/version's first line as the open kernel module prints it (no capture exists).
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  "
                    "(dvs-builder@U16-I3-B03-4-3)  Tue Jun  3 18:25:51 UTC 2025\n")
    monkeypatch.setattr(host_driver, "PROC_VERSION", str(proc))
    result = host_driver.run(make_ctx({"expect": {"driver": "590.48.01"}}, smi(noheader_nounits(fixture(H100_CSV)))))
    assert result.status == "pass"
    assert result.figures["kernel_module"] == {"version": "590.48.01", "flavour": "open"}


def test_driver_missing_nvidia_smi():
    result = host_driver.run(make_ctx({"expect": H100_EXPECT}, {}))
    assert result.status == "fail" and "nvidia-smi not found" in result.reason
    result = host_driver.run(make_ctx({"expect": {}, "gpus_visible": False}, {}))
    assert result.status == "skip"


# ---- host.persistence -----------------------------------------------------------------------------------------------


def test_persistence_on_h100_off_on_l40s_capture():
    assert host_persistence.run(make_ctx({}, smi(noheader_nounits(fixture(H100_CSV))))).status == "pass"
    result = host_persistence.run(make_ctx({}, smi(noheader_nounits(fixture(L40S_CSV)))))
    assert result.status == "fail"
    assert result.reason.startswith("persistence mode is off on GPU 0 (00000000:01:00.0)")


# ---- host.ecc -------------------------------------------------------------------------------------------------------

# The row-remapping block as nvidia-smi -q -x writes it, with the values of the H100 535.183.01 -q capture
# ("Remapped Rows: Correctable Error 0, Uncorrectable Error 0, Pending No, Remapping Failure Occurred No").
REMAPPED_OK = ("<remapped_rows>\n            <remapped_row_corr>0</remapped_row_corr>\n"
               "            <remapped_row_unc>0</remapped_row_unc>\n"
               "            <remapped_row_pending>No</remapped_row_pending>\n"
               "            <remapped_row_failure>No</remapped_row_failure>\n        </remapped_rows>")


def h100_xml(**replace: str) -> str:
    """The A100 -q -x capture placed at the H100 CSV capture's bus id, row remapping readable (MIG off)."""
    text = once(fixture(A100_XML), '<gpu id="00000000:01:00.0">', '<gpu id="00000000:00:09.0">')
    text = once(text, "<remapped_rows>N/A</remapped_rows>", REMAPPED_OK)
    for old, new in replace.items():
        text = once(text, old, new)
    return text


def test_ecc_pass_on_clean_captures():
    ctx = make_ctx({}, smi(noheader_nounits(fixture(H100_CSV)), h100_xml()))
    result = host_ecc.run(ctx)
    assert result.status == "pass", result.reason
    per_gpu = result.figures["per_gpu"]["GPU 0 (00000000:00:09.0)"]
    assert per_gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": "No", "failure": "No"}


def test_ecc_fail_on_uncorrectable_errors():
    csv_text = noheader_nounits(fixture(H100_CSV), ecc__errors__uncorrected__volatile__total="2",
                                ecc__errors__uncorrected__aggregate__total="2")
    result = host_ecc.run(make_ctx({}, smi(csv_text, h100_xml())))
    assert result.status == "fail"
    assert "GPU 0 (00000000:00:09.0): 2 uncorrectable ECC errors since the driver loaded" in result.reason


def test_ecc_fail_on_pending_row_remap_and_remap_failure():
    pending = h100_xml(**{"<remapped_row_pending>No": "<remapped_row_pending>Yes",
                          "<remapped_row_unc>0": "<remapped_row_unc>1"})
    result = host_ecc.run(make_ctx({}, smi(noheader_nounits(fixture(H100_CSV)), pending)))
    assert result.status == "fail"
    assert "row remap pending (1 rows remapped for uncorrectable errors): reset the GPU" in result.reason
    failed = h100_xml(**{"<remapped_row_failure>No": "<remapped_row_failure>Yes"})
    result = host_ecc.run(make_ctx({}, smi(noheader_nounits(fixture(H100_CSV)), failed)))
    assert result.status == "fail" and "row remapping failed" in result.reason


A10_Q = "nvidia-smi-q/a10_nvidia-smi-q_535.129.03.txt"
H100_Q = "nvidia-smi-q/h100-sxm5-80gb-hgx8_nvidia-smi-q_535.183.01.txt"
# `nvidia-smi -q` "Remapped Rows" labels -> the `-q -x` elements (nvsmi_device_v12.dtd; NVML nvmlDeviceGetRemappedRows:
# corrRows, uncRows, isPending, failureOccurred).
REMAP_ELEMENTS = {"Correctable Error": "remapped_row_corr", "Uncorrectable Error": "remapped_row_unc",
                  "Pending": "remapped_row_pending", "Remapping Failure Occurred": "remapped_row_failure"}


def remapped_block(relative: str, **changes: str) -> str:
    """The first GPU's "Remapped Rows" section of a real `nvidia-smi -q` capture, as `-q -x` writes it; `changes`
    replaces values (label with `_` for spaces)."""
    lines = fixture(relative).splitlines()
    start = lines.index("    Remapped Rows")
    values = {}
    for line in lines[start + 1:]:
        label, _, value = line.strip().partition(":")
        if label.strip() not in REMAP_ELEMENTS:
            break
        values[label.strip()] = value.strip()
    assert set(values) == set(REMAP_ELEMENTS), values
    for key, value in changes.items():
        values[key.replace("_", " ")] = value
    inner = "".join(f"<{REMAP_ELEMENTS[label]}>{value}</{REMAP_ELEMENTS[label]}>" for label, value in values.items())
    return f"<remapped_rows>{inner}</remapped_rows>"


def ecc_result(xml_remapped: str, aggregate: str = "0", volatile: str = "0", xml: str | None = None):
    csv_text = noheader_nounits(fixture(H100_CSV), ecc__errors__uncorrected__aggregate__total=aggregate,
                                ecc__errors__uncorrected__volatile__total=volatile)
    return host_ecc.run(make_ctx({}, smi(csv_text, xml or h100_xml(**{REMAPPED_OK: xml_remapped}))))


def test_ecc_fail_on_the_a10_captures_pending_remap():
    # The A10 capture: 4 rows remapped for uncorrectable errors, Pending: Yes, counters 0: reset the GPU.
    result = ecc_result(remapped_block(A10_Q))
    assert result.status == "fail"
    assert "row remap pending (4 rows remapped for uncorrectable errors): reset the GPU to apply it" in result.reason


def test_ecc_warn_on_lifetime_errors_resolved_by_row_remapping():
    # After the reset the remap is applied: Pending No, no failure, the lifetime count stays (NVIDIA: remapping is
    # persistent for the life of the GPU): history, a warning; before this fix it failed.
    resolved = remapped_block(A10_Q, Pending="No")
    result = ecc_result(resolved, aggregate="4")
    assert result.status == "warn", result.reason
    assert result.reason == ("GPU 0 (00000000:00:09.0): 4 uncorrectable ECC errors in the GPU's lifetime, resolved "
                             "by 4 rows remapped (no remap pending or failed)")


def test_ecc_fail_on_lifetime_errors_row_remapping_did_not_resolve():
    clean = remapped_block(H100_Q)    # Uncorrectable Error: 0 rows remapped
    result = ecc_result(clean, aggregate="2")
    assert result.status == "fail"
    assert "2 uncorrectable ECC errors in the GPU's lifetime (no row was remapped for them)" in result.reason
    failed = remapped_block(A10_Q, Pending="No", Remapping_Failure_Occurred="Yes")
    result = ecc_result(failed, aggregate="4")
    assert result.status == "fail"
    assert "row remapping failed: the GPU has no spare rows left, replace it (RMA)" in result.reason
    still_pending = ecc_result(remapped_block(A10_Q), aggregate="4")
    assert still_pending.status == "fail" and "reset the GPU to apply it" in still_pending.reason
    since_load = ecc_result(remapped_block(A10_Q, Pending="No"), aggregate="4", volatile="1")
    assert since_load.status == "fail" and "1 uncorrectable ECC errors since the driver loaded" in since_load.reason


def test_ecc_fail_on_lifetime_errors_without_row_remapping_state_or_in_sram():
    # Remapped rows read "N/A" on pre-Ampere GPUs and under MIG (the A100 capture as it is).
    csv_text = noheader_nounits(fixture(H100_CSV), ecc__errors__uncorrected__aggregate__total="1")
    no_state = once(fixture(A100_XML), '<gpu id="00000000:01:00.0">', '<gpu id="00000000:00:09.0">')
    result = host_ecc.run(make_ctx({}, smi(csv_text, no_state)))
    assert result.status == "fail" and "no row-remapping state to show them resolved" in result.reason
    sram = h100_xml(**{REMAPPED_OK: remapped_block(A10_Q, Pending="No"),
                       "<aggregate>\n                <sram_correctable>0</sram_correctable>\n"
                       "                <sram_uncorrectable>0": "<aggregate>\n                <sram_correctable>0"
                       "</sram_correctable>\n                <sram_uncorrectable>1"})
    result = ecc_result("", aggregate="5", xml=sram)
    assert result.status == "fail" and "1 of them in SRAM, which row remapping does not repair" in result.reason


def test_ecc_warn_when_disabled():
    csv_text = noheader_nounits(fixture(H100_CSV), ecc__mode__current="Disabled")
    result = host_ecc.run(make_ctx({}, smi(csv_text, h100_xml())))
    assert result.status == "warn" and "ECC is disabled" in result.reason


# ---- host.pcie and host.clocks (load replaced by a stand-in) --------------------------------------------------------


class FakeLoad:
    active = True
    reason = ""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class NoLoad(FakeLoad):
    active = False
    reason = "torch 2.13.0+cpu sees no CUDA device"


@pytest.fixture
def fast(monkeypatch):
    for module in (host_pcie, host_clocks):
        monkeypatch.setattr(module, "SETTLE_SECONDS", 0)
        monkeypatch.setattr(module, "INTERVAL_SECONDS", 0)


def test_pcie_pass_under_load_skip_without(monkeypatch, fast):
    monkeypatch.setattr(host_pcie.load, "GpuLoad", FakeLoad)
    result = host_pcie.run(make_ctx({}, smi(xml=fixture(A100_XML))))
    assert result.status == "pass", result.reason
    assert result.figures["links"] == {"00000000:01:00.0": {"gen": "4/4", "width": "x16/x16"}}
    monkeypatch.setattr(host_pcie.load, "GpuLoad", NoLoad)
    result = host_pcie.run(make_ctx({}, smi(xml=fixture(A100_XML))))
    assert result.status == "skip" and "torch 2.13.0+cpu sees no CUDA device" in result.reason


def test_pcie_fail_at_x8_with_or_without_load(monkeypatch, fast):
    for stand_in in (FakeLoad, NoLoad):
        monkeypatch.setattr(host_pcie.load, "GpuLoad", stand_in)
        result = host_pcie.run(make_ctx({}, smi(xml=fixture(T4_XML))))
        assert result.status == "fail"
        assert result.reason == "PCIe link trained below its width: 00000000:00:1E.0 at x8 of x16"


def test_pcie_generation_judged_only_under_load(monkeypatch, fast):
    slow = once(fixture(A100_XML), "<current_link_gen>4</current_link_gen>", "<current_link_gen>1</current_link_gen>")
    monkeypatch.setattr(host_pcie.load, "GpuLoad", FakeLoad)
    result = host_pcie.run(make_ctx({}, smi(xml=slow)))
    assert result.status == "fail" and "00000000:01:00.0 at Gen1 of Gen4" in result.reason
    monkeypatch.setattr(host_pcie.load, "GpuLoad", NoLoad)
    assert host_pcie.run(make_ctx({}, smi(xml=slow))).status == "skip"


def hw_slowdown_xml() -> str:
    # The reasons of the H100 535.161.08 -q capture ("HW Slowdown : Active", "HW Power Brake Slowdown : Active").
    text = once(fixture(A100_XML), "<clocks_event_reason_hw_slowdown>Not Active",
                "<clocks_event_reason_hw_slowdown>Active")
    return once(text, "<clocks_event_reason_hw_power_brake_slowdown>Not Active",
                "<clocks_event_reason_hw_power_brake_slowdown>Active")


def test_clocks_pass_under_load_on_both_schemas(monkeypatch, fast):
    monkeypatch.setattr(host_clocks.load, "GpuLoad", FakeLoad)
    for name in (A100_XML, T4_XML):
        result = host_clocks.run(make_ctx({}, smi(xml=fixture(name))))
        assert result.status == "pass", (name, result.reason)


def test_clocks_fail_on_hw_slowdown_even_at_idle(monkeypatch, fast):
    for stand_in in (FakeLoad, NoLoad):
        monkeypatch.setattr(host_clocks.load, "GpuLoad", stand_in)
        result = host_clocks.run(make_ctx({}, smi(xml=hw_slowdown_xml())))
        assert result.status == "fail"
        assert "00000000:01:00.0: HW slowdown, HW power brake slowdown" in result.reason


def test_clocks_warn_on_power_cap_skip_at_idle(monkeypatch, fast):
    # "SW Power Cap : Active" as on two GPUs of the RTX 4090 -q capture.
    capped = once(fixture(A100_XML), "<clocks_event_reason_sw_power_cap>Not Active",
                  "<clocks_event_reason_sw_power_cap>Active")
    monkeypatch.setattr(host_clocks.load, "GpuLoad", FakeLoad)
    result = host_clocks.run(make_ctx({}, smi(xml=capped)))
    assert result.status == "warn" and "SW power cap active under load" in result.reason
    monkeypatch.setattr(host_clocks.load, "GpuLoad", NoLoad)
    result = host_clocks.run(make_ctx({}, smi(xml=fixture(A100_XML))))
    assert result.status == "skip" and "not judged under load" in result.reason


# ---- host.nvlink ----------------------------------------------------------------------------------------------------


def test_nvlink_pass_and_skips():
    result = host_nvlink.run(make_ctx({"expect": H100_EXPECT}, smi(nvlink=fixture(H100_NVLINK))))
    assert result.status == "pass"
    assert result.reason == "all 18 NVLinks of 1 GPUs active at 26.562 GB/s"
    result = host_nvlink.run(make_ctx({"expect": {"gpu": "L40S", "form_factor": "pcie"}}, {}))
    assert result.status == "skip" and "pcie part" in result.reason
    result = host_nvlink.run(make_ctx({"expect": H100_EXPECT}, smi(nvlink=fixture(MIG_NVLINK))))
    assert result.status == "skip" and "MIG mode" in result.reason


def test_nvlink_fail_all_inactive_one_inactive_and_unsupported():
    result = host_nvlink.run(make_ctx({"expect": H100_EXPECT}, smi(nvlink=fixture(ALL_INACTIVE))))
    assert result.status == "fail"
    assert "GPU 6: NVML: Unable to retrieve NVLink information as all links are inactive" in result.reason
    down = once(fixture(H100_NVLINK), "Link 3: 26.562 GB/s", "Link 3: <inactive>")
    result = host_nvlink.run(make_ctx({"expect": H100_EXPECT}, smi(nvlink=down)))
    assert result.status == "fail" and "GPU 0: 1 of 18 links inactive (link 3)" in result.reason
    result = host_nvlink.run(make_ctx({"expect": H100_EXPECT}, smi(nvlink=fixture(L40S_NO_NVLINK))))
    assert result.status == "fail" and "Device does not have or support Nvlink" in result.reason


def test_nvlink_eight_gpu_capture():
    result = host_nvlink.run(make_ctx({"expect": {"form_factor": "sxm"}}, smi(nvlink=fixture(A100_NVLINK))))
    assert result.status == "pass" and result.reason == "all 96 NVLinks of 8 GPUs active at 25 GB/s"


# ---- host.fabric ----------------------------------------------------------------------------------------------------


def completed_xml() -> str:
    # Fabric state and status of the H100 535.183.01 -q capture ("State : Completed", "Status : Success").
    return once(fixture(A100_XML), "<state>N/A</state>\n            <status>N/A</status>",
                "<state>Completed</state>\n            <status>Success</status>")


def test_fabric():
    active = {("systemctl", "is-active", "nvidia-fabricmanager"): (0, "active\n", "")}
    result = host_fabric.run(make_ctx({"expect": H100_EXPECT}, {**active, **smi(xml=completed_xml())}))
    assert result.status == "pass", result.reason
    result = host_fabric.run(make_ctx({"expect": H100_EXPECT}, {**active, **smi(xml=fixture(A100_XML))}))
    assert result.status == "fail"
    assert result.reason == "GPU fabric state not Completed/Success: 00000000:01:00.0 N/A/N/A"
    stopped = {("systemctl", "is-active", "nvidia-fabricmanager"): (3, "inactive\n", "")}
    result = host_fabric.run(make_ctx({"expect": H100_EXPECT}, {**stopped, **smi(xml=completed_xml())}))
    assert result.status == "fail" and result.reason == "nvidia-fabricmanager is inactive, not active"
    result = host_fabric.run(make_ctx({"expect": dict(H100_EXPECT, nvswitch=False)}, {}))
    assert result.status == "skip"
    # No systemd to ask (a container): the GPUs' fabric state decides.
    no_systemd = {("systemctl",): (1, "", "System has not been booted with systemd as init system (PID 1). Can't "
                                          "operate.\nFailed to connect to bus: Host is down\n")}
    result = host_fabric.run(make_ctx({"expect": H100_EXPECT}, {**no_systemd, **smi(xml=completed_xml())}))
    assert result.status == "pass"
    assert result.figures["fabricmanager"] == ("unknown (System has not been booted with systemd as init system "
                                               "(PID 1). Can't operate.)")


# ---- host.shm -------------------------------------------------------------------------------------------------------


def test_shm(monkeypatch):
    monkeypatch.setattr(host_shm, "shm_bytes", lambda path=None: (64 * 1024**2, 64 * 1024**2))
    result = host_shm.run(make_ctx({"shm_min_gib": 8}, {}))
    assert result.status == "fail" and result.reason.startswith("/dev/shm is 0.06 GiB, below 8 GiB")
    monkeypatch.setattr(host_shm, "shm_bytes", lambda path=None: (32 * 1024**3, 31 * 1024**3))
    assert host_shm.run(make_ctx({"shm_min_gib": 8}, {})).status == "pass"
    assert host_shm.run(make_ctx({}, {})).status == "skip"


# ---- host.container -------------------------------------------------------------------------------------------------

CONTAINER = {"container": {"runtime": "docker", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}, "expect": {"count": 8}}


def docker_argv():
    return tuple(host_container.container_argv("docker", "nvcr.io/nvidia/pytorch:25.01-py3"))


def test_container_sees_every_gpu():
    listing = gpu_lines(A100_NVLINK)
    answers = {**smi(listing=listing), docker_argv(): (0, listing, "")}
    result = host_container.run(make_ctx(CONTAINER, answers))
    assert result.status == "pass" and result.figures["container_gpus"] == 8


def test_container_fails_without_the_toolkit_or_with_fewer_gpus():
    listing = gpu_lines(A100_NVLINK)
    refusal = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n'
    result = host_container.run(make_ctx(CONTAINER, {**smi(listing=listing), docker_argv(): (125, "", refusal)}))
    assert result.status == "fail" and "could not select device driver" in result.reason
    fewer = "".join(listing.splitlines(keepends=True)[:7])
    result = host_container.run(make_ctx(CONTAINER, {**smi(listing=listing), docker_argv(): (0, fewer, "")}))
    assert result.status == "fail" and result.reason.startswith("the container sees 7 of the host's 8 GPUs")
    assert host_container.run(make_ctx({}, {})).status == "skip"


def test_inside_the_image_the_container_lists_the_hosts_gpus():
    listing = gpu_lines(A100_NVLINK)
    uuids = [g["uuid"] for g in nvsmi.parse_list(listing)]
    assert len(uuids) == 8
    inside = {"container": {"runtime": "docker", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "inside": True,
                            "host_uuids": uuids}}
    result = host_container.run(make_ctx(inside, smi(listing=listing)))   # never calls docker: FakeHost refuses
    assert result.status == "pass" and result.figures["container_gpus"] == 8
    fewer = "".join(listing.splitlines(keepends=True)[:6])
    result = host_container.run(make_ctx(inside, smi(listing=fewer)))
    assert result.status == "fail"
    assert result.reason == (f"the container sees 6 of the host's 8 GPUs (missing {', '.join(sorted(uuids[6:]))})")


# ---- sizing ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    """A /sys/class/block laid out as the kernel does: entries link to the device tree, a partition is a
    directory inside its disk with a `partition` file, a dm/md device lists its members in `slaves/`."""
    devices = tmp_path / "devices"
    block = tmp_path / "class" / "block"
    block.mkdir(parents=True)

    def disk(name: str, rotational: str = "0", model: str | None = None, parts=()):
        path = devices / name
        (path / "queue").mkdir(parents=True)
        (path / "queue" / "rotational").write_text(rotational + "\n")
        if model is not None:
            (path / "device").mkdir()
            (path / "device" / "model").write_text(model + "\n")
        os.symlink(path, block / name)
        for part in parts:
            (path / part).mkdir()
            (path / part / "partition").write_text("1\n")
            os.symlink(path / part, block / part)

    def mapped(name: str, members):
        path = devices / "virtual" / name
        (path / "slaves").mkdir(parents=True)
        (path / "queue").mkdir()
        (path / "queue" / "rotational").write_text("0\n")
        for member in members:
            os.symlink(block / member, path / "slaves" / member)
        os.symlink(path, block / name)

    disk("nvme0n1", model="SAMSUNG MZQL23T8HCLS-00A07", parts=["nvme0n1p1", "nvme0n1p2"])
    disk("nvme1n1", model="Amazon Elastic Block Store")
    disk("sda", rotational="1", parts=["sda1"])
    mapped("dm-0", ["nvme0n1p2"])
    monkeypatch.setattr(sizing, "SYS_CLASS_BLOCK", str(block))
    return block


def findmnt(source: str, fstype: str, target: str = "/data"):
    out = json.dumps({"filesystems": [{"source": source, "fstype": fstype, "target": target}]}, indent=3)
    return {("findmnt",): (0, out, "")}


def sizing_ctx(tmp_path, workload="llm-finetune", mount=None, csv_name=H100_CSV):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    answers = {**smi(noheader_nounits(fixture(csv_name))), **(mount or {})}
    return make_ctx({"workload": workload, "data_dir": str(data) if mount else None}, answers)


@pytest.fixture
def big_host(monkeypatch):
    monkeypatch.setattr(sizing, "cpu_count", lambda: 16)
    monkeypatch.setattr(sizing, "memory_bytes", lambda path=None: 1007 * 1024**3)


def test_sizing_pass_on_nvme(tmp_path, sysfs, big_host):
    result = sizing.run(sizing_ctx(tmp_path, mount=findmnt("/dev/nvme0n1p2", "ext4")))
    assert result.status == "pass", result.reason
    assert result.figures["disks"] == {"nvme0n1": "nvme"}
    assert result.figures["gpu_memory_gib"] == 79.6  # 81559 MiB
    result = sizing.run(sizing_ctx(tmp_path, mount=findmnt("/dev/dm-0", "xfs")))
    assert result.status == "pass" and result.figures["disks"] == {"nvme0n1": "nvme"}


def test_sizing_warn_on_shortfalls(tmp_path, sysfs, monkeypatch):
    monkeypatch.setattr(sizing, "cpu_count", lambda: 4)
    monkeypatch.setattr(sizing, "memory_bytes", lambda path=None: 64 * 1024**3)
    result = sizing.run(sizing_ctx(tmp_path, workload="recsys"))
    assert result.status == "warn"
    assert "4 CPUs for 1 GPUs is 4.0 per GPU, below 8 for recsys" in result.reason
    assert "64 GiB of memory for 1 GPUs is 64 GiB per GPU, below 256 GiB for recsys" in result.reason
    assert result.thresholds["cpu_cores_per_gpu"] == "8-16"


def test_sizing_data_dir_not_local_nvme(tmp_path, sysfs, big_host):
    cases = {
        ("10.0.0.5:/export/data", "nfs4"): "is on a network filesystem (nfs4 10.0.0.5:/export/data)",
        ("/dev/sda1", "ext4"): "sda is a rotating disk",
        ("/dev/nvme1n1", "ext4"): "nvme1n1 is a network volume",
        ("overlay", "overlay"): "is on overlay overlay: no block device to judge",
        ("tmpfs", "tmpfs"): "is on tmpfs",
    }
    for (source, fstype), words in cases.items():
        result = sizing.run(sizing_ctx(tmp_path, mount=findmnt(source, fstype)))
        assert result.status == "warn", (source, result.reason)
        assert words in result.reason, (source, result.reason)


def test_sizing_gpu_memory_and_skips(tmp_path, big_host, monkeypatch):
    # 46068 MiB (the L40S capture) against a 48 GiB override of the fine-tuning need.
    ctx = sizing_ctx(tmp_path, csv_name=L40S_CSV)
    ctx.config["sizing"] = {"gpu_memory_gib": 48}
    result = sizing.run(ctx)
    assert result.status == "warn" and "45 GiB per GPU, below the 48 GiB llm-finetune needs" in result.reason
    assert sizing.run(sizing_ctx(tmp_path, csv_name=L40S_CSV)).status == "pass"
    assert sizing.run(make_ctx({}, {})).status == "skip"


# ---- software -------------------------------------------------------------------------------------------------------


def test_version_codes():
    # cuDNN: CUDNN_VERSION is major*1000+minor*100+patch up to 8.x, major*10000+minor*100+patch from 9.0.
    assert software.cudnn_text(8902) == "8.9.2"
    assert software.cudnn_text(90100) == "9.1.0"
    # NCCL_VERSION_CODE: major*1000+minor*100+patch up to 2.8, major*10000+minor*100+patch from 2.9.
    assert software.nccl_text(2708) == "2.7.8"
    assert software.nccl_text(21805) == "2.18.5"
    assert software.nccl_text((2, 26, 5)) == "2.26.5"


def test_software(monkeypatch):
    gpu_torch = {"torch": "2.7.1+cu128", "cuda": "12.8", "cudnn": "9.7.1", "nccl": "2.26.2"}
    monkeypatch.setattr(software, "torch_versions", lambda: dict(gpu_torch))
    expect = {"cuda": "12.8", "nccl": "2.26.2", "cudnn": "9"}
    assert software.run(make_ctx({"expect": expect}, {})).status == "pass"
    result = software.run(make_ctx({"expect": dict(expect, nccl="2.26.5")}, {}))
    assert result.status == "fail" and "nccl 2.26.2 where the stack promised 2.26.5" in result.reason
    monkeypatch.setattr(software, "torch_versions", lambda: {"torch": "2.13.0+cpu", "cuda": None, "cudnn": None,
                                                             "nccl": None})
    result = software.run(make_ctx({"expect": expect}, {}))
    assert result.status == "skip" and "CPU build" in result.reason
    assert result.figures["torch"] == "2.13.0+cpu"


# ---- tools.dcgm -----------------------------------------------------------------------------------------------------

# NVIDIA/DCGM nvvs/src/tests/JsonResultTests.cpp, "JsonResult: Deserialize real output" (DCGM 3.1.0, 8 GPUs),
# the text before the JSON and the `null` entries kept, re-indented with spaces.
DCGM_REAL = """
    WARNING: THIS SHOULD NOT HAPPEN
    {
    "DCGM GPU Diagnostic" :
    {
        "test_categories" :
        [
            {
                "category" : "Deployment",
                "tests" :
                [
                    {"name" : "Denylist", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "NVML Library", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "CUDA Main Library", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "Permissions and OS-related Blocks",
                     "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "Persistence Mode", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "Environmental Variables",
                     "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "Page Retirement/Row Remap",
                     "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "Graphics Processes", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
                    null,
                    {"name" : "Inforom", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]}
                ]
            },
            {
                "category" : "Custom",
                "tests" :
                [
                    {
                        "name" : "software",
                        "results" :
                        [
                            {"gpu_ids" : 0, "status" : "PASS"}, {"gpu_ids" : 1, "status" : "PASS"},
                            {"gpu_ids" : 2, "status" : "PASS"}, {"gpu_ids" : 3, "status" : "PASS"},
                            {"gpu_ids" : 4, "status" : "PASS"}, {"gpu_ids" : 5, "status" : "PASS"},
                            {"gpu_ids" : 6, "status" : "PASS"}, {"gpu_ids" : 7, "status" : "PASS"}
                        ]
                    }
                ]
            }
        ],
        "version" : "3.1.0"
    }
}
"""
DCGM_ARGV = ("dcgmi", "diag", "-r", "1", "-j")


def test_dcgm_parses_nvidias_real_output():
    diag = tools_dcgm.parse_diag(DCGM_REAL)
    assert diag["version"] == "3.1.0"
    assert [t["name"] for t in diag["tests"]] == [
        "Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS-related Blocks", "Persistence Mode",
        "Environmental Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom", "software"]
    assert [r["gpu"] for r in diag["tests"][-1]["results"]] == list(range(8))
    result = tools_dcgm.run(make_ctx({"level": "quick"}, {DCGM_ARGV: (0, DCGM_REAL, "")}))
    assert result.status == "pass" and result.reason == "dcgmi diag -r 1: 10 tests passed"


def test_dcgm_failed_test_fails_even_with_exit_zero():
    # A failing result as NVIDIA's JSON writer shapes it (status FAIL, a warnings list; nvvs JsonOutput.h).
    failed = DCGM_REAL.replace(
        '{"name" : "Persistence Mode", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]}',
        '{"name" : "Persistence Mode", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "FAIL", '
        '"warnings" : ["Persistence mode for GPU 0 is disabled."]}]}')
    assert failed != DCGM_REAL
    result = tools_dcgm.run(make_ctx({}, {DCGM_ARGV: (0, failed, "")}))
    assert result.status == "fail"
    assert "Persistence Mode GPU 0,1,2,3,4,5,6,7: fail (Persistence mode for GPU 0 is disabled.)" in result.reason


def test_dcgm_version_4_shape_level_and_errors():
    # DCGM 4's root key and per-entity results (NVIDIA/DCGM nvvs/include/NvvsJsonStrings.h: "DCGM Diagnostic",
    # "entity_group", "entity_id", warnings as objects with "warning" and "error_id").
    doc = ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "memory", '
           '"results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}, {"entity_group": "GPU", '
           '"entity_id": 1, "status": "Warn", "warnings": [{"warning": "Thermal violations", "error_id": 36}]}]}]}]}, '
           '"metadata": {"version": "4.2.3"}}')
    result = tools_dcgm.run(make_ctx({"level": "burn-in"}, {("dcgmi", "diag", "-r", "3", "-j"): (0, doc, "")}))
    assert result.status == "warn"
    assert "memory GPU 1: warn (Thermal violations (DCGM error 36))" in result.reason
    assert result.figures["dcgm_version"] == "4.2.3" and result.thresholds == {"level": 3}
    refused = "Error: unable to establish a connection to the specified host: localhost\n"
    result = tools_dcgm.run(make_ctx({}, {DCGM_ARGV: (1, "", refused)}))
    assert result.status == "fail" and "unable to establish a connection" in result.reason
    assert tools_dcgm.run(make_ctx({}, {})).status == "skip"


# ---- tools.nccl_tests -----------------------------------------------------------------------------------------------

# NVIDIA/nccl-tests issue #287 (2025-03-14), alltoall_perf on an RTX 5090, as posted.
NCCL_TESTS_5090 = """# nThread 1 nGpus 1 minBytes 33554432 maxBytes 33554432 step: 1048576(bytes) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid 2181762 on   GENOA-01 device  0 [0x01] NVIDIA GeForce RTX 5090
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
    33554432       8388608     float    none      -1    19.56  1715.44    0.00      0     0.78  43046.10    0.00    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0 
#
"""  # noqa: E501, W291

# NVIDIA/nccl issue #1706 (all_reduce_perf -g 2), the end of the posted output, NCCL INFO lines included.
NCCL_TESTS_1706 = """   134217728      33554432     float     sum      -1   5190.8   25.86   25.86      0   5186.6   25.88   25.88      0
deepseek:2081594:2081611 [0] NCCL INFO comm 0x55f6848de3b0 rank 0 nranks 2 cudaDev 0 busId f000 - Destroy COMPLETE
deepseek:2081594:2081611 [1] NCCL INFO comm 0x55f68495f4f0 rank 1 nranks 2 cudaDev 1 busId 34000 - Destroy COMPLETE
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 8.62002 
#
"""  # noqa: E501, W291


def test_nccl_tests_parses_real_outputs():
    parsed = tools_nccl_tests.parse_output(NCCL_TESTS_5090)
    (row,) = parsed["rows"]
    assert (row["size"], row["type"], row["redop"], row["oop_busbw"], row["oop_wrong"], row["ip_wrong"]) == (
        33554432, "float", "none", 0.0, "0", "N/A")
    assert (parsed["oob"], parsed["oob_status"], parsed["avg_busbw"]) == (0, "OK", 0.0)
    parsed = tools_nccl_tests.parse_output(NCCL_TESTS_1706)
    (row,) = parsed["rows"]
    assert (row["size"], row["oop_busbw"], row["ip_busbw"], row["oop_wrong"]) == (134217728, 25.86, 25.88, "0")
    assert parsed["avg_busbw"] == 8.62002 and parsed["errors"] == []


def test_nccl_tests_check(monkeypatch):
    monkeypatch.setattr(tools_nccl_tests, "find_binary", lambda ctx: "/opt/nccl-tests/build/all_reduce_perf")
    argv = ("/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "256M", "-f", "2", "-g", "1")
    answers = {**smi(noheader_nounits(fixture(H100_CSV))), argv: (0, NCCL_TESTS_1706, "")}
    result = tools_nccl_tests.run(make_ctx({}, answers))
    assert result.status == "pass" and result.figures["peak_busbw_gbs"] == 25.88
    # Wrong elements and the summary line as nccl-tests prints them on a failed check (src/common.cu:
    # "# Out of bounds values : %d %s", errors ? "FAILED" : "OK").
    wrong = NCCL_TESTS_1706.replace("25.86      0   5186.6", "25.86      3   5186.6").replace(
        "# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    result = tools_nccl_tests.run(make_ctx({}, {**answers, argv: (1, wrong, "")}))
    assert result.status == "fail" and result.reason == "all-reduce results wrong: 134217728 B out-of-place: 3 wrong"
    hung = tools_nccl_tests.run(make_ctx({}, {**answers, argv: (124, "", "timed out after 300 s")}))
    assert hung.status == "fail" and "hung" in hung.reason
    monkeypatch.setattr(tools_nccl_tests, "find_binary", lambda ctx: None)
    assert tools_nccl_tests.run(make_ctx({}, answers)).status == "skip"


def test_gpu_load_without_a_gpu_says_why(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the load would start")
    from gpuprov.smoke import load

    monkeypatch.setattr(load, "DEVICE_NODES", str(tmp_path / "nvidia[0-9]*"))
    with load.GpuLoad() as gpu_load:
        assert gpu_load.active is False
        assert gpu_load.reason == f"no NVIDIA device node ({tmp_path}/nvidiaN)"
    (tmp_path / "nvidia0").write_text("")  # a device node's name, as a CUDA-less container may still have
    with load.GpuLoad() as gpu_load:
        assert gpu_load.active is False
        assert gpu_load.reason == f"torch {torch.__version__} sees no CUDA device"
