"""`invoke reports.merge`: the validate reports of a run's shards (--shard K/N) joined into one fleet report."""

from __future__ import annotations

from gpuprov.tasks._common import check_output_files, exits_cleanly, split_names, task


@task(iterable=["report"], help={
    "out": "where to write the merged report (its JUnit .xml beside it, the textfiles in textfile/ there)",
    "report": "a shard's validate report, or a folder of them (its validate-*.json); repeat or give a comma list",
    "json": "print the file paths and the merged report as JSON on stdout",
})
@exits_cleanly
def merge(c, out=None, report=None, json_=False):
    """Join the validate reports of a run's shards into one fleet report, the fleet comparison over every shard.

    Each host once; refused: reports of another kind or run (options, selection), a missing shard, a host twice
    with different results. The recent reports in gpuprov.reports count for the comparison, as in a run."""
    from pathlib import Path

    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError, literal
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import summary_table
    from gpuprov.validation.host import RunOptions, ValidateJob
    from gpuprov.validation.merge import merge_reports, report_files, sibling_paths, write_merged

    if not out or not str(out).strip():
        raise InputError("--out needs the path of the merged report", step="reports.merge",
                         hint="invoke reports.merge --out merged.json --report shard1.json --report shard2.json")
    out = Path(out)
    paths = report_files(split_names(report, "--report"))
    if out.resolve() in paths:
        raise InputError(f"--out {literal(str(out))} is one of the reports to merge", step="reports.merge")
    payload = merge_reports(paths, path_setting(c, "reports"))
    check_output_files("--out", sibling_paths(out, [entry["host"] for entry in payload["hosts"]]))
    files = write_merged(out, payload)
    if json_:
        print(dump_json({**files, **payload}))
        return
    job = ValidateJob(RunOptions(level=payload["level"], strict=payload["strict"]))
    summary_table(job.title(), job.rows(payload["hosts"]), list(job.columns))
    print("\n".join(f"{name}: {literal(path)}" for name, path in files.items()))
