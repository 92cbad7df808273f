"""validate's console output as a run prints it (the details, then the fleet summary table): a table per host up to
eight hosts; past that, one line per host (failures first) with a character per check, the checks' legend and
every failure on a line of its own."""

from __future__ import annotations

from helpers.fleet_reports import CHECKS, H100, stopped_host, validate_host

from gpuprov.core.report import summary_table
from gpuprov.validation.host import RunOptions, ValidateJob

ECC = "GPU 3: 2 uncorrectable (volatile) ECC errors"


def printed(entries: list[dict], capsys) -> list[str]:
    job = ValidateJob(RunOptions())
    job.print_details(entries)
    summary_table(job.title(), job.rows(entries), list(job.columns))
    return capsys.readouterr().out.splitlines()


def fleet(count: int) -> list[dict]:
    """`count` hosts; every seventh fails host.ecc, the fifth warns on sizing, the last one's validation stopped."""
    entries = []
    for i in range(1, count):
        other = {"sizing": ("warn", "6 CPU cores per GPU")} if i == 5 else {}
        entries.append(validate_host(f"gpu{i:02d}", H100, fail={"host.ecc": ECC} if i % 7 == 0 else None,
                                     other=other))
    return [*entries, stopped_host(f"gpu{count:02d}", "cannot connect: connection refused")]


def test_up_to_eight_hosts_print_a_table_per_host(capsys):
    lines = printed(fleet(8), capsys)
    assert sum(1 for line in lines if line.startswith("gpu0") and "(H100-SXM, quick)" in line) == 7
    assert "gpu08: validation stopped cannot connect: connection refused" in lines


def test_past_eight_hosts_a_line_per_host_failures_first(capsys):
    lines = printed(fleet(32), capsys)
    assert not any("(H100-SXM, quick)" in line for line in lines)   # no table per host
    assert lines[0] == "validate: 32 hosts x 18 checks (F fail, w warn, - skip, . pass, blank: not run)"
    names = sorted([*CHECKS, "fleet.perf.matmul"])   # the checks each host ran, by name: a column each
    assert lines[1].split() == ["host", "status", "abcdefghijklmnopqr"]
    rows = lines[2:34]
    assert [row.split()[0] for row in rows[:5]] == ["gpu07", "gpu14", "gpu21", "gpu28", "gpu32"]
    assert [row.split()[0] for row in rows[5:]] == [f"gpu{i:02d}" for i in range(1, 32) if i % 7]
    ecc = names.index("host.ecc")
    assert rows[0].split() == ["gpu07", "fail", "." * ecc + "F" + "." * (len(names) - ecc - 1)]
    assert rows[4].split()[:2] == ["gpu32", "error"] and rows[4].endswith("validation stopped")
    gpu05 = next(row for row in rows if row.startswith("gpu05"))
    assert gpu05.split()[2][names.index("sizing")] == "w"
    legend = " ".join(lines[34:37])
    assert f"{'abcdefghijklmnopqr'[ecc]} host.ecc," in legend and "r train.transformer" in legend
    start = lines.index("failures: 5")
    assert lines[start + 1:start + 6] == [f"  gpu07 host.ecc: {ECC}", f"  gpu14 host.ecc: {ECC}",
                                          f"  gpu21 host.ecc: {ECC}", f"  gpu28 host.ecc: {ECC}",
                                          "  gpu32 validation: cannot connect: connection refused (step connect)"]
    assert lines[start + 6].startswith("validate: fleet summary")
    # 32 hosts: 1,093 lines with a table per host (the same entries before the change); now the matrix
    # (34 lines), the legend, the failures and the fleet summary table (32 rows)
    assert len(lines) <= 34 + 4 + 6 + 32 + 5


def test_names_and_reasons_print_as_text_in_the_matrix(capsys):
    entries = fleet(9)
    entries[0].update(host="[bold]gpu\n01", status="fail")
    entries[0]["results"][0] = {**entries[0]["results"][0], "status": "fail", "reason": "bad [/] \x1b[31mred"}
    out = "\n".join(printed(entries, capsys))
    assert "[bold]gpu\\n01  fail" in out and "[bold]gpu\\n01 host.clocks: bad [/] \\x1b[31mred" in out
    assert "\x1b" not in out
