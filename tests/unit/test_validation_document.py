"""What a host sends back is checked before use (gpuprov.validation.document): the suite's document and the
multi-node all-reduce line against their schemas and the GPU's datasheet; a host's output is capped (its tail
kept) by the connection. Random JSON, text and bytes fed to the controller's parser give a checked document
or that host's GpuprovError, nothing else, and never a number that is not finite in what is reported.

Bounds are worked out by hand from gpuprov/data/gpus.yaml: H100-SXM bf16 989 TFLOP/s x 1.05 = 1038.45; its
memory 3350 GB/s x 1.05 = 3517.5; PCIe Gen5 63 GB/s x 1.05 = 66.15; GB200 has no PCIe host link (null), so its
memory bounds a host copy: 8000 x 1.05 = 8400."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.catalog import lookup
from gpuprov.core.connection import _drain, output_cut
from gpuprov.core.errors import GpuprovError
from gpuprov.validation.document import DocumentError, allreduce_document, bound, suite_document
from gpuprov.validation.suite import parse_document
from gpuprov.validation.suite_config import datasheet

H100 = datasheet(lookup("H100-SXM"))


def document(*results: dict, **top) -> dict:
    return {"schema": 1, "host": "gpu01", "level": "quick", "strict": False, "started": "2026-09-01T10:00:00+00:00",
            "seconds": 40.0, "versions": {"torch": "2.7.1", "cuda": "12.8", "cudnn": 90100, "error": None},
            "results": list(results), **top}


def result(check: str = "perf.matmul", **figures) -> dict:
    return {"check": check, "status": "pass", "reason": "ok", "figures": figures}


def refused(doc, sheet=H100) -> str:
    with pytest.raises(DocumentError) as caught:
        suite_document(doc, sheet)
    return str(caught.value)


# ---------------------------------------------------------------------------------------------------- schema

def test_an_honest_document_is_kept_and_gets_its_defaults():
    doc = document(result(bf16_tflops=712.0, per_gpu={"0": {"bf16_tflops": 712.0, "tf32_tflops": "nan"}}),
                   {"check": "import:perf_copy", "status": "fail", "reason": "SyntaxError", "figures": {},
                    "thresholds": {"datasheet": {"bf16_tflops": None}}, "seconds": 0.1})
    checked = suite_document(doc, H100)
    assert checked["results"][0] == {**result(bf16_tflops=712.0, per_gpu={"0": {"bf16_tflops": 712.0,
                                                                                 "tf32_tflops": "nan"}}),
                                     "thresholds": {}, "seconds": 0.0}
    assert suite_document({"schema": 1, "results": []}) == {"schema": 1, "results": [], "versions": {}}


@pytest.mark.parametrize("doc,why", [
    ({"schema": 2, "results": []}, "schema: 2 is not one of 1"),
    ({"schema": True, "results": []}, "schema: True is not one of 1"),
    ({"schema": 1}, "results is missing"),
    ({"schema": 1, "results": [], "extra": 1}, "unknown key 'extra' (known: schema, host, level, strict, started, "
                                               "seconds, versions, results)"),
    (document(result(bf16_tflops=True)), None),
    (document({"check": "Host ECC", "status": "pass", "reason": "ok"}),
     "results[0].check: 'Host ECC' does not match"),
    (document({"check": "host.ecc", "status": "pass"}), "results[0]: reason is missing"),
    (document({"check": "host.ecc", "status": "pass", "reason": None}), "results[0].reason: must be a string, not "
                                                                       "NoneType None"),
    (document(result(per_gpu=[{"d2d_gbs": 10**30}])), "results[0].figures.per_gpu[0].d2d_gbs: must be a finite "
                                                      "number, not 1000000000000000000000000000000"),
    (document(result(bf16_tflops=-1.0)), "results[0].figures.bf16_tflops: perf.matmul bf16_tflops -1 is negative"),
    (document(result(bf16_tflops=1039.0)), "results[0].figures.bf16_tflops: perf.matmul bf16_tflops 1039 TFLOP/s "
                                           "is above what the GPU can do: 1038.45 (the datasheet's bf16_tflops 989 "
                                           "+ 5 %)"),
    (document(result("perf.copy", h2d_gbs=67.0)), "results[0].figures.h2d_gbs: perf.copy h2d_gbs 67 GB/s is above "
                                                  "what the GPU can do: 66.15 (the datasheet's pcie_gbs 63 + 5 %)"),
    (document(result("infer.latency", b1_per_s=1e9)), "results[0].figures.b1_per_s: infer.latency b1_per_s 1e+09 /s "
                                                      "is above what the GPU can do: 1e+08 (a call takes at "
                                                      "least a kernel launch)"),
    (document(result(), level="slow"), "level: 'slow' is not one of 'quick', 'burn-in'"),
    (document(result(), versions={"torch": {"v": 1}}), "versions.torch: must be a string, a number, a boolean or "
                                                       "null, not dict {'v': 1}"),
    (document(*[result(f"c{i}") for i in range(257)]), "results: has 257 items, at most 256 allowed"),
], ids=lambda value: None)
def test_a_malformed_document_is_refused_with_where(doc, why):
    if why is None:   # a boolean is no figure: kept as it is, never compared (figures_of takes numbers only)
        assert suite_document(doc, H100)["results"][0]["figures"] == {"bf16_tflops": True}
        return
    assert refused(doc).startswith(why)


def test_bounds_come_from_the_gpus_datasheet_or_the_catalog():
    gb200 = datasheet(lookup("GB200"))
    assert gb200["pcie_gbs"] is None
    assert bound("perf.copy", "h2d_gbs", gb200) == (8400.0, "the datasheet's mem_bw_gbs 8000 + 5 %")
    assert bound("perf.copy", "h2d_gbs", H100) == pytest.approx((66.15, "the datasheet's pcie_gbs 63 + 5 %"))
    # no GPU model known: the highest figure of the catalog (B200 and GB200: 2500 dense bf16, 8000 GB/s)
    assert bound("perf.matmul", "bf16_tflops", None) == (2625.0, "the catalog's highest fp16_tflops 2500 + 5 %")
    assert bound("perf.matmul", "fp32_tflops", H100) == pytest.approx((519.225,
                                                                       "the datasheet's tf32_tflops 494.5 + 5 %"))
    assert bound("host.ecc", "volatile_dbe", H100) is None


def test_a_cpu_measured_lab_host_is_within_every_bound():
    doc = document(result(fp32_tflops=0.07, bf16_tflops=0.02, per_gpu={"cpu": {"fp32_tflops": 0.07}}),
                   result("perf.copy", d2d_gbs=9.5, per_gpu={"cpu": {"d2d_gbs": 9.5}}),
                   result("infer.latency", b1_per_s=900.0, b32_per_s=9000.0, b1_p50_ms=1.1))
    assert suite_document(doc, H100)["results"][1]["figures"]["d2d_gbs"] == 9.5


def test_the_all_reduce_line_is_checked():
    line = {"world_size": 2, "backend": "gloo", "device": "cpu", "nodes": ["lab01", "lab02"],
            "ranks": [{"rank": 0, "node": "lab01", "hostname": "a"}], "size_bytes": 16 << 20, "iters": 10,
            "expected_sum": 3.0, "wrong_elements": 0, "time_s": 0.1, "algbw_gbs": 0.2, "busbw_gbs": 0.2}
    assert allreduce_document(line, H100) == line
    with pytest.raises(DocumentError, match=r"^busbw_gbs: multinode.allreduce busbw_gbs 1e\+300 GB/s is above"):
        allreduce_document({**line, "busbw_gbs": 1e300}, H100)
    with pytest.raises(DocumentError, match=r"^world_size: must be a whole number, not 2.5"):
        allreduce_document({**line, "world_size": 2.5}, H100)
    with pytest.raises(DocumentError, match=r"^wrong_elements is missing"):
        allreduce_document({k: v for k, v in line.items() if k != "wrong_elements"}, H100)


def test_parse_document_takes_the_last_line_and_refuses_deep_nesting():
    text = "warning: something\n" + json.dumps(document(result(bf16_tflops=700.0)))
    assert parse_document("gpu01", text, datasheet=H100)["results"][0]["figures"] == {"bf16_tflops": 700.0}
    with pytest.raises(GpuprovError, match=r"no valid result document \(not a JSON object\); exit 1"):
        parse_document("gpu01", "[" * 200000, "", 1)


# ----------------------------------------------------------------------------------------- output is capped

class Channel:
    """A paramiko channel that streams `chunks` on stdout (and one line on stderr), then exits."""

    def __init__(self, chunks, timeout: float = 60.0):
        self.chunks, self.timeout = chunks, timeout
        self.pending = next(self.chunks, None)
        self.err = [b"progress\n"]
        self.eof_received = self.closed = False

    def gettimeout(self):
        return self.timeout

    def recv_ready(self):
        return self.pending is not None

    def recv(self, size):
        data, self.pending = self.pending, next(self.chunks, None)
        return data

    def recv_stderr_ready(self):
        return bool(self.err)

    def recv_stderr(self, size):
        return self.err.pop()

    def exit_status_ready(self):
        self.eof_received = self.pending is None
        return self.eof_received


def test_a_host_printing_without_end_is_cut_to_its_tail():
    import tracemalloc

    block = b"x" * 65535 + b"\n"
    tail = json.dumps(document(result(bf16_tflops=700.0))).encode() + b"\n"
    chunks = iter([block] * 1024 + [tail])   # 64 MiB, then the document
    tracemalloc.start()
    out, err = _drain(Channel(chunks), cap=1 << 20)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    total = 1024 * len(block) + len(tail)
    dropped = total - (1 << 20)
    assert out.startswith(f"[gpuprov: output cut: the first {dropped} bytes were dropped, the last 1048576 kept]\n")
    assert out.endswith(tail.decode()) and err == "progress\n"
    assert output_cut(out) == dropped and output_cut(err) == 0
    assert peak < 8 << 20           # at most twice the cap for the stream, whatever the host prints
    # the document at the end of the kept tail is still read
    assert parse_document("gpu01", out, err, 0)["results"][0]["figures"] == {"bf16_tflops": 700.0}


def test_a_document_cut_by_the_cap_says_so():
    cut = "[gpuprov: output cut: the first 123456 bytes were dropped, the last 4194304 kept]\n" + '"status": "pass"}]}'
    with pytest.raises(GpuprovError) as caught:
        parse_document("gpu01", cut, "", 0)
    assert caught.value.message == ("the suite printed no valid result document (not a JSON object; its output was "
                                    "cut: the first 123456 bytes were dropped); exit 0")


def test_a_stream_that_never_pauses_still_times_out():
    def endless():
        while True:
            yield b"y" * 65536

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _drain(Channel(endless(), timeout=0.5), cap=1 << 16)
    assert time.monotonic() - started < 30


# --------------------------------------------------------------------------------------- random input (fuzz)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30)
KEYS = st.sampled_from(["schema", "results", "versions", "check", "status", "reason", "figures", "thresholds",
                        "seconds", "per_gpu", "bf16_tflops", "d2d_gbs", "busbw_gbs", "b1_per_s", "level", "host"])
CHECKS = st.sampled_from(["perf.matmul", "perf.copy", "perf.allreduce", "infer.latency", "host.ecc"])
# documents near the schema, so that the fuzz reaches past its first check
NEAR = st.fixed_dictionaries({"schema": st.just(1) | JSON, "results": st.lists(st.fixed_dictionaries(
    {"check": CHECKS | JSON, "status": st.sampled_from(["pass", "fail", "skip", "warn"]) | JSON,
     "reason": st.text(max_size=20) | JSON,
     "figures": st.dictionaries(KEYS, JSON | st.floats(min_value=0, max_value=1e4), max_size=4) | JSON},
    optional={"seconds": JSON, "thresholds": JSON}), max_size=4) | JSON},
    optional={"versions": st.dictionaries(st.text(max_size=8), JSON, max_size=3) | JSON, "extra": JSON})


def finite_everywhere(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_everywhere(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(finite_everywhere(v) for v in value)
    return True


def controller(stdouts: list[str], tmp_path) -> None:
    """What validate does with the hosts' outputs: parse each (a refusal is that host's failure), the fleet,
    the report entries, JSON, JUnit and the textfile; nothing may raise, nothing reported may be non-finite."""
    from gpuprov.core.executor import Outcome
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.runtime import failed_entry
    from gpuprov.validation.host import RunOptions, ValidateJob, ValidationRecord, apply_fleet
    from gpuprov.validation.report import junit_report, prometheus_textfile

    job = ValidateJob(RunOptions())
    runs = []
    for i, stdout in enumerate(stdouts):
        name = f"gpu{i:02d}"
        try:
            doc = parse_document(name, stdout, "", 0, "python -m smoke", H100)
        except GpuprovError as exc:
            failed_entry(job, Outcome(type("H", (), {"name": name, "address": "192.0.2.1"})(), error=exc))
            runs.append(job.records[name])    # the failed host's record, its error set
            continue
        runs.append(ValidationRecord(name, gpu="H100-SXM", config={"gpus_visible": True}, versions=doc["versions"],
                                     results=doc["results"]))
    apply_fleet(runs, tmp_path, strict=False)
    entries = [run.to_dict() for run in runs]
    assert finite_everywhere(entries)
    json.loads(dump_json({"hosts": entries}), parse_constant=lambda name: pytest.fail(name))
    junit_report(entries)
    for entry in entries:
        prometheus_textfile(entry, 1.0)
    assert all(isinstance(job.failing(entry), bool) for entry in entries)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@FUZZ
@given(st.lists(JSON | NEAR, min_size=1, max_size=4))
def test_random_json_is_a_document_or_its_hosts_failure(tmp_path, docs):
    honest = json.dumps(document(result(bf16_tflops=700.0), result("perf.copy", d2d_gbs=2600.0)))
    controller([honest, honest, honest] + [json.dumps(doc) for doc in docs], tmp_path)


@FUZZ
@given(st.lists(st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode(errors="replace")),
                min_size=1, max_size=3))
def test_random_text_and_bytes_are_their_hosts_failure(tmp_path, outputs):
    controller(outputs, tmp_path)


@FUZZ
@given(JSON.map(json.dumps) | st.text(max_size=200))
def test_a_random_all_reduce_line_is_a_checked_result_or_none(line):
    from gpuprov.validation.multinode import MARK, parse_output

    found = parse_output(f"[rank0]: starting\n{MARK}{line}\n")
    assert found is None or (isinstance(found, dict) and finite_everywhere(found) and found["busbw_gbs"] >= 0)
