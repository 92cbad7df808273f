"""`invoke report`, the fleet report: one HTML file from the reports folder, read back with the standard library's
HTML parser. Hosts and failures are where the folder's reports put them (failures first), expected figures are the
catalog's data file's (gpuprov/data/gpus.yaml, read here with PyYAML), the fleet band is worked out by hand, a
corrupt or foreign file is skipped with a warning naming it, and no host name or message can add markup."""

from __future__ import annotations

import functools
import json
import re
import tempfile
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from helpers.fleet_reports import H100, T0, fleet_folder, stamp, stopped_host, validate_host, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Config, Context
from invoke.exceptions import Exit

from gpuprov.tasks.report import report as report_task
from gpuprov.validation.html_report import read_folder, render, write_report

REPO = Path(__file__).resolve().parents[2]
URL = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)


class Page(HTMLParser):
    """The parsed page: every start tag with its attributes, the text, every table row's cell texts and each
    table's rows by its class."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.rows: list[list[str]] = []
        self.tables: list[tuple[str, list[list[str]]]] = []
        self._open: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "table":
            self.tables.append((dict(attrs).get("class") or "", []))
            self._open.append(self.tables[-1][1])
        elif tag == "tr":
            self.rows.append([])
            if self._open:
                self._open[-1].append(self.rows[-1])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table" and self._open:
            self._open.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def table(self, css_class: str) -> list[list[str]]:
        """The rows (after the header) of the first table with this class."""
        return next(rows for classes, rows in self.tables if css_class in classes.split())[1:]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleet") / "reports"
    expected = fleet_folder(folder)
    out = folder.parent / "fleet.html"
    path, loaded = write_report(folder, out, now=T0 + 3 * 86400)
    return expected, Page(path.read_text(encoding="utf-8")), loaded, path


def test_the_matrix_has_every_host_failures_first_then_by_name(fleet):
    expected, page, _, _ = fleet
    hosts = [row[0] for row in page.table("matrix")]
    failing = ["gpu07", "gpu13", "gpu20"]
    assert hosts == failing + [name for name in expected["hosts"] if name not in failing]
    cells = [(tag, attrs) for tag, attrs in page.tags if tag == "td" and "cell" in (attrs.get("class") or "")]
    assert {attrs["class"].split()[1] for _, attrs in cells} == {"pass", "fail", "warn", "skip"}
    assert any(attrs["title"].startswith("host.ecc: fail: GPU 3: 2 uncorrectable") for _, attrs in cells)
    row20 = next(row for row in page.table("matrix") if row[0] == "gpu20")
    assert "validation stopped: cannot connect: connection refused" in row20


def test_every_failure_is_listed_with_its_reason(fleet):
    expected, page, _, _ = fleet
    rows = [tuple(row) for row in page.table("failures")]
    assert rows == [("gpu07", "perf.matmul", expected["failures"][0][2]),
                    ("gpu13", "host.ecc", expected["failures"][1][2]),
                    ("gpu20", "validation", "cannot connect: connection refused (step connect)")]


def test_corrupt_and_foreign_files_are_skipped_with_a_warning_naming_them(fleet):
    expected, page, loaded, _ = fleet
    skipped = sorted(Path(w.split(": skipped: ")[0]).name for w in loaded.warnings)
    assert skipped == expected["skipped"]   # not validate-latest.json (a copy), not preflight-*.json (another job)
    text = " ".join(page.text)
    assert "broken.json: skipped: not JSON" in text and "notes.json: skipped: not a report gpuprov writes" in text


def test_nothing_is_fetched_no_script_no_remote_url(fleet):
    _, page, _, path = fleet
    html = path.read_text(encoding="utf-8")
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe", "img", "object", "embed", "base"), tag
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
                assert not URL.match(value or ""), (tag, name, value)
    assert not re.search(r"https?://", html), "a remote URL in the page"
    assert "@import" not in html and "url(" not in html
    csp = next(attrs["content"] for tag, attrs in page.tags if attrs.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp


def catalog(model: str) -> dict:
    return yaml.safe_load((REPO / "gpuprov" / "data" / "gpus.yaml").read_text())["models"][model]


def test_perf_figures_are_against_the_catalogs_expected_figure(fleet):
    _, page, _, _ = fleet
    text = " ".join(page.text)
    h100, l40s = catalog("H100-SXM")["expected"], catalog("L40S")["expected"]
    assert "H100-SXM (GPU, quick): 24 hosts" in text and "L40S (GPU, quick): 8 hosts" not in text
    assert "L40S (GPU, quick): 7 hosts" in text   # gpu20 (an L40S) stopped: no figures this time
    headers = [cell for row in page.rows for cell in row if "expected" in cell]
    for value in (h100["bf16_tflops"]["value"], h100["d2d_gbs"]["value"], l40s["bf16_tflops"]["value"]):
        assert any(re.search(rf"expected {value:.1f}(?![\d.])", cell) for cell in headers), value
    perf = page.table("perf")
    assert perf[0][0] == "gpu07"   # below the band first
    low = [attrs for tag, attrs in page.tags if tag == "rect" and attrs.get("class") == "bar low"]
    assert len(low) == 7   # gpu07's seven figures (scaled to 0.7), and no other host's


def test_the_fleet_band_is_the_median_and_the_outlier_margin(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    entries = [validate_host(f"n{i}", H100, scale=scale) for i, scale in enumerate((0.1, 0.2, 0.3, 0.4))]
    for entry in entries:   # bf16 70, 140, 210, 280 TFLOP/s: median 175, band 10 % either side
        entry["results"] = [r for r in entry["results"] if r["check"] in ("perf.matmul", "fleet.perf.matmul")]
    write(folder, f"validate-{stamp(T0)}.json", {"level": "quick", "hosts": entries, "finished_epoch": T0}, T0)
    page = Page(render(read_folder(folder)))
    bf16 = next(cell for row in page.rows for cell in row if cell.startswith("perf.matmul") and "bf16" in cell)
    assert "median 175.0band 157.5–192.5" in bf16
    lows = [row[0] for row in page.table("perf")]
    assert lows[:2] == ["n0", "n1"]   # 70 and 140 are below 157.5: first


def test_trend_and_operations_per_host(fleet):
    expected, page, _, _ = fleet
    trend = {row[0]: row for row in page.table("trend")}
    assert set(trend) == set(expected["hosts"]) and trend["gpu07"][1].startswith("3")
    runs = [attrs for tag, attrs in page.tags if tag == "span" and (attrs.get("title") or "").endswith(": fail")]
    assert len(runs) == 2   # gpu07 and gpu13 failed the last run
    points = [attrs["points"] for tag, attrs in page.tags if tag == "polyline"]
    assert points and all(re.fullmatch(r"[0-9., ]+", p) for p in points)
    ops = {row[0]: row[1:] for row in page.table("ops")}
    assert set(ops) == set(expected["hosts"])
    assert ops["gpu01"][0].startswith("changed") and "driver 570.172.08" in ops["gpu01"][0]
    assert "failing controls: ssh.root_login" in ops["gpu01"][1]
    assert ops["gpu32"][1].startswith("failed") and "sshd -t refused the config (step ssh)" in ops["gpu32"][1]
    assert ops["gpu02"][2].startswith("resumed") and "hgx@1 -> hgx@2" in ops["gpu02"][2]
    assert ops["gpu05"][2] == "no report"


HOSTILE = st.one_of(st.text(min_size=1, max_size=40), st.sampled_from([
    "<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "</title><svg onload=alert(1)>", "{{ 7*7 }}",
    "&lt;b&gt;", "<!--", "]]>", "' onmouseover='x", "</td></tr></table><h1>x</h1>", "javascript:alert(1)"]))


def structure(text: str) -> Counter:
    """The page's elements and their attribute names, counted (a host's place in the page may change)."""
    return Counter((tag, tuple(sorted(attrs))) for tag, attrs in Page(text).tags)


def hostile_page(name: str, message: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        hosts = [validate_host(name, H100, fail={"host.ecc": message}), validate_host("zz01", H100),
                 stopped_host("zz02", message)]
        hosts[0]["fleet"]["group"] = message
        write(Path(folder), f"validate-{stamp(T0)}.json", {"level": "quick", "hosts": hosts}, T0)
        write(Path(folder), f"provision-{stamp(T0)}.json", {"hosts": [
            {"host": name, "status": message, "lock": message, "error": {"error": message, "step": message}}]}, T0)
        return render(read_folder(folder), now=T0)


@functools.cache
def plain_structure() -> Counter:
    return structure(hostile_page("gpu01", "plain"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=HOSTILE.filter(lambda s: s.strip() and s not in ("zz01", "zz02")), message=HOSTILE)
def test_a_hostile_host_name_or_message_is_text_never_markup(name, message):
    page = hostile_page(name, message)
    assert structure(page) == plain_structure()   # no element, no attribute added
    text = "".join(Page(page).text)
    assert name in text and message in text


def context(reports: Path) -> Context:
    return Context(Config(overrides={"gpuprov": {"reports": str(reports)}}))


def test_the_task_writes_the_page_from_the_configured_folder(fleet, tmp_path, capsys):
    folder = fleet[3].parent / "reports"
    out = tmp_path / "out" / "fleet.html"
    report_task(context(folder), out=str(out))
    captured = capsys.readouterr()
    assert out.is_file() and "32 hosts validated" in captured.out
    assert captured.err.count("warning: ") == 2 and "broken.json: skipped: not JSON" in captured.err


@pytest.mark.parametrize(("options", "words"), [
    ({}, "--out needs the path"),
    ({"out": "x.html", "reports": "/nonexistent/reports"}, "--reports: no such folder /nonexistent/reports"),
])
def test_bad_input_is_exit_2_naming_the_option(tmp_path, capsys, options, words):
    with pytest.raises(Exit) as caught:
        report_task(context(tmp_path), **{k: str(tmp_path / v) if k == "out" else v for k, v in options.items()})
    assert caught.value.code == 2 and words in capsys.readouterr().err


def test_an_empty_folder_gives_a_page_that_says_so(tmp_path):
    page = Page(render(read_folder(tmp_path)))
    text = " ".join(page.text)
    assert "No validate report in the folder." in text and "0 hosts validated" in text


def test_a_report_of_a_known_kind_in_a_wrong_shape_is_skipped_a_wrong_time_is_the_files(tmp_path):
    write(tmp_path, f"validate-{stamp(T0)}.json", {"hosts": [{"host": "gpu01", "results": "nope"}]}, T0)
    write(tmp_path, f"provision-{stamp(T0)}.json", json.dumps([1, 2]), T0)
    write(tmp_path, "rollout-journal-0a1b2c3d-1.json", {"run_id": "x", "hosts": {"gpu01": "resumed"}}, T0)
    write(tmp_path, "harden-20261399T999999Z.json", {"hosts": [{"host": "gpu01", "status": "changed"}]}, T0)
    loaded = read_folder(tmp_path)
    assert [(r.kind, r.when) for r in loaded.reports] == [("harden", T0)]   # no such time: the file's own
    assert sorted(w.split(": skipped: ")[1] for w in loaded.warnings) == [
        "not a provision report (no list of hosts)", "not a rollout journal (a host without its state)",
        "not a validate report (a host without results)"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                max_size=4), max_leaves=12)
ANY_FIGURE = st.one_of(JSON, st.floats(), st.sampled_from([1e308, -1.0, 0, 10**400, float("inf"), True]))
RESULT = st.fixed_dictionaries({"check": st.one_of(st.sampled_from(["perf.matmul", "perf.copy", "fleet.perf.copy"]),
                                                   JSON),
                                "status": st.one_of(st.sampled_from(["pass", "fail", "warn", "skip"]), JSON),
                                "reason": JSON,
                                "figures": st.one_of(st.dictionaries(st.sampled_from(["bf16_tflops", "d2d_gbs"]),
                                                                     ANY_FIGURE), JSON),
                                "thresholds": st.one_of(st.fixed_dictionaries(
                                    {"max_below_fleet_median_pct": ANY_FIGURE}), JSON)})
HOST = st.fixed_dictionaries({"host": st.one_of(st.text(min_size=1, max_size=10), JSON),
                              "results": st.one_of(st.lists(RESULT, max_size=3), JSON),
                              "gpu": st.one_of(st.sampled_from(["H100-SXM", "L40S"]), JSON),
                              "status": JSON, "error": JSON, "config": JSON, "fleet": JSON,
                              "state": JSON, "controls": JSON, "stack": JSON})
REPORT = st.one_of(JSON, st.fixed_dictionaries({"hosts": st.one_of(st.lists(HOST, max_size=4), JSON),
                                                "finished_epoch": ANY_FIGURE, "run_id": JSON}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents=st.lists(REPORT, min_size=1, max_size=4))
def test_any_json_in_the_folder_gives_a_page_never_a_crash(documents):
    names = ("validate-20261201T000000Z.json", "provision-20261201T000000Z.json", "harden-20261201T000000Z.json",
             "rollout-journal-0a1b2c3d-1.json")
    with tempfile.TemporaryDirectory() as folder:
        for name, document in zip(names, documents, strict=False):
            Path(folder, name).write_text(json.dumps(document), encoding="utf-8")
        loaded = read_folder(folder)
        assert len(loaded.reports) + len(loaded.warnings) == len(documents)
        assert Page(render(loaded)).tags[0][0] == "html"
