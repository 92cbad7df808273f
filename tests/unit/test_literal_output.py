"""Messages are printed literally: user data is never rich markup (`[gpu01]`, `[host]:2222`, a folder named `[prod]`
stay as written, and `[/]` does not crash), and control characters in names are escaped, so that no input can
forge an extra `FILE:LINE:COL` line or recolour the terminal."""

from __future__ import annotations

import string

from helpers.tasks import config, host_runs
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.core.errors import GpuprovError, InputError, literal
from gpuprov.core.executor import Outcome
from gpuprov.core.report import facts_table, print_host, progress_printer, summary_table
from gpuprov.inventory import Host
from gpuprov.provision.run import ProvisionRecord
from gpuprov.tasks import provision as provision_tasks

MARKUP = ["[gpu01]", "[10.0.0.5]:2222", "[prod]", "[/]", "[bold red]x[/bold red]", "[link=http://x]y[/link]"]


def test_errors_escape_control_characters_in_host_step_and_message():
    error = GpuprovError("bad value\x1b[31m\n  second line", host="gpu\n01", step="apply\r",
                         hint="look at\x07 it")
    assert str(error) == "[gpu\\n01] apply\\r: bad value\\x1b[31m\n  second line\n  next: look at\\x07 it"


def test_a_line_break_in_a_name_cannot_forge_a_located_error():
    forged = "gpu01\n/etc/inventory.yaml:1:1: hosts: forged"
    text = str(InputError("no facts", host=forged, step=forged))
    assert text.splitlines() == ["[gpu01\\n/etc/inventory.yaml:1:1: hosts: forged] "
                                 "gpu01\\n/etc/inventory.yaml:1:1: hosts: forged: no facts"]


def test_literal_escapes_every_line_breaking_character():
    assert literal("a\nb\rc\x0bd\x0ce\x1cf\x85g\u2028h\u2029i\tj") == (
        "a\\nb\\rc\\x0bd\\x0ce\\x1cf\\x85g\\u2028h\\u2029i\\tj")


def test_tables_print_markup_as_text(capsys):
    rows = [{"host": name, "status": "failed", "detail": f"{name} at /srv/[prod]/locks"} for name in MARKUP]
    summary_table("provision [prod]", rows, ["host", "status", "detail"])
    out = capsys.readouterr().out
    assert "provision [prod]" in out
    for name in MARKUP:
        assert f"{name} at /srv/[prod]/locks" in out


def test_a_control_character_in_a_table_cell_is_escaped(capsys):
    summary_table("t", [{"host": "gpu01\x1b[2J", "detail": "one\ntwo"}], ["host", "detail"])
    out = capsys.readouterr().out
    assert "gpu01\\x1b[2J" in out and "one\\ntwo" in out and "\x1b" not in out


def test_progress_lines_print_host_names_as_written(capsys):
    printer = progress_printer()
    for name in MARKUP:
        host = Host(name=name, address="192.0.2.1")
        printer(host, "start")
        printer(host, "apply 3 changes [/]")
        printer(host, "failed")
    err = capsys.readouterr().err
    for name in MARKUP:
        assert f"{name}: apply 3 changes [/]" in err
        assert f" failed {name} (" in err


def test_the_facts_table_prints_names_addresses_and_errors_as_written(capsys):
    failed = Outcome(Host(name="[gpu02]", address="192.0.2.2"), error=GpuprovError("cannot read [/]", host="[gpu02]"))
    answered = Outcome(Host(name="[gpu01]", address="fe80::1", port=2222),
                       value={"os": {"pretty_name": "[bold]Debian[/bold]", "key": "debian-12"}, "kernel": "[/]"})
    facts_table([failed, answered])
    out = capsys.readouterr().out
    assert "[gpu02]: FAILED" in out and "[[gpu02]] cannot read [/]" in out
    assert "[gpu01] (fe80::1:2222)" in out and "[bold]Debian[/bold] (debian-12)" in out and "[/] / -" in out


def test_plans_notices_and_errors_print_as_written(capsys):
    runs = [{"host": "[gpu01]", "notices": ["installing the lock /srv/[prod]/locks/[hgx].lock.yaml\n"
                                            "/srv/x.yaml:1:1: forged"],
             "busy": ["GPU process 4242 [python]\x1b[2J"],
             "plan": {"changes": [{"component": "driver", "summary": "install [bold]nvidia[/]", "reboot": True,
                                   "disruptive": "driver [change]", "refused": True,
                                   "diff": '+  "path": "[/]"\n-  old'}]},
             "error": {"error": "apt-get failed at [/]", "step": "apply", "command": "apt-get install [x]",
                       "hint": "look at [/var/log]"}}]
    for run in runs:
        print_host(run, dry_run=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[gpu01]: installing the lock /srv/[prod]/locks/[hgx].lock.yaml\\n/srv/x.yaml:1:1: forged",
        "[gpu01]: work runs here, disruptive steps refused (--disrupt overrides):",
        "    GPU process 4242 [python]\\x1b[2J",
        "[gpu01]: FAILED apt-get failed at [/]",
        "  step: apply",
        "  command: apt-get install [x]",
        "  hint: look at [/var/log]",
        "[gpu01]: 1 changes",
        "             driver install [bold]nvidia[/] (reboot) (disruptive: driver [change]) (refused: work runs "
        "here)",
        '    +  "path": "[/]"',
        "    -  old",
    ]


def test_a_reports_folder_named_with_brackets_is_printed_as_it_is(tmp_path, capsys, contacted, monkeypatch):  # noqa: F811
    host_runs(monkeypatch, lambda host: ProvisionRecord(host.name))
    reports = tmp_path / "[prod]" / "[/]reports"
    provision_tasks.provision(config(tmp_path, reports=reports), host=["gpu01"])
    captured = capsys.readouterr()
    assert f"report: {reports}/provision-" in captured.out
    assert f"created the folder {reports} (gpuprov.reports)" in captured.err


NAMES = st.text(alphabet=string.ascii_letters + string.digits + string.punctuation + "\n\r\x1b\x07\u2028é漢",
                min_size=1, max_size=12)  # short enough that no cell wraps at 160 columns


@settings(deadline=None)
@given(NAMES, NAMES)
def test_any_name_prints_literally(name, detail):
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        summary_table("t", [{"host": name, "detail": detail}], ["host", "detail"])
    out = buffer.getvalue()
    assert literal(name) in out and literal(detail) in out
    assert not any(c in out for c in "\r\x1b\x07\u2028")
