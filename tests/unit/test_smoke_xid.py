"""NVIDIA's Xid table (gpuprov/smoke/xid.py), the kernel-log parser and the host.xid check.

Meanings are NVIDIA's ("Analyzing Xid Errors with the Xid Catalog", docs.nvidia.com/deploy/xid-errors/); the
expected strings below were read from that catalog. Kernel-log inputs are the real dmesg capture in
tests/fixtures/errors/ (GPUD's `dmesg-with-xid-119.log`) and real log lines quoted with their source.
"""

from __future__ import annotations

from pathlib import Path

from gpuprov.smoke import host_xid, xid
from gpuprov.smoke.core import Context

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
XID_119_LOG = (FIXTURES / "errors" / "h100-hgx_dmesg_xid-119-gsp-rpc-timeout.log").read_text()

# NVIDIA/open-gpu-kernel-modules issue #1151 (RTX 5080), journal lines as posted.
XID_79_LINES = ("May 18 19:02:39 kernel: NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae\n"
                "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
                "May 18 19:02:39 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.\n")
# pastebin.com/fTNHmgzB (a desktop GPU's syslog), one of its lines.
XID_31_LINE = ("May 13 17:19:01 hyperion kernel: NVRM: Xid (PCI:0000:08:00): 31, Ch 0000003b, intr 10000000. "
               "MMU Fault: ENGINE GRAPHICS HUBCLIENT_SCC faulted @ 0x0_04687000. "
               "Fault is of type FAULT_PDE ACCESS_TYPE_READ\n")
# NVIDIA's Xid document (vR384), "Viewing Xid Error Messages": the format of drivers before "PCI:" was added.
OLD_FORMAT_LINE = "[...] NVRM: Xid (0000:03:00): 14, Channel 00000001\n"
# stas00/ml-engineering compute/accelerator/nvidia/debug.md, a row-remapper event.
XID_63_LINE = ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to "
               "activate.\n")


def test_catalog_meanings_named_by_the_issue():
    fallen = xid.classify(79)
    assert fallen.name() == "Xid 79 (GPU has fallen off the bus, ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS)"
    assert (fallen.klass, fallen.status, fallen.action) == ("bus", "fail", "RESTART_BM")
    memory = {n: xid.classify(n).description for n in (48, 63, 64, 94, 95)}
    assert memory == {48: "Double Bit ECC Error", 63: "GPU memory remapping event", 64: "GPU memory remapping failure",
                      94: "Contained memory error", 95: "Uncontained memory error"}
    assert {xid.classify(n).klass for n in memory} == {"memory"}
    assert {xid.classify(n).status for n in memory} == {"fail"}
    application = {n: xid.classify(n).description for n in (13, 31, 43)}
    assert application == {13: "Graphics Engine Exception", 31: "GPU memory page fault", 43: "GPU stopped processing"}
    assert {(xid.classify(n).klass, xid.classify(n).status) for n in application} == {("application", "warn")}


def test_catalog_other_classes():
    gsp = xid.classify(119)
    assert (gsp.mnemonic, gsp.description, gsp.action, gsp.klass, gsp.status) == (
        "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "firmware", "fail")
    assert (xid.classify(74).description, xid.classify(74).klass) == ("NVLINK Error", "nvlink")
    assert (xid.classify(41).description, xid.classify(41).klass) == ("Copy Engine Exception", "engine")
    assert xid.classify(154).status == "info"
    # NVIDIA's immediate action IGNORE: a warn (Xid 93, InfoROM wear limit).
    assert (xid.classify(93).action, xid.classify(93).status) == ("IGNORE", "warn")
    unknown = xid.classify(3)  # "Unused" in the catalog for Ampere and newer
    assert (unknown.klass, unknown.status) == ("unknown", "fail")
    assert "not in NVIDIA's Xid catalog" in unknown.name()


def test_parse_the_real_dmesg_capture():
    events = xid.parse_kernel_log(XID_119_LOG)
    assert [e.number for e in events] == [119, 119, 119, 119, 119]
    assert {e.pci for e in events} == {"0000:9b:00"}
    assert events[0].message == ("pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from "
                                 "GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")
    assert events[3].message.startswith("pid=1263500, name=cache_mgr_main,")
    assert events[4].message.startswith("pid=1240590, name=gpud,")
    assert xid.verdict(events) == "fail"


def test_parse_other_real_lines():
    (fallen,) = xid.parse_kernel_log(XID_79_LINES)
    assert (fallen.number, fallen.pci, fallen.message) == (79, "0000:2b:00", "GPU has fallen off the bus.")
    (fault,) = xid.parse_kernel_log(XID_31_LINE)
    assert (fault.number, fault.pci) == (31, "0000:08:00")
    assert xid.verdict([fault]) == "warn"
    (old,) = xid.parse_kernel_log(OLD_FORMAT_LINE)
    assert (old.number, old.pci, old.message) == (14, "0000:03:00", "Channel 00000001")
    (remap,) = xid.parse_kernel_log(XID_63_LINE)
    assert (remap.number, remap.pci) == (63, "0000:10:1c")


JOURNAL = ("journalctl", "-k", "-b", "-o", "cat", "--no-pager")


def xid_ctx(answers: dict) -> Context:
    ctx = Context({})

    def run(argv, timeout=30.0):
        for prefix, answer in answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return answer
        return 127, "", f"{argv[0]}: not found"

    ctx.run = run
    return ctx


def test_xid_check_names_each_xid():
    result = host_xid.run(xid_ctx({JOURNAL: (0, XID_119_LOG, "")}))
    assert result.status == "fail"
    assert ("Xid 119 (GSP RPC Timeout, GSP_RPC_TIMEOUT) x5 on 0000:9b:00 [firmware, NVIDIA action RESET_GPU]"
            in result.reason)
    assert result.figures["source"] == "journalctl -k -b -o cat --no-pager"
    assert result.figures["xids"]["119"]["count"] == 5
    result = host_xid.run(xid_ctx({JOURNAL: (0, XID_79_LINES + XID_31_LINE, "")}))
    assert result.status == "fail"
    assert ("Xid 79 (GPU has fallen off the bus, ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) x1 on 0000:2b:00"
            in result.reason)
    assert "Xid 31 (GPU memory page fault, ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT) x1 on 0000:08:00" in result.reason


def test_xid_check_warn_on_application_faults_pass_on_clean_log():
    result = host_xid.run(xid_ctx({JOURNAL: (0, XID_31_LINE, "")}))
    assert result.status == "warn"
    clean = "".join(XID_119_LOG.splitlines(keepends=True)[:2])  # "NVRM: GPU at PCI:...", board serial: no Xid
    result = host_xid.run(xid_ctx({JOURNAL: (0, clean, "")}))
    assert result.status == "pass" and result.figures["events"] == 0


def test_xid_check_falls_back_to_dmesg_then_skips():
    no_journal = (1, "", "No journal files were found.\n")
    result = host_xid.run(xid_ctx({JOURNAL: no_journal, ("dmesg",): (0, XID_119_LOG, "")}))
    assert result.status == "fail" and result.figures["source"] == "dmesg"
    empty = (0, "-- No entries --\n", "")
    denied = (1, "", "dmesg: read kernel buffer failed: Operation not permitted\n")
    result = host_xid.run(xid_ctx({JOURNAL: empty, ("dmesg",): denied}))
    assert result.status == "skip"
    assert result.reason == ("cannot read the kernel log: journalctl -k -b -o cat --no-pager: no kernel messages; "
                             "dmesg: dmesg: read kernel buffer failed: Operation not permitted")
