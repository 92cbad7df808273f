"""`invoke report`: the fleet report, one self-contained HTML file from the reports folder."""

from __future__ import annotations

from gpuprov.tasks._common import check_output_files, exits_cleanly, task


@task(help={
    "reports": "the reports folder to read (default: gpuprov.reports in invoke.yaml)",
    "out": "the HTML file to write (one file: inline styles and SVG, nothing fetched when opened)",
})
@exits_cleanly
def report(c, reports=None, out=None):
    """Write the fleet report: one HTML file to open anywhere, nothing fetched from the network.

    From the reports folder: the host x check matrix (failures first) and every failure, each GPU model's perf
    figures against the expected figure and the fleet median band, each host's trend over the reports kept, and
    its last provision, harden and rollout state. A file that is not a report is skipped with a warning."""
    import sys
    from pathlib import Path

    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError, literal
    from gpuprov.core.report import check_folder
    from gpuprov.validation.html_report import write_report

    if not out or not str(out).strip():
        raise InputError("--out needs the path of the HTML file to write", step="report",
                         hint="invoke report --out fleet.html")
    folder = Path(reports) if reports else path_setting(c, "reports")
    setting = "--reports" if reports else "gpuprov.reports"
    if check_folder(setting, folder, write=False):   # missing (unreadable or a file: InputError there)
        raise InputError(f"{setting}: no such folder {literal(str(folder))}", step="report",
                         hint="give the folder that holds the JSON reports with --reports DIR")
    check_output_files("--out", [Path(out)])
    path, loaded = write_report(folder, out)
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    hosts = len({entry["host"] for r in loaded.of("validate") for entry in r.hosts})
    print(f"report: {literal(str(path))} ({hosts} hosts validated, {len(loaded.reports)} reports read, "
          f"{len(loaded.warnings)} files skipped)")
