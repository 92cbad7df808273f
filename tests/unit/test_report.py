"""The one report writer: unique names even within one second and across concurrent runs, masked, latest copy."""

import json
import threading

import pytest

from gpuprov.core import report
from gpuprov.core.report import write_json_report


def test_two_reports_in_the_same_second_keep_both(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_stamp", lambda: "20260101T000000Z")
    first = write_json_report(tmp_path, "provision", {"run": 1})
    second = write_json_report(tmp_path, "provision", {"run": 2})
    third = write_json_report(tmp_path, "provision", {"run": 3})
    assert [first.name, second.name, third.name] == ["provision-20260101T000000Z.json",
                                                    "provision-20260101T000000Z-2.json",
                                                    "provision-20260101T000000Z-3.json"]
    assert [json.loads(p.read_text())["run"] for p in (first, second, third)] == [1, 2, 3]
    assert json.loads((tmp_path / "provision-latest.json").read_text()) == {"run": 3}


def test_concurrent_runs_never_share_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_stamp", lambda: "20260101T000000Z")
    paths = []

    def run(number: int) -> None:
        paths.append(write_json_report(tmp_path, "provision", {"run": number}))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(paths)) == 16
    assert sorted(json.loads(p.read_text())["run"] for p in paths) == list(range(16))
    assert json.loads((tmp_path / "provision-latest.json").read_text())["run"] in range(16)
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_reports_mask_credentials(tmp_path):
    path = write_json_report(tmp_path / "new", "preflight", {"proxy": "http://ops:s3cret@proxy:3128"})
    assert "s3cret" not in path.read_text() and "http://***@proxy:3128" in path.read_text()


def test_a_report_is_strict_json_with_nan_as_null(tmp_path):
    path = write_json_report(tmp_path, "provision", {"figures": {"tflops": float("nan"), "gbs": float("inf")}})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a report")) == {
        "figures": {"tflops": None, "gbs": None}}
