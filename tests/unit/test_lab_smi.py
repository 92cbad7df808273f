"""The lab's simulated nvidia-smi against real captures: `--query-gpu` (every field of the allfields captures),
`-q -x`, `nvlink -s`, `-L`, and the simulated faults, each of which changes exactly its fields.

Expected values come from tests/fixtures/ (real nvidia-smi output), never from the simulation's own data.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.lab import (
    CSV,
    FIXTURES,
    H100,
    L40S,
    NVLINK_H100,
    capture,
    changes,
    field_of,
    make_root,
    ok,
    query,
    set_faults,
    smi,
    snapshot,
)

from gpuprov.lab import faults as lab_faults
from gpuprov.lab import standins
from gpuprov.lab.smi_answers import gpu_profiles_table
from gpuprov.smoke import nvsmi

H200 = "h200-sxm-141gb_query-gpu-allfields_590.48.01_idle.csv"
XML_A100 = FIXTURES / "nvidia-smi-q-xml/a100-sxm4-80gb_nvidia-smi-q-x_535.54.03.xml"
XML_T4 = FIXTURES / "nvidia-smi-q-xml/t4_nvidia-smi-q-x_515.105.01.xml"
NVLINK_INACTIVE = FIXTURES / "errors/a100-sxm4-80gb_nvlink-s_all-links-inactive.txt"
NVLINK_L40S = FIXTURES / "errors/l40s_nvlink-s_not-supported_595.80.txt"
# Values that are the captured machine's own (its one GPU in a VM, masked identifiers, the time): the lab's GPUs
# have their own; their format is checked against the capture's instead.
PER_GPU = {"timestamp", "count", "serial", "uuid", "pci.bus_id", "pci.bus", "pci.device", "platform.module_id"}
FORMATS = {"timestamp": r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}", "count": r"\d+", "serial": r"\d{13}",
           "uuid": r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
           "pci.bus_id": r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", "pci.bus": r"0x[0-9A-F]{2}",
           "pci.device": r"0x[0-9A-F]{2}", "platform.module_id": r"\d+"}


# ------------------------------------------------------------------------------------------------ captures

def test_the_lab_copies_of_the_captures_are_the_real_ones():
    copies = sorted(standins.CAPTURES.glob("*.csv"))
    assert [p.name for p in copies] == sorted([H100, H200, L40S])
    for copy in copies:
        assert copy.read_bytes() == (CSV / copy.name).read_bytes()


# (lab profile, its capture, driver of the capture, persistence and fabric as the captured machine had them)
CASES = [("hgx-h100", H100, "590.48.01", True, True), ("h200", H200, "590.48.01", True, True),
         ("l40s", L40S, "595.80", False, False)]


@pytest.mark.parametrize("profile,name,driver,persistence,fabric", CASES)
def test_every_captured_field_answers_as_the_real_nvidia_smi(tmp_path, profile, name, driver, persistence, fabric):
    root = make_root(tmp_path, profile, driver, persistence=persistence, fabric=fabric)
    titles, values = capture(name)
    fields = [field_of(t) for t in titles]
    rc, out = smi(root, "--query-gpu=" + ",".join(fields), "--format=csv")
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0] == ", ".join(titles)  # header: names and units exactly as the real one prints them
    gpus = len(gpu_profiles_table()[profile])
    assert len(lines) == 1 + gpus
    for line in lines[1:]:
        got = dict(zip(fields, line.split(", "), strict=True))
        expected = dict(zip(fields, values, strict=True))
        for field in fields:
            if field in PER_GPU:
                assert re.fullmatch(FORMATS[field], got[field]), (field, got[field])
                assert re.fullmatch(FORMATS[field], expected[field]), (field, expected[field])
            elif field != "index":
                assert got[field] == expected[field], field
    first = dict(zip(fields, lines[1].split(", "), strict=True))
    assert first["index"] == "0" and first["count"] == str(gpus)


@pytest.mark.parametrize("profile,name,driver,persistence,fabric", CASES)
def test_nounits_and_noheader_drop_exactly_the_header_units(tmp_path, profile, name, driver, persistence, fabric):
    root = make_root(tmp_path, profile, driver, persistence=persistence, fabric=fabric)
    titles, values = capture(name)
    fields = [field_of(t) for t in titles]
    rc, out = smi(root, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits")
    assert rc == 0
    row = dict(zip(fields, out.splitlines()[0].split(", "), strict=True))
    for title, value in zip(titles, values, strict=True):
        field = field_of(title)
        if field in PER_GPU:
            continue
        unit = title[len(field) + 2:-1] if title != field else None
        assert row[field] == (value.removesuffix(" " + unit) if unit else value), field
    assert row["memory.total"] in ("81559", "143771", "46068")
    # csv,nounits keeps the header's units (only the values lose them)
    rc, out = smi(root, "--query-gpu=memory.total,power.draw", "--format=csv,nounits")
    assert out.splitlines()[0] == "memory.total [MiB], power.draw [W]"


def test_unknown_fields_and_formats_fail_as_the_real_tool(tmp_path):
    root = make_root(tmp_path, "hgx-h100", "590.48.01")
    assert smi(root, "--query-gpu=name,cuda_version", "--format=csv") == (
        2, 'Field "cuda_version" is not a valid field to query.\n')
    rc, out = smi(root, "--query-gpu=name", "--format=json")
    assert rc == 2 and "is not a valid format" in out
    assert smi(root, "--query-gpu=name")[0] == 2


def test_field_aliases_answer_under_the_field_name(tmp_path):
    root = make_root(tmp_path, "hgx-h100", "590.48.01")
    out = ok(root, "--query-gpu=gpu_name,gpu_bus_id,clocks_throttle_reasons.hw_slowdown", "--format=csv", "-i", "0")
    assert out.splitlines() == ["name, pci.bus_id, clocks_event_reasons.hw_slowdown",
                                "NVIDIA H100 80GB HBM3, 00000000:18:00.0, Not Active"]


def test_selecting_gpus_by_index_bus_id_or_uuid(tmp_path):
    root = make_root(tmp_path, "hgx-h100", "590.48.01")
    uuids = [r["uuid"] for r in query(root, ["uuid"])]
    assert query(root, ["index"], "csv,noheader") and len(uuids) == 8
    out = ok(root, "--query-gpu=index,uuid", "--format=csv,noheader", "-i", f"2,{uuids[5]},00000000:DB:00.0")
    assert out.splitlines() == [f"2, {uuids[2]}", f"5, {uuids[5]}", f"7, {uuids[7]}"]
    assert smi(root, "-L", "-i", "9") == (6, "No devices were found\n")


def test_profiles_without_a_capture_keep_the_capture_format(tmp_path):
    """A100 PCIe, B200, RTX 4090: no capture of their own; every field still answers, in the format of the
    capture of their form factor."""
    titles, values = capture(L40S)
    fields = [field_of(t) for t in titles]
    for profile in ("a100-pcie", "rtx-4090", "hgx-b200"):
        root = make_root(tmp_path / profile, profile, "590.48.01")
        rows = query(root, fields, "csv,noheader")
        for field, value in zip(fields, values, strict=True):
            got = rows[0][field]
            if value.startswith("["):
                continue
            unit = re.search(r" (MiB|W|MHz|%|us)$", value)
            if unit:
                assert got.endswith(unit.group(0)) or got.startswith("["), (profile, field, got)
    rtx = query(make_root(tmp_path / "rtx", "rtx-4090", "590.48.01"),
                ["name", "memory.total", "power.limit", "ecc.mode.current", "mig.mode.current"])
    # the RTX 4090 -q capture: 24564 MiB, 450.00 W; GeForce: no ECC or MIG reporting
    assert rtx[0] == {"name": "NVIDIA GeForce RTX 4090", "memory.total": "24564 MiB", "power.limit": "450.00 W",
                      "ecc.mode.current": "[N/A]", "mig.mode.current": "[N/A]"}


# -------------------------------------------------------------------------------------------- -L, nvlink -s

def test_list_gpus_as_the_real_header_line(tmp_path):
    root = make_root(tmp_path, "hgx-h100", "590.48.01")
    real = NVLINK_H100.read_text().splitlines()[0]
    pattern = re.escape(real).replace("00000000\\-0000\\-0000\\-0000\\-000000000000", "[0-9a-f-]{36}")
    pattern = pattern.replace("GPU\\ 0", r"GPU\ \d")
    lines = ok(root, "-L").splitlines()
    assert len(lines) == 8 and all(re.fullmatch(pattern, line) for line in lines)


def test_nvlink_status_as_the_h100_capture(tmp_path):
    root = make_root(tmp_path, "hgx-h100", "590.48.01")
    real = NVLINK_H100.read_text().splitlines()
    out = ok(root, "nvlink", "-s").splitlines()
    assert len(out) == 8 * len(real)
    listed = ok(root, "-L").splitlines()
    for gpu in range(8):
        block = out[gpu * len(real):(gpu + 1) * len(real)]
        assert block[0] == listed[gpu]
        assert block[1:] == real[1:]  # 18 links, "\t Link N: 26.562 GB/s"
    assert ok(root, "nvlink", "--status", "-i", "3").splitlines()[1:] == real[1:]


def test_nvlink_on_a_pcie_card_as_the_l40s_capture(tmp_path):
    root = make_root(tmp_path, "l40s", "595.80")
    real = NVLINK_L40S.read_text().splitlines()
    out = ok(root, "nvlink", "-s").splitlines()
    assert out[1::2] == [real[1]] * 4
    assert out[0].startswith("GPU 0: NVIDIA L40S (UUID: GPU-")


# ------------------------------------------------------------------------------------------------- -q -x

def paths(element: ET.Element, prefix: str = "") -> set[str]:
    out = set()
    for child in element:
        path = f"{prefix}/{child.tag}"
        out.add(path)
        out |= paths(child, path)
    return out


def gpu_paths(xml_text: str) -> set[str]:
    return paths(ET.fromstring(xml_text).find("gpu"))


# What the suite reads from -q -x (and the real 535 capture has): these paths must be in the simulated output.
READ_BY_THE_SUITE = {
    "/persistence_mode", "/ecc_mode/current_ecc", "/ecc_errors/volatile/dram_uncorrectable",
    "/ecc_errors/volatile/sram_uncorrectable", "/ecc_errors/aggregate/dram_uncorrectable",
    "/ecc_errors/aggregate/sram_uncorrectable", "/remapped_rows", "/pci/pci_bus_id",
    "/pci/pci_gpu_link_info/pcie_gen/max_link_gen", "/pci/pci_gpu_link_info/pcie_gen/current_link_gen",
    "/pci/pci_gpu_link_info/link_widths/max_link_width", "/pci/pci_gpu_link_info/link_widths/current_link_width",
    "/clocks_event_reasons/clocks_event_reason_hw_slowdown", "/clocks_event_reasons/clocks_event_reason_gpu_idle",
    "/fabric/state", "/fabric/status", "/product_name", "/uuid", "/fb_memory_usage/total"}
# remapped_rows has children only where rows can be remapped; the fixtures show N/A (A100 in MIG mode, T4).
REMAPPED_ROWS = {"/remapped_rows/" + p for p in (
    "remapped_row_corr", "remapped_row_unc", "remapped_row_pending", "remapped_row_failure",
    "row_remapper_histogram")} | {f"/remapped_rows/row_remapper_histogram/row_remapper_histogram_{k}"
                                 for k in ("max", "high", "partial", "low", "none")}


def test_xml_is_shaped_as_the_real_captures(tmp_path):
    root = make_root(tmp_path, "hgx-h100", "590.48.01", persistence=True, fabric=True)
    text = ok(root, "-q", "-x")
    real_a100 = XML_A100.read_text()
    assert text.splitlines()[:2] == real_a100.splitlines()[:2]  # XML declaration and DOCTYPE (v12)
    doc = ET.fromstring(text)
    assert [c.tag for c in doc][:4] == ["timestamp", "driver_version", "cuda_version", "attached_gpus"]
    assert doc.findtext("driver_version") == "590.48.01" and doc.findtext("attached_gpus") == "8"
    assert len(doc.findall("gpu")) == 8
    ours = gpu_paths(text)
    real = gpu_paths(real_a100) | gpu_paths(XML_T4.read_text())
    assert ours - real - REMAPPED_ROWS == set()  # nothing the real tool does not print
    assert ours >= READ_BY_THE_SUITE and READ_BY_THE_SUITE - {"/remapped_rows"} <= real
    assert ours >= REMAPPED_ROWS
    # every element of the real 535 capture's clock event reasons, in its order
    real_reasons = [c.tag for c in ET.fromstring(real_a100).find("gpu/clocks_event_reasons")]
    assert [c.tag for c in doc.find("gpu/clocks_event_reasons")] == real_reasons


def test_xml_values_are_the_captures_values(tmp_path):
    root = make_root(tmp_path, "hgx-h100", "590.48.01", persistence=True, fabric=True)
    gpu = ET.fromstring(ok(root, "-q", "-x")).find("gpu")
    titles, values = capture(H100)
    real = {field_of(t): v for t, v in zip(titles, values, strict=True)}
    link = gpu.find("pci/pci_gpu_link_info")
    assert link.findtext("pcie_gen/max_link_gen") == real["pcie.link.gen.max"] == "5"
    assert link.findtext("pcie_gen/current_link_gen") == real["pcie.link.gen.current"]
    assert link.findtext("pcie_gen/max_host_link_gen") == "N/A" and real["pcie.link.gen.hostmax"] == "[N/A]"
    assert link.findtext("link_widths/max_link_width") == real["pcie.link.width.max"] + "x" == "16x"
    assert link.findtext("link_widths/current_link_width") == real["pcie.link.width.current"] + "x"
    assert gpu.findtext("persistence_mode") == real["persistence_mode"] == "Enabled"
    assert gpu.findtext("fabric/state") == real["fabric.state"] == "Completed"
    assert gpu.findtext("fabric/status") == real["fabric.status"] == "Success"
    assert gpu.findtext("ecc_mode/current_ecc") == real["ecc.mode.current"]
    assert gpu.findtext("ecc_errors/volatile/dram_uncorrectable") == real["ecc.errors.uncorrected.volatile.dram"]
    assert gpu.findtext("remapped_rows/remapped_row_pending") == real["remapped_rows.pending"] == "No"
    assert gpu.findtext("remapped_rows/row_remapper_histogram/row_remapper_histogram_max") == \
        real["remapped_rows.histogram.max"] + " bank(s)"
    assert gpu.findtext("fb_memory_usage/total") == real["memory.total"] == "81559 MiB"
    assert gpu.findtext("clocks_event_reasons/clocks_event_reason_gpu_idle") == \
        real["clocks_event_reasons.gpu_idle"] == "Active"
    assert gpu.findtext("display_mode") == real["display_mode"].strip("[]")
    assert gpu.find("processes") is not None and len(gpu.find("processes")) == 0


def test_xml_before_535_names_throttle_reasons_as_the_515_capture(tmp_path):
    root = make_root(tmp_path, "a100-pcie", "515.105.01", cuda="11.7")
    text = ok(root, "-q", "-x")
    real = XML_T4.read_text()
    assert text.splitlines()[:2] == real.splitlines()[:2]
    ours = ET.fromstring(text).find("gpu/clocks_throttle_reasons")
    assert [c.tag for c in ours] == [c.tag for c in ET.fromstring(real).find("gpu/clocks_throttle_reasons")]
    assert ET.fromstring(text).find("gpu/clocks_event_reasons") is None


def test_pcie_cards_show_no_fabric_and_hgx_fabric_follows_fabric_manager(tmp_path):
    l40s = ET.fromstring(ok(make_root(tmp_path / "a", "l40s", "595.80"), "-q", "-x")).find("gpu")
    titles, values = capture(L40S)
    real = {field_of(t): v for t, v in zip(titles, values, strict=True)}
    assert l40s.findtext("fabric/state") == real["fabric.state"] == "N/A"
    # an NVSwitch system before fabric manager ever ran: the GPUs have not started joining the fabric
    hgx = make_root(tmp_path / "b", "hgx-h100", "590.48.01")
    assert {r["fabric.state"] for r in query(hgx, ["fabric.state"])} == {"Not Started"}
    (hgx / "run/gpuprov-lab/fabric-completed").write_text("")
    assert query(hgx, ["fabric.state", "fabric.status"])[0] == {"fabric.state": "Completed",
                                                                "fabric.status": "Success"}


# -------------------------------------------------------------------------------------------------- faults

@pytest.fixture
def hgx(tmp_path) -> Path:
    return make_root(tmp_path, "hgx-h100", "590.48.01", persistence=True, fabric=True)


UNCORRECTED = [f"ecc.errors.uncorrected.{k}.{p}" for k in ("volatile", "aggregate")
               for p in ("device_memory", "dram", "total")]


@pytest.mark.parametrize("fault,gpu,expected", [
    ("ecc-uncorrectable", 0, {f: "1" for f in UNCORRECTED}),
    ("ecc-uncorrectable 3", 3, {f: "1" for f in UNCORRECTED}),
    ("row-remap-pending", 0, {"remapped_rows.pending": "Yes"}),
    ("row-remapped 4", 4, {**{f: "1" for f in UNCORRECTED if ".aggregate." in f}, "remapped_rows.uncorrectable": "1"}),
    ("throttle 5", 5, {"clocks_event_reasons.hw_slowdown": "Active",
                       # the H100 capture's active mask (0x1, idle) with HW Slowdown's bit, 0x8
                       "clocks_event_reasons.active": "0x0000000000000009"}),
    ("pcie-x8", 0, {"pcie.link.width.current": "8"}),
    ("gpu-process 2", 2, {"memory.used": "1024 MiB", "memory.free": f"{81081 - 1024} MiB"}),
])
def test_each_fault_changes_exactly_its_fields(hgx, fault, gpu, expected):
    before = snapshot(hgx)
    set_faults(hgx, fault)
    assert changes(before, snapshot(hgx)) == {(gpu, k): v for k, v in expected.items()}


def test_throttle_on_the_xml_and_pcie_x8_on_the_link_width(hgx):
    set_faults(hgx, "throttle", "pcie-x8 1")
    gpus = ET.fromstring(ok(hgx, "-q", "-x")).findall("gpu")
    assert gpus[0].findtext("clocks_event_reasons/clocks_event_reason_hw_slowdown") == "Active"
    assert gpus[1].findtext("clocks_event_reasons/clocks_event_reason_hw_slowdown") == "Not Active"
    assert gpus[1].findtext("pci/pci_gpu_link_info/link_widths/current_link_width") == "8x"
    assert gpus[1].findtext("pci/pci_gpu_link_info/link_widths/max_link_width") == "16x"
    assert gpus[0].findtext("pci/pci_gpu_link_info/link_widths/current_link_width") == "16x"


def xml_values(root: Path) -> list[dict[str, str]]:
    out = []
    for gpu in ET.fromstring(ok(root, "-q", "-x")).findall("gpu"):
        out.append({path: (gpu.find(path.lstrip("/")).text or "").strip() for path in paths(gpu)})
    return out


@pytest.mark.parametrize("fault,expected", [
    ("ecc-uncorrectable", {"/ecc_errors/volatile/dram_uncorrectable": "1",
                           "/ecc_errors/aggregate/dram_uncorrectable": "1"}),
    ("row-remap-pending", {"/remapped_rows/remapped_row_pending": "Yes"}),
    ("row-remapped", {"/ecc_errors/aggregate/dram_uncorrectable": "1", "/remapped_rows/remapped_row_unc": "1"}),
    ("throttle", {"/clocks_event_reasons/clocks_event_reason_hw_slowdown": "Active"}),
    ("pcie-x8", {"/pci/pci_gpu_link_info/link_widths/current_link_width": "8x"}),
])
def test_each_fault_changes_exactly_its_xml_elements(hgx, fault, expected):
    before = xml_values(hgx)
    set_faults(hgx, fault)
    after = xml_values(hgx)
    diff = {(i, k): a[k] for i, (b, a) in enumerate(zip(before, after, strict=True)) for k in a if a[k] != b.get(k)}
    assert diff == {(0, k): v for k, v in expected.items()}


def test_gpu_process_shows_in_compute_apps_and_xml(hgx):
    apps = "--query-compute-apps=pid,process_name,used_memory"
    assert ok(hgx, apps, "--format=csv,noheader,nounits") == ""
    set_faults(hgx, "gpu-process")
    assert ok(hgx, apps, "--format=csv,noheader,nounits").splitlines() == ["4242, python3, 1024"]
    info = ET.fromstring(ok(hgx, "-q", "-x")).find("gpu/processes/process_info")
    assert [(c.tag, c.text) for c in info] == [("gpu_instance_id", "N/A"), ("compute_instance_id", "N/A"),
                                               ("pid", "4242"), ("type", "C"), ("process_name", "python3"),
                                               ("used_memory", "1024 MiB")]
    assert [c.tag for c in info] == [c.tag for c in ET.fromstring(XML_T4.read_text()).find(
        "gpu/processes/process_info")]


def test_gpu_missing_removes_one_gpu_everywhere(hgx):
    before = snapshot(hgx)
    listed = ok(hgx, "-L").splitlines()
    set_faults(hgx, "gpu-missing")
    after = snapshot(hgx)
    assert len(after) == 7 and ok(hgx, "-L").splitlines() == listed[:7]
    assert [{k: v for k, v in r.items() if k != "count"} for r in after] == \
        [{k: v for k, v in r.items() if k != "count"} for r in before[:7]]
    assert {r["count"] for r in after} == {"7"}
    assert ET.fromstring(ok(hgx, "-q", "-x")).findtext("attached_gpus") == "7"
    assert ok(hgx, "nvlink", "-s").count("GPU ") == 7
    set_faults(hgx, "gpu-missing 2")
    assert [r["pci.bus_id"] for r in query(hgx, ["pci.bus_id"])] == [before[i]["pci.bus_id"] for i in
                                                                     (0, 1, 3, 4, 5, 6, 7)]
    assert [r["index"] for r in query(hgx, ["index"])] == [str(i) for i in range(7)]


def test_nvlink_down_as_the_all_links_inactive_capture(hgx):
    before = (snapshot(hgx), ok(hgx, "nvlink", "-s").splitlines())
    set_faults(hgx, "nvlink-down 4")
    out = ok(hgx, "nvlink", "-s").splitlines()
    inactive = NVLINK_INACTIVE.read_text().splitlines()[1]
    links = len(NVLINK_H100.read_text().splitlines())
    assert out[4 * links:4 * links + 2] == [before[1][4 * links], inactive]
    assert out[:4 * links] == before[1][:4 * links] and out[4 * links + 2:] == before[1][5 * links:]
    assert changes(before[0], snapshot(hgx)) == {}


def test_driver_mismatch_fails_every_query_with_the_real_message_and_code(hgx):
    set_faults(hgx, "driver-mismatch")
    expected = (18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 590.48\n")
    for args in (["-L"], ["-q", "-x"], ["nvlink", "-s"], ["--query-gpu=name", "--format=csv"], ["-q"], []):
        assert smi(hgx, *args) == expected


def test_faults_file_errors_are_loud(hgx):
    (hgx / "etc/gpuprov-lab/faults").write_text("gpu-on-fire\n")
    rc, out = smi(hgx, "-L")
    assert rc == 2 and "unknown fault" in out
    (hgx / "etc/gpuprov-lab/faults").write_text("ecc-uncorrectable 8\n")
    rc, out = smi(hgx, "-L")
    assert rc == 2 and "names GPU 8, but the host has 8 GPUs" in out
    (hgx / "etc/gpuprov-lab/faults").write_text("# a comment\n\nthrottle 1  # hot\n")
    assert query(hgx, ["clocks_event_reasons.hw_slowdown"])[1]["clocks_event_reasons.hw_slowdown"] == "Active"


# ------------------------------------------------------------------------------------------ faults module

def test_fault_names_are_the_simulated_tools():
    assert set(lab_faults.known_faults()) == {"gpu-missing", "ecc-uncorrectable", "row-remap-pending",
                                              "row-remapped", "throttle", "pcie-x8", "nvlink-down",
                                              "driver-mismatch", "gpu-process", "gpu-busy"}
    assert lab_faults.global_faults() == ("driver-mismatch",)


def test_fault_specs_render_and_parse():
    from gpuprov.core.errors import InputError

    Fault = lab_faults.Fault
    assert lab_faults.render(["throttle", "pcie-x8:3", Fault("gpu-missing", 7), "driver-mismatch"]) == \
        "throttle\npcie-x8 3\ngpu-missing 7\ndriver-mismatch\n"
    assert Fault.parse("ecc-uncorrectable 2") == Fault("ecc-uncorrectable", 2)
    for bad in ("gpu-on-fire", "driver-mismatch 1", "throttle x", "throttle -1", ""):
        with pytest.raises(InputError):
            Fault.parse(bad)
    assert lab_faults.write_command([]) == "rm -f /etc/gpuprov-lab/faults"
    command = lab_faults.write_command(["throttle 1", "pcie-x8"])
    assert "printf %s 'throttle 1\npcie-x8\n' > /etc/gpuprov-lab/faults.tmp" in command


def test_write_command_writes_what_the_tool_reads(hgx, tmp_path):
    command = lab_faults.write_command(["throttle 1", "ecc-uncorrectable"])
    # the same command with the faults file under the test's root instead of /
    local = command.replace("/etc/gpuprov-lab", str(hgx / "etc/gpuprov-lab"))
    subprocess.run(["sh", "-c", local], check=True)
    rows = query(hgx, ["clocks_event_reasons.hw_slowdown", "ecc.errors.uncorrected.volatile.dram"])
    assert rows[1]["clocks_event_reasons.hw_slowdown"] == "Active"
    assert rows[0]["ecc.errors.uncorrected.volatile.dram"] == "1"


# ---------------------------------------------------------------------------------------------------- MIG

MIG_TABLE = FIXTURES / "nvidia-smi-table/h100-sxm5-80gb-mig-enabled_nvidia-smi_590.48.01_load.txt"
MIG_NVLINK = FIXTURES / "errors/h100-sxm5-80gb-mig-enabled_nvlink-s_not-supported-in-mig_590.48.01.txt"
# `nvidia-smi -L` and `nvidia-smi mig -lgi` as the NVIDIA MIG user guide prints them ("Getting Started with MIG").
GUIDE_MIG_LINE = "  MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)"
GUIDE_LGI = ["+-------------------------------------------------------+",
             "| GPU instances:                                        |",
             "| GPU   Name             Profile  Instance   Placement  |",
             "|                          ID       ID       Start:Size |",
             "|=======================================================|",
             "|   0  MIG 1g.5gb          19        7          4:1     |",
             "+-------------------------------------------------------+"]


def captured_mig_devices() -> list[dict[str, int]]:
    """The real H100 MIG host's MIG devices (its "MIG devices" table): SMs, memory MiB, BAR1 MiB, engines."""
    lines = MIG_TABLE.read_text().splitlines()
    out = []
    for number, first in enumerate(lines[:-1]):
        second = lines[number + 1]
        head = re.match(r"^\|\s+0\s+\d+\s+0\s+\d+\s+\|\s+\d+MiB /\s+(\d+)MiB\s+\|\s+(\d+)\s+0 \|\s+(\d+)\s+0\s+(\d+)"
                        r"\s+(\d+)\s+(\d+) \|$", first)
        if head:
            bar1 = re.search(r"/\s+(\d+)MiB", second)
            memory, sm, ce, dec, ofa, jpg = (int(x) for x in head.groups())
            out.append({"memory_mib": memory, "sm": sm, "ce": ce, "dec": dec, "ofa": ofa, "jpg": jpg,
                        "bar1_mib": int(bar1.group(1))})
    assert len(out) == 4
    return out


@pytest.fixture
def mig(tmp_path) -> Path:
    return make_root(tmp_path, "h100-mig", "590.48.01", persistence=True)


def test_mig_host_reports_mig_mode_enabled(mig):
    row = query(mig, ["index", "pci.bus_id", "mig.mode.current", "mig.mode.pending", "remapped_rows.pending"])
    assert row == [{"index": "0", "pci.bus_id": "00000000:00:09.0", "mig.mode.current": "Enabled",
                    "mig.mode.pending": "Enabled", "remapped_rows.pending": "[N/A]"}]
    doc = ET.fromstring(ok(mig, "-q", "-x"))
    real = ET.fromstring(XML_A100.read_text())  # the real A100 capture is of a MIG host
    for path in ("gpu/mig_mode/current_mig", "gpu/mig_mode/pending_mig", "gpu/remapped_rows"):
        assert doc.findtext(path).strip() == real.findtext(path).strip(), path


def test_mig_devices_in_the_list_as_the_mig_user_guide(mig):
    lines = ok(mig, "-L").splitlines()
    assert lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    pattern = r"  MIG (\S+) +Device +(\d+): \(UUID: MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\)"
    assert re.fullmatch(pattern, GUIDE_MIG_LINE)
    assert len(lines) == 5 and all(re.fullmatch(pattern, line) for line in lines[1:])
    # the guide's columns: "Device" and the device number where the guide has them
    assert {line.index("Device") for line in lines[1:]} == {GUIDE_MIG_LINE.index("Device")}
    assert [re.fullmatch(pattern, line).group(2) for line in lines[1:]] == ["0", "1", "2", "3"]
    assert [re.fullmatch(pattern, line).group(1) for line in lines[1:]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert len({line.split("(UUID: ")[1] for line in lines[1:]}) == 4
    assert [g["index"] for g in nvsmi.parse_list("\n".join(lines))] == [0]


def test_mig_devices_in_the_xml_as_the_captures(mig):
    gpu = ET.fromstring(ok(mig, "-q", "-x")).find("gpu")
    real_device = ET.fromstring(XML_A100.read_text()).find("gpu/mig_devices/mig_device")
    devices = gpu.findall("mig_devices/mig_device")
    assert all(paths(device) == paths(real_device) for device in devices)
    shown = [{"memory_mib": int(d.findtext("fb_memory_usage/total").split()[0]),
              "sm": int(d.findtext("device_attributes/shared/multiprocessor_count")),
              "ce": int(d.findtext("device_attributes/shared/copy_engine_count")),
              "dec": int(d.findtext("device_attributes/shared/decoder_count")),
              "ofa": int(d.findtext("device_attributes/shared/ofa_count")),
              "jpg": int(d.findtext("device_attributes/shared/jpg_count")),
              "bar1_mib": int(d.findtext("bar1_memory_usage/total").split()[0])} for d in devices]
    assert shown == captured_mig_devices()


def test_mig_gpu_instances_as_the_mig_user_guide(mig):
    lines = ok(mig, "mig", "-lgi").splitlines()
    assert lines[:5] == GUIDE_LGI[:5]
    rows = lines[5::2]
    assert lines[6::2] == [GUIDE_LGI[-1]] * 4
    assert all(len(row) == len(GUIDE_LGI[5]) for row in rows)
    # profile ids 9, 14, 19 (nvidia-smi mig -lgip on H100 80GB); placements fill the 8 memory slices in order
    assert [row.split()[4:7:2] for row in rows] == [["9", "0:4"], ["14", "4:2"], ["19", "6:1"], ["19", "7:1"]]
    rc, out = smi(make_root(mig.parent / "whole", "hgx-h100", "590.48.01"), "mig", "-lgi")
    assert (rc, out.strip()) == (6, "No MIG-enabled devices found.")


def test_mig_host_refuses_nvlink_queries_as_the_capture(mig):
    assert ok(mig, "nvlink", "-s").splitlines()[1:] == MIG_NVLINK.read_text().splitlines()[1:]


def test_mig_host_table_shows_mig_mode_as_the_capture(mig):
    real = MIG_TABLE.read_text().splitlines()
    ours = ok(mig).splitlines()
    assert ours[10].split("|")[3].strip() == real[10].split("|")[3].strip() == "Enabled"
    assert ours[9].split("|")[3].split()[0] == real[9].split("|")[3].split()[0] == "N/A"  # GPU-Util


def suite_context(root: Path):
    """A suite Context whose nvidia-smi is the stand-in on `root`."""
    from gpuprov.smoke.core import Context

    ctx = Context({"expect": {"form_factor": "sxm"}})

    def run(argv, timeout=30.0):
        assert argv[0] == "nvidia-smi"
        return (lambda rc_out: (rc_out[0], rc_out[1], ""))(smi(root, *argv[1:]))

    ctx.run = run
    return ctx


def test_the_suite_on_the_mig_host(mig):
    from gpuprov.smoke import host_ecc, host_nvlink, train_ddp

    ctx = suite_context(mig)
    assert nvsmi.mig_gpus(ctx) == ["GPU 0 (00000000:00:09.0)"]
    ddp = train_ddp.run(ctx)
    assert ddp.status == "skip" and ddp.reason.startswith("MIG is enabled on GPU 0 (00000000:00:09.0)")
    nvlink = host_nvlink.run(ctx)
    assert nvlink.status == "skip" and "MIG mode" in nvlink.reason
    ecc = host_ecc.run(ctx)
    assert ecc.status == "pass", ecc.reason
    assert ecc.figures["per_gpu"]["GPU 0 (00000000:00:09.0)"]["remapped_rows"] is None


def test_host_ecc_on_the_row_remapping_faults(hgx):
    from gpuprov.smoke import host_ecc

    set_faults(hgx, "row-remapped 2")
    history = host_ecc.run(suite_context(hgx))
    assert history.status == "warn"
    assert history.reason == ("GPU 2 (00000000:3A:00.0): 1 uncorrectable ECC errors in the GPU's lifetime, resolved "
                              "by 1 rows remapped (no remap pending or failed)")
    set_faults(hgx, "row-remapped 2", "row-remap-pending 2")
    pending = host_ecc.run(suite_context(hgx))
    assert pending.status == "fail" and "GPU 2 (00000000:3A:00.0): row remap pending" in pending.reason
