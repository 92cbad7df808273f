"""`invoke reports.merge`: the validate reports of a run's shards (`--shard K/N`, gpuprov.core.shards) joined into one
fleet report, as the unsharded run would have written it.

Each host comes once (a host in two reports is refused unless both entries are the same); the fleet comparison
(gpuprov.validation.fleet) is made again over the hosts of every shard: each host's `fleet.*` results are dropped and
judged anew from its own results against all the shards' hosts and the recent reports in the reports folder, and its
status and counts follow. Reports of another kind, of an interrupted run, of a run without --shard, with a shard's
all-reduce (--multi-node spans one shard only) or asked with other options (level, strict, image, only) are refused,
naming the files; so are shards of different selections (the `shard` record each report has: N, the selection's
size and digest), a shard given twice with other contents (an identical copy counts once), a missing shard and
shards whose hosts are not their selection dealt as --shard deals it. Nothing is written when the merge is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuprov.core.errors import InputError, literal
from gpuprov.core.shards import MAX_SHARDS

OPTIONS = ("level", "strict", "image", "only")   # what a validate run was asked with: the shards must agree
STEP = "reports.merge"


def report_files(paths: list[str | Path]) -> list[Path]:
    """The files named, a folder standing for its validate-*.json reports (not validate-latest.json); each file
    once. InputError for a path that is missing or a folder without reports."""
    out: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(p for p in path.glob("validate-*.json") if p.name != "validate-latest.json")
            if not found:
                raise InputError(f"--report {literal(str(path))}: the folder has no validate-*.json report",
                                 step=STEP, hint="give the shards' report files, or the folder they were copied to")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(f"--report {literal(str(path))}: no such file or folder", step=STEP)
    unique = list(dict.fromkeys(p.resolve() for p in out))
    if len(unique) < 2:
        raise InputError(f"reports.merge needs the reports of at least two shards, not {len(unique)}", step=STEP,
                         hint="give each shard's report with --report, or one folder holding them")
    return unique


def read_report(path: Path) -> dict:
    """One report, checked to be a finished validate report (InputError naming the file otherwise)."""
    shown = literal(str(path))
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{shown}: not a readable JSON report ({literal(str(exc))})", step=STEP) from None
    hosts = report.get("hosts") if isinstance(report, dict) else None
    kind = path.name.split("-", 1)[0]
    if (not isinstance(hosts, list) or any(k not in report for k in ("level", "strict", "finished_epoch"))
            or not all(isinstance(h, dict) and isinstance(h.get("host"), str) and isinstance(h.get("results"), list)
                       for h in hosts)):
        raise InputError(f"{shown} is not a validate report (a {literal(kind)} report?): only validate reports are "
                         "merged", step=STEP, hint="give the validate-*.json reports of the shards")
    from gpuprov.inventory.levels import HOST_NAME

    for name in (h["host"] for h in hosts if not HOST_NAME.fullmatch(h["host"])):
        raise InputError(f"{shown}: {literal(repr(name))} is not a host name", step=STEP)
    if report.get("interrupted"):
        raise InputError(f"{shown} is the report of an interrupted run: its hosts have no fleet verdicts",
                         step=STEP, hint="run that shard again, then merge")
    if report.get("multi_node"):
        raise InputError(f"{shown} has an all-reduce (--multi-node): across one shard's hosts only, not the fleet's",
                         step=STEP, hint="run the shards without --multi-node, and the all-reduce as one run")
    return report


def check_together(reports: dict[Path, dict]) -> dict[Path, dict]:
    """The reports without a copy of another (the same shard's identical report, given twice), once checked to be
    the shards of one run: asked with the same options, each recording its shard (gpuprov.core.shards.shard_record)
    of one selection, each shard once, none missing. InputError naming the files otherwise."""
    asked: dict[tuple, list[Path]] = {}
    for path, report in reports.items():
        asked.setdefault(tuple(json.dumps(report.get(k), sort_keys=True) for k in OPTIONS), []).append(path)
    if len(asked) > 1:
        ways = "; ".join(", ".join(literal(p.name) for p in paths) + " with " + " ".join(
            f"{k}={v}" for k, v in zip(OPTIONS, key, strict=True)) for key, paths in asked.items())
        raise InputError(f"the reports were asked with other options: {ways}", step=STEP,
                         hint="merge the shards of one run (the same --level, --strict, --image and --only)")
    shards = {path: shard_of(path, report) for path, report in reports.items()}
    runs = {(s["count"], s["selected"], s["selection"]) for s in shards.values()}
    if len(runs) > 1:
        raise InputError("the reports are shards of different selections: " + "; ".join(
            f"{literal(p.name)} shard {s['index']}/{s['count']} of {s['selected']} hosts (selection "
            f"{literal(s['selection'])})" for p, s in shards.items()), step=STEP,
            hint="every shard selects the same hosts (the same inventory and --host/--group/--all) and the same N")
    kept: dict[int, Path] = {}
    for path, shard in shards.items():
        first = kept.get(shard["index"])
        if first is None:
            kept[shard["index"]] = path
        elif reports[first] != reports[path]:
            raise InputError(f"shard {shard['index']}/{shard['count']} comes twice: {literal(first.name)} and "
                             f"{literal(path.name)}, with other hosts or results", step=STEP,
                             hint="give one report per shard (a shard run again: its newest report)")
    count = next(iter(runs))[0]
    missing = [str(k) for k in range(1, count + 1) if k not in kept]
    if missing:
        raise InputError(f"shards {', '.join(missing)} of {count} are missing", step=STEP,
                         hint="give every shard's report (a shard whose hosts failed still writes one)")
    return {path: reports[path] for path in sorted(kept.values(), key=lambda p: shards[p]["index"])}


def shard_of(path: Path, report: dict) -> dict:
    """A report's `shard` record, checked; InputError naming the file when it has none (an unsharded run: it is a
    whole fleet report already) or a malformed one."""
    shard = report.get("shard")
    if shard is None:
        raise InputError(f"{literal(path.name)} is the report of a run without --shard: reports.merge joins the "
                         "shards of one run, each run with --shard K/N", step=STEP,
                         hint="run validate with --shard 1/N ... N/N over the same selection, then merge those")
    fields = ("index", "count", "selected")
    if (not isinstance(shard, dict) or not all(type(shard.get(k)) is int for k in fields)
            or not isinstance(shard.get("selection"), str)
            or not 1 <= shard["index"] <= shard["count"] <= min(shard["selected"], MAX_SHARDS)):
        raise InputError(f"{literal(path.name)}: its shard record {literal(json.dumps(shard))} is not one validate "
                         "writes", step=STEP, hint="merge reports as validate wrote them")
    return shard


def check_selection(reports: dict[Path, dict], entries: list[dict]) -> None:
    """InputError when the shards' hosts are not their selection, dealt as --shard deals it: a report edited, or
    shards run on inventories that differ (gpuprov.core.shards)."""
    from gpuprov.core.shards import Shard, selection_digest, shard_names

    names = [entry["host"] for entry in entries]
    first = next(iter(reports.values()))["shard"]
    if len(names) != first["selected"] or selection_digest(names) != first["selection"]:
        raise InputError(f"the shards hold {len(names)} hosts, not the {first['selected']} hosts their selection "
                         f"{literal(first['selection'])} had", step=STEP,
                         hint="merge the reports as validate wrote them, of shards run on the same inventory")
    for path, report in reports.items():
        shard = Shard(report["shard"]["index"], report["shard"]["count"])
        expected = sorted(shard_names(names, shard))
        if sorted(h["host"] for h in report["hosts"]) != expected:
            raise InputError(f"{literal(path.name)} does not hold shard {shard}'s hosts of the selection ("
                             f"{literal(', '.join(expected))})", step=STEP,
                             hint="merge the reports as validate wrote them")


def join_hosts(reports: dict[Path, dict]) -> list[dict]:
    """Every host once, by name: the same entry in two reports is kept once, different ones are refused."""
    hosts: dict[str, tuple[Path, dict]] = {}
    for path, report in reports.items():
        for entry in report["hosts"]:
            if entry["host"] in hosts:
                first, kept = hosts[entry["host"]]
                if kept != entry:
                    raise InputError(f"host {literal(entry['host'])} is in {literal(first.name)} and in "
                                     f"{literal(path.name)} with different results", step=STEP,
                                     hint="each host belongs to one shard: merge the reports of one run")
                continue
            hosts[entry["host"]] = (path, entry)
    return [hosts[name][1] for name in sorted(hosts)]


def refleet(entries: list[dict], history: Path, strict: bool, now: float | None = None) -> None:
    """The fleet comparison over all `entries` again, as ValidateJob.finish makes it (apply_fleet): each host's
    `fleet.*` results replaced, its status and counts judged again."""
    from gpuprov.validation.fleet import Sample, figures_of, outliers, recent_samples
    from gpuprov.validation.host import counts, host_status

    own = {e["host"]: [r for r in e["results"] if not str(r.get("check")).startswith("fleet.")] for e in entries}
    current, pct = [], {}
    for entry in entries:
        figures = figures_of(own[entry["host"]])
        if not own[entry["host"]] or entry.get("error") is not None or not figures:
            continue
        judged = [r for r in entry["results"] if str(r.get("check")).startswith("fleet.")]
        pcts = {(r.get("thresholds") or {}).get("max_below_fleet_median_pct") for r in judged}
        if len(pcts) != 1 or not isinstance(next(iter(pcts)), int | float):
            raise InputError(f"host {literal(entry['host'])} has figures but no fleet verdict to take its "
                             "validate.outlier_pct from", step=STEP, hint="merge reports as validate wrote them")
        pct[entry["host"]] = next(iter(pcts))
        current.append(Sample(entry["host"], (entry.get("fleet") or {}).get("group"), figures,
                              entry.get("started") or 0.0))
    found = outliers(current, recent_samples(history, now=now), pct, strict) if current else {}
    for entry in entries:
        entry["results"] = own[entry["host"]] + found.get(entry["host"], [])
        entry["counts"] = counts(entry["results"])
        entry["status"] = host_status(entry["results"], entry.get("error"))


def merge_reports(paths: list[Path], history: Path, now: float | None = None) -> dict:
    """The merged report's payload: the options, the hosts of every shard with the fleet comparison made again
    (against `history`, the reports folder, as of `now`), and which reports it was made from."""
    reports = check_together({path: read_report(path) for path in paths})
    first = next(iter(reports.values()))
    entries = join_hosts(reports)
    check_selection(reports, entries)
    refleet(entries, history, bool(first["strict"]), now)
    finished = max(r["finished_epoch"] for r in reports.values())
    return {**{k: first.get(k) for k in OPTIONS}, "started": min(r.get("started") or finished for r in
                                                                  reports.values()),
            "interrupted": False, "finished": finished, "finished_epoch": finished, "multi_node": None,
            "shard": None,
            "merged_from": [{"report": str(path), "shard": r.get("shard"), "hosts": [h["host"] for h in r["hosts"]],
                             **({"stopped": r["stopped"]} if r.get("stopped") else {})}
                            for path, r in reports.items()],
            "hosts": entries}


def write_merged(out: Path, payload: dict) -> dict[str, str]:
    """The merged report at `out`, its JUnit beside it (.xml) and each host's Prometheus textfile in
    <out's folder>/textfile/ (the report's `textfiles`); each replaced atomically, masked. Returns {name: path}."""
    from gpuprov.core.errors import mask_credentials
    from gpuprov.core.json_text import dump_json
    from gpuprov.core.report import replace_file
    from gpuprov.validation.report import junit_report, write_prometheus_textfile

    folder = out.parent / "textfile"
    payload["textfiles"] = {entry["host"]: str(write_prometheus_textfile(folder / f"{entry['host']}.prom", entry,
                                                                         payload["finished"]))
                            for entry in payload["hosts"]}
    junit = replace_file(out.with_name(out.name.removesuffix(".json") + ".xml"),
                         mask_credentials(junit_report(payload["hosts"])))
    report = replace_file(out, dump_json(payload, sort_keys=True))
    return {"report": str(report), "junit": str(junit)}


def sibling_paths(out: Path, hosts: list[str]) -> list[Path]:
    """Every file write_merged writes for `hosts`, to check before writing."""
    return [out, out.with_name(out.name.removesuffix(".json") + ".xml"),
            *(out.parent / "textfile" / f"{name}.prom" for name in hosts)]
