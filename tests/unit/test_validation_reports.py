"""validate's reports: JUnit XML read back with xml.etree by the JUnit schema's element names, the Prometheus
textfile read back with prometheus_client's own parser, the JSON report, the exit code (the fleet runtime's, with
validate's `failing`), Ctrl-C, and the textfile placed on the host through a temporary file in the textfile
folder."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
from helpers.local_host import LocalConn
from invoke import Config, Context
from invoke.exceptions import Exit
from prometheus_client.parser import text_string_to_metric_families

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.executor import Outcome, RunInterrupted
from gpuprov.validation.host import TEXTFILE, RunOptions, ValidateJob, ValidationRecord, publish_textfile
from gpuprov.validation.report import junit_report, prometheus_textfile
from gpuprov.validation.suite import parse_document

# A suite document as the runner prints it (the schema of docs: schema 1, versions, results with figures).
DOCUMENT = {
    "schema": 1, "host": "gpu01", "level": "quick", "started": "2026-09-01T10:00:00Z", "seconds": 41.2,
    "versions": {"python": "3.11.2", "torch": "2.7.1+cu128", "cuda": "12.8", "cudnn": "90100", "nccl": "2.26.2",
                 "onnxruntime": "1.22.0", "driver": "570.148.08"},
    "results": [
        {"check": "host.ecc", "status": "fail", "reason": "GPU 3: 2 uncorrectable (volatile) ECC errors",
         "figures": {"volatile_dbe": {"3": 2}}, "thresholds": {"volatile_dbe": 0}, "seconds": 0.4},
        {"check": "host.fabric", "status": "skip", "reason": "no NVSwitch expected", "figures": {},
         "thresholds": {}, "seconds": 0.0},
        {"check": "sizing", "status": "warn", "reason": "6 CPU cores per GPU, 8-16 recommended for training",
         "figures": {"cores_per_gpu": 6}, "thresholds": {"cores_per_gpu": 8}, "seconds": 0.1},
        {"check": "perf.matmul", "status": "pass", "reason": "bf16 712.0 TFLOP/s, 72% ... of 989",
         "figures": {"bf16_tflops": 700.5, "fp16_tflops": 705.0, "tf32_tflops": 360.0,
                     "per_gpu": {"0": {"bf16_tflops": 712.0, "fp16_tflops": 715.0, "tf32_tflops": 365.0},
                                 "1": {"bf16_tflops": 700.5, "fp16_tflops": 705.0, "tf32_tflops": 360.0}}},
         "thresholds": {"bf16_tflops": 791.2}, "seconds": 6.0},
        {"check": "perf.copy", "status": "pass", "reason": "ok",
         "figures": {"d2d_gbs": 2600.0, "h2d_gbs": 55.4, "d2h_gbs": 55.0,
                     "per_gpu": [{"d2d_gbs": 2600.0, "h2d_gbs": 55.4, "d2h_gbs": 55.0},
                                 {"d2d_gbs": 2610.0, "h2d_gbs": 55.6, "d2h_gbs": 55.1}]},
         "thresholds": {}, "seconds": 3.0},
        {"check": "perf.allreduce", "status": "pass", "reason": "ok", "figures": {"busbw_gbs": 451.3},
         "thresholds": {}, "seconds": 5.0},
    ],
}


def host_entry(document: dict = DOCUMENT, name: str = "gpu01") -> dict:
    doc = parse_document(name, json.dumps(document))
    run = ValidationRecord(name, address="10.0.0.11", gpu="H100-SXM", started=1788256800.0, seconds=44.0,
                         versions=doc["versions"], results=doc["results"], config={"gpus_visible": True})
    return run.to_dict()


def test_junit_reads_back_by_the_schema_element_names():
    failed = {"host": "gpu02", "address": "10.0.0.12", "results": [], "started": 1788256800.0, "seconds": 10.0,
              "error": {"error": "cannot reach 10.0.0.12:22 after 3 attempts", "step": "connect",
                        "hint": "check that the host is up"}}
    root = ET.fromstring(junit_report([host_entry(), failed]))
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"gpu01", "gpu02"}
    ok = suites["gpu01"]
    assert (ok.get("tests"), ok.get("failures"), ok.get("skipped"), ok.get("errors")) == ("6", "1", "2", "0")
    assert ok.get("hostname") == "10.0.0.11" and ok.get("timestamp") == "2026-09-01T10:00:00"
    cases = {c.get("name"): c for c in ok.findall("testcase")}
    assert cases["host.ecc"].find("failure").get("message") == "GPU 3: 2 uncorrectable (volatile) ECC errors"
    assert cases["host.ecc"].get("classname") == "gpuprov.validate.gpu01"
    assert cases["host.fabric"].find("skipped").get("message") == "no NVSwitch expected"
    assert cases["sizing"].find("skipped").get("message").startswith("warn: 6 CPU cores per GPU")
    assert cases["perf.matmul"].find("failure") is None and cases["perf.matmul"].find("skipped") is None
    assert json.loads(cases["perf.matmul"].find("system-out").text)["figures"]["bf16_tflops"] == 700.5
    assert float(cases["perf.matmul"].get("time")) == 6.0
    properties = {p.get("name"): p.get("value") for p in ok.find("properties").findall("property")}
    assert properties == {"gpu": "H100-SXM", "level": "quick", "status": "fail"}
    error = suites["gpu02"].find("testcase").find("error")
    assert error.get("message") == "cannot reach 10.0.0.12:22 after 3 attempts" and error.get("type") == "connect"


def test_textfile_reads_back_with_prometheus_clients_parser():
    text = prometheus_textfile(host_entry(), 1788256845.0)
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert samples[("gpuprov_check_ok", (("check", "host.ecc"), ("host", "gpu01")))] == 0
    assert samples[("gpuprov_check_ok", (("check", "perf.matmul"), ("host", "gpu01")))] == 1
    # a skip and a warn are no pass
    assert samples[("gpuprov_check_ok", (("check", "host.fabric"), ("host", "gpu01")))] == 0
    assert samples[("gpuprov_check_ok", (("check", "sizing"), ("host", "gpu01")))] == 0
    assert samples[("gpuprov_matmul_tflops", (("dtype", "bf16"), ("gpu", "0"), ("host", "gpu01")))] == 712.0
    assert samples[("gpuprov_matmul_tflops", (("dtype", "tf32"), ("gpu", "1"), ("host", "gpu01")))] == 360.0
    assert samples[("gpuprov_copy_gbps", (("direction", "h2d"), ("gpu", "1"), ("host", "gpu01")))] == 55.6
    assert samples[("gpuprov_copy_gbps", (("direction", "d2d"), ("gpu", "0"), ("host", "gpu01")))] == 2600.0
    assert samples[("gpuprov_allreduce_busbw_gbps", (("host", "gpu01"),))] == 451.3
    assert samples[("gpuprov_validate_timestamp_seconds", (("host", "gpu01"),))] == 1788256845.0
    assert len([k for k in samples if k[0] == "gpuprov_matmul_tflops"]) == 6


def test_textfile_without_per_gpu_figures_labels_them_all():
    document = json.loads(json.dumps(DOCUMENT))
    del document["results"][3]["figures"]["per_gpu"]
    text = prometheus_textfile(host_entry(document), 1.0)
    found = {(s.labels["gpu"], s.labels["dtype"]): s.value for f in text_string_to_metric_families(text)
             for s in f.samples if s.name == "gpuprov_matmul_tflops"}
    assert found == {("all", "bf16"): 700.5, ("all", "fp16"): 705.0, ("all", "tf32"): 360.0}


def test_a_failed_check_or_textfile_is_failing():
    job = ValidateJob(RunOptions())
    failing = host_entry()
    assert failing["status"] == "fail" and failing["counts"] == {"pass": 3, "fail": 1, "warn": 1, "skip": 1}
    assert job.failing(failing)
    passing = json.loads(json.dumps(DOCUMENT))
    passing["results"] = [r for r in passing["results"] if r["status"] != "fail"]
    entry = host_entry(passing)
    assert entry["status"] == "warn" and not job.failing(entry)
    assert job.failing(entry | {"textfile": {"path": "/srv/prom/gpuprov_validate.prom", "error": "refused"}})
    assert not job.failing(entry | {"textfile": {"path": "/srv/prom/gpuprov_validate.prom"}})


WARN_ONLY = {**DOCUMENT, "results": [r for r in DOCUMENT["results"] if r["status"] != "fail"]}


@pytest.mark.parametrize("documents,code", [
    ({"gpu01": DOCUMENT}, 1),                                                    # a check failed
    ({"gpu01": WARN_ONLY}, 0),                                                   # warnings and skips: no failure
    ({"gpu01": InputError("bad", host="gpu01", step="stack.resolve")}, 2),       # every problem is bad input
    ({"gpu01": GpuprovError("down", host="gpu01", step="connect")}, 1),          # the host could not be validated
    ({"gpu01": WARN_ONLY, "gpu02": InputError("bad", host="gpu02")}, 2),
    ({"gpu01": InputError("bad", host="gpu01"), "gpu02": GpuprovError("down", host="gpu02")}, 1),
], ids=["fail", "warn", "input", "down", "warn-and-input", "input-and-down"])
def test_exit_codes_through_the_fleet_runtime(tmp_path, monkeypatch, capsys, documents, code):
    if code:
        with pytest.raises(Exit) as caught:
            run_task(tmp_path, monkeypatch, documents, json_=True, textfile=False)
        assert caught.value.code == code
    else:
        run_task(tmp_path, monkeypatch, documents, json_=True, textfile=False)
    printed = json.loads(capsys.readouterr().out)
    errors = {h["host"]: h["error"] for h in printed["hosts"] if h["error"]}
    assert {name: error["input_error"] for name, error in errors.items()} == {
        name: isinstance(value, InputError) for name, value in documents.items() if isinstance(value, Exception)}


def test_a_textfile_that_cannot_be_placed_exits_1(tmp_path, monkeypatch, capsys):
    def refuse(conn, text, directory):
        raise GpuprovError("the folder is not root's alone", host=conn.host.name, step="textfile")

    monkeypatch.setattr("gpuprov.validation.host.publish_textfile", refuse)
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, {"gpu01": WARN_ONLY}, json_=True)
    assert caught.value.code == 1
    [entry] = json.loads(capsys.readouterr().out)["hosts"]
    assert entry["status"] == "warn" and entry["textfile"] == {
        "path": "/srv/prom/gpuprov_validate.prom", "error": "[gpu01] textfile: the folder is not root's alone"}


@pytest.mark.parametrize("document", [
    "not json", json.dumps({"schema": 2, "results": []}), json.dumps({"schema": 1}),
    json.dumps({"schema": 1, "results": [{"check": "host.ecc", "status": "ok", "reason": "x"}]}),
])
def test_a_run_without_a_valid_document_is_an_error(document):
    from gpuprov.core.errors import GpuprovError

    with pytest.raises(GpuprovError, match="the suite printed no valid result document"):
        parse_document("gpu01", document, "Traceback ...", 1, "python -m smoke")


def recording(name: str = "gpu01") -> LocalConn:
    """A host that answers every command with exit 0 and nothing printed; what it was sent is recorded."""
    return LocalConn(SimpleNamespace(name=name, user="root", address="10.0.0.11"), answer=lambda command, stdin: "")


def test_textfile_is_renamed_over_the_old_one_in_its_folder():
    conn = recording()
    text = prometheus_textfile(host_entry(), 1788256845.0)
    path = publish_textfile(conn, text, "/var/lib/prometheus/node-exporter")
    assert path == f"/var/lib/prometheus/node-exporter/{TEXTFILE}"
    (command, sudo, stdin), = zip(conn.commands, conn.sudo, conn.stdins, strict=True)
    assert sudo and stdin == text
    # the temporary file is made inside the textfile folder (same file system: the rename is atomic) and its
    # name does not end in .prom, so node_exporter never reads it
    assert "mktemp /var/lib/prometheus/node-exporter/.gpuprov_validate.prom.XXXXXX" in command
    assert 'mv -f "$t" /var/lib/prometheus/node-exporter/gpuprov_validate.prom' in command


def run_task(tmp_path, monkeypatch, documents: dict, interrupt_after: int | None = None, **options):
    """invoke validate on one H100-SXM host per document (named by its key), each host's validation replaced
    by the parse of its suite document (no SSH): a document that is refused is that host's failure, as the
    executor makes it; an error in place of a document is raised by that host's validation (at step connect: by
    the executor, before it). With
    `interrupt_after`, Ctrl-C comes once that many hosts completed (RunInterrupted, as the executor raises it)."""
    from gpuprov.catalog import lookup
    from gpuprov.tasks.validate import validate
    from gpuprov.validation.suite_config import datasheet

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("hosts:\n" + "".join(f"  {name}: {{address: 192.0.2.{i}, vars: {{hardware: {{gpu: H100-SXM, "
                                               f"count: 8}}}}}}\n" for i, name in enumerate(documents, 11)))

    def fake_run_on_hosts(hosts, work, settings, *, jump_of=None, on_event=None, hooks=None):
        outcomes = []
        for h in hosts:
            if len(outcomes) == interrupt_after:
                raise RunInterrupted(outcomes + [Outcome(rest, skipped=True, error=GpuprovError(
                    "not started: interrupted (Ctrl-C)", host=rest.name)) for rest in hosts[len(outcomes):]])
            unreachable = documents.get(h.name)
            if isinstance(unreachable, GpuprovError) and unreachable.step == "connect":
                outcomes.append(Outcome(h, error=unreachable))   # as the executor: the work never began
                continue
            conn = LocalConn(h, answer=lambda command, stdin: "")   # the inventory's host, as the executor's
            try:
                outcomes.append(Outcome(h, value=work(conn)))
            except GpuprovError as exc:
                outcomes.append(Outcome(h, error=exc))
        return outcomes

    def fake_validate(job, conn, record, say):
        record.gpu, record.config, record.textfile_dir = "H100-SXM", {"gpus_visible": True}, "/srv/prom"
        document = documents[conn.host.name]
        if isinstance(document, GpuprovError):
            raise document
        if job.dry_run:    # the environment step's plan: a dry run stops there
            record.env = {"mode": "image", "image": f"registry.example/{conn.host.name}:1"}
            return
        text = document if isinstance(document, str) else json.dumps(document)
        doc = parse_document(conn.host.name, text, datasheet=datasheet(lookup("H100-SXM")))
        record.versions, record.results = doc["versions"], doc["results"]

    monkeypatch.setattr("gpuprov.core.executor.run_on_hosts", fake_run_on_hosts)
    monkeypatch.setattr(ValidateJob, "validate", fake_validate)
    c = Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "reports": str(tmp_path / "reports"), "locks": str(tmp_path / "locks"),
        "known_hosts": str(tmp_path / "known_hosts"), "wheelhouse": str(tmp_path / "wheelhouse")}}))
    validate(c, all=True, **options)


def test_a_failed_check_exits_1_and_every_report_is_written(tmp_path, monkeypatch, capsys):
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, {"gpu01": DOCUMENT, "gpu02": DOCUMENT}, textfile=False)
    assert caught.value.code == 1
    reports = tmp_path / "reports"
    report = json.loads((reports / "validate-latest.json").read_text())
    assert [h["status"] for h in report["hosts"]] == ["fail", "fail"]
    ecc = next(r for r in report["hosts"][0]["results"] if r["check"] == "host.ecc")
    assert ecc["reason"] == "GPU 3: 2 uncorrectable (volatile) ECC errors"
    # two hosts: one peer each is no fleet to compare with (at least 3 needed)
    fleet = [r for r in report["hosts"][0]["results"] if r["check"].startswith("fleet.")]
    assert {r["check"]: r["status"] for r in fleet} == {"fleet.perf.matmul": "skip", "fleet.perf.copy": "skip",
                                                        "fleet.perf.allreduce": "skip"}
    root = ET.parse(reports / "validate-latest.xml").getroot()
    assert sorted(s.get("name") for s in root.findall("testsuite")) == ["gpu01", "gpu02"]
    assert (reports / "textfile" / "gpu01.prom").read_text().count("gpuprov_check_ok{") == 9
    out = capsys.readouterr().out
    assert "validate: fleet summary" in out and "host.ecc: GPU 3: 2 uncorrectable" in out


def test_ctrl_c_writes_the_report_with_what_completed_and_exits_130(tmp_path, monkeypatch, capsys):
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, dict.fromkeys(("gpu01", "gpu02", "gpu03"), WARN_ONLY), interrupt_after=1,
                 json_=True)
    assert caught.value.code == 130
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    reports = tmp_path / "reports"
    saved = json.loads((reports / "validate-latest.json").read_text())
    assert saved["hosts"] == printed["hosts"] and saved["interrupted"] is True
    assert (saved["level"], saved["strict"], saved["image"], saved["only"]) == ("quick", False, None, None)
    first, *rest = saved["hosts"]
    assert first["host"] == "gpu01" and first["status"] == "warn" and first["error"] is None
    # what completed is reported as it was: no fleet verdict, all-reduce or textfile came after the interruption
    assert [r["check"] for r in first["results"]] == [r["check"] for r in WARN_ONLY["results"]]
    assert "textfiles" not in saved and not (reports / "textfile").exists()
    assert [(h["host"], h["status"], h["error"]["error"], h["error"]["skipped"]) for h in rest] == [
        ("gpu02", "error", "not started: interrupted (Ctrl-C)", True),
        ("gpu03", "error", "not started: interrupted (Ctrl-C)", True)]
    root = ET.parse(reports / "validate-latest.xml").getroot()
    assert [s.get("name") for s in root.findall("testsuite")] == ["gpu01", "gpu02", "gpu03"]
    assert printed["junit"].endswith(".xml")
    assert f"interrupted (Ctrl-C): the report {printed['report']} has what completed" in captured.err


def test_a_failed_hosts_entry_keeps_what_its_validation_found(tmp_path, monkeypatch, capsys):
    documents = {"gpu01": WARN_ONLY, "gpu02": GpuprovError("pip install failed", host="gpu02", step="python env",
                                                           hint="read pip's output"),
                 "gpu03": GpuprovError("cannot reach 192.0.2.13:22", host="gpu03", step="connect")}
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, documents, json_=True)
    assert caught.value.code == 1
    hosts = {h["host"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}
    stopped = hosts["gpu02"]     # its record so far: the GPU found before the environment step failed
    assert (stopped["status"], stopped["gpu"], stopped["address"], stopped["results"]) == ("error", "H100-SXM",
                                                                                           "192.0.2.12", [])
    assert stopped["error"] == {"error": "pip install failed", "host": "gpu02", "step": "python env", "command": None,
                                "output": None, "hint": "read pip's output", "skipped": False, "input_error": False}
    assert stopped["textfile"] == {"path": "/srv/prom/gpuprov_validate.prom"}   # its failure published
    down = hosts["gpu03"]        # failed before its validation began: a record of its own
    assert (down["status"], down["gpu"], down["address"], down["results"]) == ("error", None, "192.0.2.13", [])
    assert down["error"]["step"] == "connect" and down["textfile"] == {}
    textfile = (tmp_path / "reports" / "textfile" / "gpu03.prom").read_text()
    assert 'gpuprov_check_ok{check="validation",host="gpu03"} 0.0' in textfile


def test_the_all_reduce_runs_on_the_fleet_and_names_a_failed_host(tmp_path, monkeypatch, capsys):
    """--multi-node after every host: the failed host is a node that is not ready (its error says why), the
    all-reduce's runs go through the fleet's executor with the settings it asks for, and every host's entry, the
    failed one's too, gets its multinode.allreduce result."""
    import dataclasses

    seen = {}
    verdict = {"check": "multinode.allreduce", "status": "fail", "reason": "did not join the rendezvous",
               "figures": {}, "thresholds": {}, "seconds": 0.0}
    summary = {"status": "fail", "hosts": ["gpu01", "gpu02", "gpu03"], "rendezvous": "192.0.2.11:29400",
               "reason": "did not join the rendezvous"}

    def fake_run_multinode(nodes, hosts, settings, *, run_on_hosts, port, **kwargs):
        seen["nodes"] = [(n.name, n.ready, n.problem) for n in nodes]
        seen["port"] = port
        every = dataclasses.replace(settings, parallel=len(hosts))
        seen["ran"] = [o.value for o in run_on_hosts(hosts, lambda conn: conn.host.name, every)]
        return {"results": {n.name: dict(verdict) for n in nodes}, "summary": summary}

    monkeypatch.setattr("gpuprov.validation.multinode.run_multinode", fake_run_multinode)
    documents = {"gpu01": WARN_ONLY, "gpu02": GpuprovError("pip install failed", host="gpu02", step="python env"),
                 "gpu03": WARN_ONLY}
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, documents, json_=True, multi_node=True, textfile=False)
    assert caught.value.code == 1
    printed = json.loads(capsys.readouterr().out)
    assert seen == {"nodes": [("gpu01", True, ""), ("gpu02", False, "pip install failed"), ("gpu03", True, "")],
                    "port": 29400, "ran": ["gpu01", "gpu02", "gpu03"]}
    assert printed["multi_node"] == summary
    assert [h["results"][-1] for h in printed["hosts"]] == [verdict] * 3
    assert printed["hosts"][1]["status"] == "error" and printed["hosts"][1]["counts"]["fail"] == 1


@pytest.mark.parametrize("json_", [False, True])
def test_the_dry_run_says_each_hosts_plan_and_writes_no_report(tmp_path, monkeypatch, capsys, json_):
    documents = {"gpu01": WARN_ONLY, "gpu02": GpuprovError("cannot reach 192.0.2.12:22", host="gpu02", step="connect")}
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, documents, dry_run=True, json_=json_)
    assert caught.value.code == 1        # a host could not be asked
    out = capsys.readouterr().out
    if json_:
        printed = json.loads(out)
        assert printed["dry_run"] is True and [h["host"] for h in printed["hosts"]] == ["gpu01", "gpu02"]
        assert printed["hosts"][0] == {"host": "gpu01", "env": {"mode": "image", "image": "registry.example/gpu01:1"},
                                       "error": None}
        assert printed["hosts"][1]["env"] == {} and printed["hosts"][1]["error"]["step"] == "connect"
    else:
        assert out.splitlines() == [
            "gpu01: the suite runs in registry.example/gpu01:1: nothing is installed on the host",
            "gpu02: not asked: cannot reach 192.0.2.12:22"]
    assert not list((tmp_path / "reports").glob("validate-*"))


def test_ctrl_c_in_a_dry_run_shows_what_completed_and_exits_130(tmp_path, monkeypatch, capsys):
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, {"gpu01": WARN_ONLY, "gpu02": WARN_ONLY}, interrupt_after=1, dry_run=True)
    assert caught.value.code == 130
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "gpu01: the suite runs in registry.example/gpu01:1: nothing is installed on the host",
        "gpu02: not asked: not started: interrupted (Ctrl-C)"]
    assert "interrupted (Ctrl-C)" in captured.err


def test_all_passing_exits_0_and_places_textfiles(tmp_path, monkeypatch, capsys):
    passing = json.loads(json.dumps(DOCUMENT))
    passing["results"] = [r for r in passing["results"] if r["status"] == "pass"]
    names = ("gpu01", "gpu02", "gpu03", "gpu04")
    run_task(tmp_path, monkeypatch, dict.fromkeys(names, passing), json_=True)
    printed = json.loads(capsys.readouterr().out)
    assert [h["status"] for h in printed["hosts"]] == ["pass"] * 4     # four hosts: three peers each
    fleet = {r["check"]: r["thresholds"]["hosts"] for r in printed["hosts"][0]["results"] if r["check"][:6] == "fleet."}
    assert fleet == {"fleet.perf.matmul": 3, "fleet.perf.copy": 3, "fleet.perf.allreduce": 3}
    assert [h["textfile"] for h in printed["hosts"]] == [{"path": "/srv/prom/gpuprov_validate.prom"}] * 4
    assert printed["junit"].endswith(".xml") and printed["report"].endswith(".json")


def test_tables_print_names_and_reasons_as_written(capsys):
    from gpuprov.core.report import summary_table

    document = json.loads(json.dumps(DOCUMENT))
    document["results"][0]["reason"] = "GPU [3]: [bold]2[/bold] uncorrectable [/] ECC\x1b[31m errors"
    entry = host_entry(document, name="[gpu01]")
    stopped = ValidationRecord("gpu\n02", address="192.0.2.12").to_dict() | {
        "error": {"error": "cannot read [/] the lock", "step": "validate config", "hint": "fix [prod]"}}
    job = ValidateJob(RunOptions(multi_node=True))
    job.multi_node = {"status": "fail", "hosts": ["[gpu01]", "gpu\n02"], "rendezvous": "[10.0.0.1]:29400",
                      "reason": "gpu\n02 did not join [/]"}
    job.print_details([entry, stopped])   # as run_fleet prints a run: the details, then the summary table
    summary_table(job.title(), [job.row(e) for e in (entry, stopped)], list(job.columns))
    out = capsys.readouterr().out
    assert "validate: fleet summary" in out and "host.ecc: GPU [3]: [bold]2[/bold]" in out
    assert "[gpu01] (H100-SXM, quick)" in out
    assert "GPU [3]: [bold]2[/bold] uncorrectable [/] ECC\\x1b[31m errors" in out and "\x1b" not in out
    assert "gpu\\n02: validation stopped cannot read [/] the lock" in out and "hint: fix [prod]" in out
    assert "rendezvous [10.0.0.1]:29400): fail gpu\\n02 did not join [/]" in out


STRICT_JSON = {"parse_constant": lambda name: pytest.fail(f"{name} in the JSON")}   # jq refuses NaN


def forged_run(tmp_path, monkeypatch, capsys, forge) -> tuple[dict, dict]:
    """Four passing hosts, the last one's document changed by `forge`: (printed report by host, exit code)."""
    passing = json.loads(json.dumps(DOCUMENT))
    passing["results"] = [r for r in passing["results"] if r["status"] == "pass"]
    forged = json.loads(json.dumps(passing))
    forged = forge(forged) or forged
    documents = {"gpu01": passing, "gpu02": passing, "gpu03": passing, "liar": forged}
    with pytest.raises(Exit) as caught:
        run_task(tmp_path, monkeypatch, documents, json_=True)
    printed = json.loads(capsys.readouterr().out, **STRICT_JSON)
    saved = json.loads((tmp_path / "reports" / "validate-latest.json").read_text(), **STRICT_JSON)
    assert saved["hosts"] == printed["hosts"]
    return {h["host"]: h for h in printed["hosts"]}, caught.value.code


def honest_hosts_are_judged_and_reported(tmp_path, hosts: dict) -> None:
    """The three honest hosts: passed, their fleet checks against each other only, their textfiles placed."""
    for name in ("gpu01", "gpu02", "gpu03"):
        entry = hosts[name]
        assert entry["error"] is None and entry["textfile"] == {"path": "/srv/prom/gpuprov_validate.prom"}
        assert all(r["status"] != "fail" for r in entry["results"]), entry["results"]
        assert {r["thresholds"]["hosts"] for r in entry["results"] if r["check"].startswith("fleet.")} == {2}
        assert (tmp_path / "reports" / "textfile" / f"{name}.prom").is_file()
    assert hosts["liar"]["results"] == [] and hosts["liar"]["status"] == "error"
    liar = (tmp_path / "reports" / "textfile" / "liar.prom").read_text()
    assert 'gpuprov_check_ok{check="validation",host="liar"} 0.0' in liar


def test_a_document_whose_figures_are_a_list_is_its_hosts_failure(tmp_path, monkeypatch, capsys):
    # the bug: `figures: [1, 2]` crashed apply_fleet on the main thread, and no host got a report
    def forge(document):
        document["results"][0]["figures"] = [1, 2]

    hosts, code = forged_run(tmp_path, monkeypatch, capsys, forge)
    assert code == 1
    assert hosts["liar"]["error"]["error"] == ("the suite printed no valid result document (results[0].figures: must "
                                               "be a mapping, not list [1, 2]); exit 0")
    assert hosts["liar"]["error"]["step"] == "suite"
    honest_hosts_are_judged_and_reported(tmp_path, hosts)


def test_a_figure_far_beyond_the_datasheet_is_its_hosts_failure(tmp_path, monkeypatch, capsys):
    # the bug: one peer at 1e300 made every honest host fail "100.0% below the fleet median"
    def forge(document):
        document["results"][0]["figures"]["bf16_tflops"] = 1e300

    hosts, _ = forged_run(tmp_path, monkeypatch, capsys, forge)
    assert ("results[0].figures.bf16_tflops: perf.matmul bf16_tflops 1e+300 TFLOP/s is above what the GPU can do: "
            "1038.45 (the datasheet's bf16_tflops 989 + 5 %)") in hosts["liar"]["error"]["error"]
    honest_hosts_are_judged_and_reported(tmp_path, hosts)


@pytest.mark.parametrize("forge,why", [
    (lambda d: d["results"][-1]["figures"].update(busbw_gbs=float("nan")),
     "results[2].figures.busbw_gbs: must be a finite number, not nan"),
    (lambda d: d["results"][1]["figures"]["per_gpu"][1].update(d2d_gbs=99999.0),
     "results[1].figures.per_gpu[1].d2d_gbs: perf.copy d2d_gbs 99999 GB/s is above what the GPU can do: 3517.5 "
     "(the datasheet's mem_bw_gbs 3350 + 5 %)"),
    (lambda d: d["results"][0].update(status="ok"), "results[0].status: 'ok' is not one of 'pass', 'fail', 'skip', "
                                                     "'warn'"),
    (lambda d: d["results"].append(d["results"][0]), "results[3]: check 'perf.matmul' comes twice (first at "
                                                      "results[0])"),
    (lambda d: d["results"][0].update(reason="x" * 70000), "results[0].reason: is 70000 characters long, at most "
                                                           "65536 allowed"),
    (lambda d: d.update(versions=[1]), "versions: must be a mapping, not list [1]"),
    (lambda d: d["results"][0].update(seconds="1"), "results[0].seconds: must be a number, not str '1'"),
    (lambda d: d["results"][0].update(figures={"per_gpu": [[[[[[[[[[[1]]]]]]]]]]]}),
     "results[0].figures.per_gpu[0][0][0][0][0][0][0][0][0]: is nested more than 9 levels deep"),
], ids=["nan", "per-gpu-copy", "status", "twice", "long-reason", "versions", "seconds", "deep"])
def test_a_malformed_document_fails_its_host_only(tmp_path, monkeypatch, capsys, forge, why):
    hosts, code = forged_run(tmp_path, monkeypatch, capsys, forge)
    assert code == 1
    assert hosts["liar"]["error"]["error"] == f"the suite printed no valid result document ({why}); exit 0"
    honest_hosts_are_judged_and_reported(tmp_path, hosts)


def test_a_stopped_hosts_output_is_cut_to_its_tail_in_the_report():
    from gpuprov.core.runtime import failed_entry

    job = ValidateJob(RunOptions())
    output = "".join(f"line {i}\n" for i in range(200000))    # 2.2 MB a host printed before it failed
    error = GpuprovError("pip install failed", host="gpu01", step="python env", output=output)
    entry = failed_entry(job, Outcome(type("H", (), {"name": "gpu01", "address": "192.0.2.11"})(), error=error))
    kept = entry["error"]["output"]
    note, _, tail = kept.partition("\n")
    assert note == f"[gpuprov: the first {len(output) - 65536} characters of the output are left out of the report]"
    assert tail == output[-65536:] and tail.endswith("line 199999\n")
    assert entry["status"] == "error" and entry["results"] == [] and entry["address"] == "192.0.2.11"
    short = failed_entry(job, Outcome(type("H", (), {"name": "gpu02", "address": "192.0.2.12"})(),
                                      error=GpuprovError("down", output="one line")))
    assert short["error"]["output"] == "one line"
    assert (short["error"]["skipped"], short["error"]["input_error"]) == (False, False)
