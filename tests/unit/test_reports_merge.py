"""invoke reports.merge: the validate reports of a run's shards joined into the report the unsharded run writes.

The reports are written by `invoke validate` itself (the fleet runtime, ValidateJob.finish with the fleet module,
the report writer), each host's validation replaced by the parse of a recorded suite document (no SSH): once over
4 hosts, once per shard (--shard 1/2, 2/2, each in its own reports folder, as on other machines); the merge of the
two shard reports must give the unsharded run's hosts, fleet verdicts included."""

from __future__ import annotations

import copy
import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.local_host import LocalConn
from invoke import Config, Context
from invoke.exceptions import Exit
from prometheus_client.parser import text_string_to_metric_families

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.executor import Outcome
from gpuprov.core.report import write_json_report
from gpuprov.core.shards import Shard, shard_record
from gpuprov.validation.host import ValidateJob
from gpuprov.validation.merge import merge_reports
from gpuprov.validation.suite import parse_document

HOSTS = ("gpu01", "gpu02", "gpu03", "gpu04")


def document(bf16: float, d2d: float) -> dict:
    """A suite document as the runner prints it, with this host's matmul and copy figures."""
    return {
        "schema": 1, "host": "gpu", "level": "quick", "started": "2026-09-01T10:00:00Z", "seconds": 41.2,
        "versions": {"python": "3.11.2", "torch": "2.7.1+cu128", "cuda": "12.8", "cudnn": "90100", "nccl": "2.26.2",
                     "onnxruntime": "1.22.0", "driver": "570.148.08"},
        "results": [
            {"check": "host.ecc", "status": "pass", "reason": "no ECC errors", "figures": {"volatile_dbe": {}},
             "thresholds": {"volatile_dbe": 0}, "seconds": 0.4},
            {"check": "perf.matmul", "status": "pass", "reason": f"bf16 {bf16} TFLOP/s",
             "figures": {"bf16_tflops": bf16, "fp16_tflops": bf16 + 4.5, "tf32_tflops": 360.0},
             "thresholds": {"bf16_tflops": 500.0}, "seconds": 6.0},
            {"check": "perf.copy", "status": "pass", "reason": "ok",
             "figures": {"d2d_gbs": d2d, "h2d_gbs": 55.4, "d2h_gbs": 55.0}, "thresholds": {}, "seconds": 3.0},
        ],
    }


# gpu03 is 20 % below its peers' bf16 median: an outlier only when compared with the whole fleet
DOCUMENTS = {"gpu01": document(700.5, 2600.0), "gpu02": document(702.0, 2590.0), "gpu03": document(560.0, 2605.0),
             "gpu04": document(698.0, 2610.0)}


def context(folder: Path, history: Path | None = None) -> Context:
    """Settings of a controller whose files are in `folder` (its reports in `history` when given)."""
    inventory = folder / "inventory.yaml"
    if not inventory.exists():
        folder.mkdir(parents=True, exist_ok=True)
        inventory.write_text("hosts:\n" + "".join(
            f"  {name}: {{address: 192.0.2.{i}, vars: {{hardware: {{gpu: H100-SXM, count: 8}}}}}}\n"
            for i, name in enumerate(HOSTS, 11)))
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "reports": str(history or folder / "reports"), "locks": str(folder / "locks"),
        "known_hosts": str(folder / "known_hosts"), "wheelhouse": str(folder / "wheelhouse")}}))


@pytest.fixture
def recorded(monkeypatch):
    """validate's hosts answer with their recorded documents."""
    from gpuprov.catalog import lookup
    from gpuprov.validation.suite_config import datasheet

    def fake_run_on_hosts(hosts, work, settings, *, jump_of=None, on_event=None, hooks=None):
        outcomes = []
        for h in hosts:
            try:
                outcomes.append(Outcome(h, value=work(LocalConn(h, answer=lambda command, stdin: ""))))
            except GpuprovError as exc:
                outcomes.append(Outcome(h, error=exc))
        return outcomes

    def fake_validate(job, conn, record, say):
        record.gpu, record.config = "H100-SXM", {"gpus_visible": True}
        doc = parse_document(conn.host.name, json.dumps(DOCUMENTS[conn.host.name]),
                             datasheet=datasheet(lookup("H100-SXM")))
        record.versions, record.results = doc["versions"], doc["results"]

    monkeypatch.setattr("gpuprov.core.executor.run_on_hosts", fake_run_on_hosts)
    monkeypatch.setattr(ValidateJob, "validate", fake_validate)


def run_validate(folder: Path, **options) -> Path:
    """invoke validate (--all on the 4 hosts unless `options` select) in its own folder: the report it wrote."""
    from gpuprov.tasks.validate import validate

    options.setdefault("all", not options.get("host"))
    try:
        validate(context(folder), textfile=False, json_=True, **options)
    except Exit as exc:
        assert exc.code in (0, 1)
    return next(p for p in (folder / "reports").glob("validate-*.json") if p.name != "validate-latest.json")


def merge_task(tmp_path, out: Path, *reports, **options):
    from gpuprov.tasks.reports import merge

    (tmp_path / "history").mkdir(exist_ok=True)
    return merge(context(tmp_path / "controller", history=tmp_path / "history"), out=str(out),
                 report=[str(r) for r in reports], **options)


def fleet_view(report: dict) -> dict:
    """Per host what the fleet comparison decides: every result, the status, the counts, the fleet group."""
    return {h["host"]: {k: h[k] for k in ("results", "status", "counts", "fleet")} for h in report["hosts"]}


@pytest.fixture
def shards(tmp_path, recorded, capsys) -> tuple[dict, list[Path]]:
    """The unsharded report and the two shards' reports."""
    whole = json.loads(run_validate(tmp_path / "whole").read_text())
    parts = [run_validate(tmp_path / f"shard{k}", shard=f"{k}/2") for k in (1, 2)]
    capsys.readouterr()
    return whole, parts


def test_two_shards_merged_give_the_unsharded_fleet_report(tmp_path, shards, capsys):
    whole, parts = shards
    halves = [json.loads(p.read_text()) for p in parts]
    assert [[h["host"] for h in half["hosts"]] for half in halves] == [["gpu01", "gpu03"], ["gpu02", "gpu04"]]
    # within a shard each host has one peer: no fleet verdict (at least 3 needed), so gpu03 passes there
    assert {r["status"] for half in halves for h in half["hosts"] for r in h["results"]
            if r["check"].startswith("fleet.")} == {"skip"}
    # the unsharded run finds gpu03's matmul 20 % below the median of its 3 peers
    assert {h["host"]: h["status"] for h in whole["hosts"]} == {"gpu01": "pass", "gpu02": "pass", "gpu03": "fail",
                                                                 "gpu04": "pass"}
    merge_task(tmp_path, tmp_path / "merged" / "fleet.json", *parts, json_=True)
    merged = json.loads((tmp_path / "merged" / "fleet.json").read_text())
    assert fleet_view(merged) == fleet_view(whole)
    timing = ("started", "seconds", "suite_seconds")    # when each run's records were made: all else is the same
    assert [{k: v for k, v in h.items() if k not in timing} for h in merged["hosts"]] == \
           [{k: v for k, v in h.items() if k not in timing} for h in whole["hosts"]]
    assert {k: merged[k] for k in ("level", "strict", "image", "only")} == \
           {k: whole[k] for k in ("level", "strict", "image", "only")}
    assert [m["hosts"] for m in merged["merged_from"]] == [["gpu01", "gpu03"], ["gpu02", "gpu04"]]
    printed = json.loads(capsys.readouterr().out)
    assert printed["report"] == str(tmp_path / "merged" / "fleet.json") and fleet_view(printed) == fleet_view(whole)


def test_the_merge_writes_the_junit_and_textfiles_of_the_whole_fleet(tmp_path, shards, capsys):
    _whole, parts = shards
    merge_task(tmp_path, tmp_path / "merged" / "fleet.json", *parts)
    out = capsys.readouterr().out
    assert "validate: fleet summary" in out and "junit:" in out
    root = ET.parse(tmp_path / "merged" / "fleet.xml").getroot()
    assert sorted(s.get("name") for s in root.findall("testsuite")) == list(HOSTS)
    failed = [c.get("name") for s in root.findall("testsuite") if s.get("name") == "gpu03"
              for c in s.findall("testcase") if c.find("failure") is not None]
    assert failed == ["fleet.perf.matmul"]
    assert sorted(p.name for p in (tmp_path / "merged" / "textfile").iterdir()) == [f"{h}.prom" for h in HOSTS]
    text = (tmp_path / "merged" / "textfile" / "gpu03.prom").read_text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("gpuprov_check_ok", (("check", "fleet.perf.matmul"), ("host", "gpu03")))] == 0
    assert samples[("gpuprov_check_ok", (("check", "perf.matmul"), ("host", "gpu03")))] == 1


def test_a_folder_stands_for_its_reports(tmp_path, shards, capsys):
    whole, parts = shards
    folder = tmp_path / "collected"
    folder.mkdir()
    for part in parts:
        (folder / f"validate-{part.parent.parent.name}.json").write_text(part.read_text())
    (folder / "validate-latest.json").write_text(parts[0].read_text())   # not a report of its own: passed over
    merge_task(tmp_path, tmp_path / "fleet.json", folder)
    assert fleet_view(json.loads((tmp_path / "fleet.json").read_text())) == fleet_view(whole)


def test_the_same_report_twice_keeps_each_host_once(tmp_path, shards, capsys):
    whole, parts = shards
    copied = tmp_path / "copy.json"
    copied.write_text(parts[0].read_text())
    merge_task(tmp_path, tmp_path / "fleet.json", parts[0], parts[1], copied)
    assert [h["host"] for h in json.loads((tmp_path / "fleet.json").read_text())["hosts"]] == list(HOSTS)


def refused(tmp_path, capsys, *reports) -> str:
    with pytest.raises(Exit) as caught:
        merge_task(tmp_path, tmp_path / "fleet.json", *reports)
    assert caught.value.code == 2   # bad input, and nothing written: no report, no JUnit, no textfile
    assert not any((tmp_path / name).exists() for name in ("fleet.json", "fleet.xml", "textfile"))
    return capsys.readouterr().err


def rewrite(path: Path, change, name: str | None = None) -> Path:
    report = json.loads(path.read_text())
    change(report)
    target = path.with_name(name) if name else path
    target.write_text(json.dumps(report))
    return target


def test_a_host_in_two_reports_with_other_results_is_refused_naming_it(tmp_path, shards, capsys):
    _whole, parts = shards

    def steal(report):   # shard 2 also says it validated gpu01, with its own results
        other = copy.deepcopy(report["hosts"][0])
        other["host"] = "gpu01"
        report["hosts"].append(other)

    rewrite(parts[1], steal)
    err = refused(tmp_path, capsys, *parts)
    assert f"host gpu01 is in {parts[0].name} and in {parts[1].name} with different results" in err


def test_reports_asked_with_other_options_are_refused_naming_the_files(tmp_path, shards, capsys):
    _whole, parts = shards
    rewrite(parts[1], lambda r: r.update(level="burn-in"))
    err = refused(tmp_path, capsys, *parts)
    assert "the reports were asked with other options" in err
    assert f'{parts[0].name} with level="quick"' in err and f'{parts[1].name} with level="burn-in"' in err


def test_strict_and_lenient_shards_are_refused(tmp_path, shards, capsys):
    _whole, parts = shards
    rewrite(parts[0], lambda r: r.update(strict=True))
    assert "strict=true" in refused(tmp_path, capsys, *parts)


def test_a_report_of_another_kind_is_refused_naming_it(tmp_path, shards, capsys):
    _whole, parts = shards
    other = write_json_report(tmp_path / "elsewhere", "provision", {"dry_run": False, "interrupted": False,
                                                                    "hosts": [{"host": "gpu09", "status": "changed"}]})
    err = refused(tmp_path, capsys, parts[0], other)
    assert f"{other} is not a validate report (a provision report?)" in err


@pytest.mark.parametrize("change, why", [
    (lambda r: r.update(interrupted=True), "is the report of an interrupted run"),
    (lambda r: r.update(multi_node={"status": "pass"}), "has an all-reduce (--multi-node)"),
])
def test_an_unfinished_or_all_reduced_shard_is_refused(tmp_path, shards, capsys, change, why):
    _whole, parts = shards
    rewrite(parts[1], change)
    assert f"{parts[1]} {why}" in refused(tmp_path, capsys, *parts)


# -- shard records: `shard` in each report (gpuprov.core.shards.shard_record), as the fleet runtime records it

def recorded_shards(parts: list[Path], records: list[dict]) -> list[Path]:
    return [rewrite(part, lambda r, rec=rec: r.update(shard=rec)) for part, rec in zip(parts, records, strict=True)]


def selection(*names):
    from gpuprov.inventory import Host

    return [Host(name=n, address="192.0.2.1") for n in names]


def test_recorded_shards_of_one_selection_merge(tmp_path, shards, capsys):
    whole, parts = shards
    recorded_shards(parts, [shard_record(Shard(k, 2), selection(*HOSTS)) for k in (1, 2)])
    merge_task(tmp_path, tmp_path / "fleet.json", *parts)
    merged = json.loads((tmp_path / "fleet.json").read_text())
    assert fleet_view(merged) == fleet_view(whole)
    assert [m["shard"]["index"] for m in merged["merged_from"]] == [1, 2]


def test_a_missing_shard_is_named(tmp_path, shards, capsys):
    _whole, parts = shards
    recorded_shards(parts, [shard_record(Shard(k, 3), selection(*HOSTS)) for k in (1, 2)])
    assert "shards 3 of 3 are missing" in refused(tmp_path, capsys, *parts)


def test_shards_of_different_selections_are_refused(tmp_path, shards, capsys):
    _whole, parts = shards
    recorded_shards(parts, [shard_record(Shard(1, 2), selection(*HOSTS)),
                            shard_record(Shard(2, 2), selection("gpu02", "gpu04", "gpu05", "gpu06"))])
    assert "the reports are shards of different selections" in refused(tmp_path, capsys, *parts)


def test_a_shard_given_twice_is_refused(tmp_path, shards, capsys):
    _whole, parts = shards
    recorded_shards(parts, [shard_record(Shard(1, 2), selection(*HOSTS))] * 2)
    assert f"shard 1/2 comes twice: {parts[0].name} and {parts[1].name}, with other hosts or results" in \
        refused(tmp_path, capsys, *parts)


def test_one_report_is_not_a_merge(tmp_path, shards, capsys):
    _whole, parts = shards
    assert "needs the reports of at least two shards, not 1" in refused(tmp_path, capsys, parts[0])


def test_recent_reports_count_as_in_a_run(tmp_path, shards):
    """The merge judges against the reports folder's recent reports, as the run does (fleet.recent_samples): with
    two shards of gpu01 and gpu02 alone, the history's gpu03 and gpu04 make the peers."""
    _whole, parts = shards
    history = tmp_path / "history"
    only_two = [run_validate(tmp_path / f"two{k}", host=["gpu01,gpu02"], shard=f"{k}/2") for k in (1, 2)]
    empty = merge_reports(only_two, history)
    assert {r["status"] for h in empty["hosts"] for r in h["results"] if r["check"] == "fleet.perf.matmul"} == \
           {"skip"}
    history.mkdir(exist_ok=True)
    (history / "validate-20260901T100000Z.json").write_text(parts[0].read_text())   # gpu01, gpu03
    (history / "validate-20260901T100001Z.json").write_text(parts[1].read_text())   # gpu02, gpu04
    judged = merge_reports(only_two, history)
    matmul = {h["host"]: r for h in judged["hosts"] for r in h["results"] if r["check"] == "fleet.perf.matmul"}
    assert {name: r["status"] for name, r in matmul.items()} == {"gpu01": "pass", "gpu02": "pass"}
    assert matmul["gpu01"]["thresholds"]["hosts"] == 3    # gpu02 (this merge), gpu03 and gpu04 (the history)


def test_each_report_records_its_shard_and_the_unsharded_one_none(shards):
    whole, parts = shards
    # the selection's digest worked out here: sha256 of the sorted names, one a line, its first 16 hex digits
    digest = hashlib.sha256(b"gpu01\ngpu02\ngpu03\ngpu04").hexdigest()[:16]
    assert [json.loads(p.read_text())["shard"] for p in parts] == [
        {"index": k, "count": 2, "selected": 4, "selection": digest} for k in (1, 2)]
    assert whole["shard"] is None


def test_an_unsharded_report_is_refused_naming_it(tmp_path, shards, capsys):
    _whole, parts = shards
    whole = next(p for p in (tmp_path / "whole" / "reports").glob("validate-*.json") if "latest" not in p.name)
    err = refused(tmp_path, capsys, parts[0], whole)
    assert f"{whole.name} is the report of a run without --shard" in err


def test_a_report_whose_hosts_are_not_its_shard_is_refused(tmp_path, shards, capsys):
    _whole, parts = shards

    def swap(pair):   # gpu03 moved from shard 1 to shard 2: every host once, but not as --shard deals them
        one, two = (json.loads(p.read_text()) for p in pair)
        two["hosts"].append(one["hosts"].pop())
        for path, report in zip(pair, (one, two), strict=True):
            path.write_text(json.dumps(report))

    swap(parts)
    assert f"{parts[0].name} does not hold shard 1/2's hosts of the selection (gpu01, gpu03)" in \
        refused(tmp_path, capsys, *parts)


def test_shards_that_lack_a_host_of_their_selection_are_refused(tmp_path, shards, capsys):
    _whole, parts = shards
    rewrite(parts[1], lambda r: r.update(hosts=r["hosts"][:1]))    # gpu04 left out
    assert "the shards hold 3 hosts, not the 4 hosts their selection" in refused(tmp_path, capsys, *parts)


@pytest.mark.parametrize("record", [{"index": 3, "count": 2, "selected": 4, "selection": "x"},
                                    {"index": "1", "count": 2, "selected": 4, "selection": "x"}, [1, 2]])
def test_a_malformed_shard_record_is_refused(tmp_path, shards, capsys, record):
    _whole, parts = shards
    rewrite(parts[1], lambda r: r.update(shard=record))
    assert f"{parts[1].name}: its shard record" in refused(tmp_path, capsys, *parts)


def test_a_host_name_that_is_not_one_is_refused(tmp_path, shards):
    _whole, parts = shards
    rewrite(parts[1], lambda r: r["hosts"][0].update(host="../etc/x"))
    with pytest.raises(InputError, match=r"is not a host name"):
        merge_reports(parts, tmp_path / "history")
