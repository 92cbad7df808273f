"""What `invoke harden` prints: each host's plan, refusals and rollback, the controls table and the summary. Every
value is printed literally (gpuprov.core.report.console / styled)."""

from __future__ import annotations

import json

from gpuprov.core.errors import literal, literal_lines

STATUS_STYLE = {"pass": "green", "fail": "bold red", "waived": "yellow", "skip": "dim"}


def shown(value) -> str:
    """A control's value in a table cell."""
    if value is None:
        return "unknown"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "(none)"
    return str(value) if not isinstance(value, dict) else json.dumps(value)


def print_hosts(runs: list[dict], dry_run: bool, confirm_timeout: int) -> None:
    """Per host: refusals, what --i-have-console-access let through, the plan (dry run), the guard's outcome."""
    from gpuprov.core.report import console, print_plan, styled

    out = console()
    for run in runs:
        host = literal(run["host"])
        if run.get("error"):
            out.print(styled(f"{host}: FAILED", "bold red"), literal_lines(run["error"]["error"]))
            for key in ("step", "hint"):
                if run["error"].get(key):
                    out.print(f"  {key}: " + literal_lines(run["error"][key]).replace("\n", "\n    "))
        for reason in run.get("refusals") or []:
            out.print(styled(f"{host}: refused:", "bold red"), styled(reason))
        if run.get("refusals"):
            out.print(f"{host}: nothing was changed; --i-have-console-access applies it anyway (the host still "
                      "reverts it when gpuprov cannot connect again)")
        for reason in run.get("overridden") or []:
            out.print(styled(f"{host}: would lock gpuprov out (--i-have-console-access):", "yellow"), styled(reason))
        guard = run.get("guard")
        if guard:
            style = "green" if guard["result"] == "confirmed" else "bold red"
            out.print(styled(f"{host}: {guard['result']}:", style), styled(guard["detail"]))
            for line in (guard.get("log") or "").splitlines():
                out.print(f"    {literal(line)}")
            if guard.get("hint"):
                out.print(f"  hint: {literal(guard['hint'])}")
        if not dry_run or not run.get("plan"):
            continue
        print_plan(run["host"], run["plan"])
        if any(change["component"] in ("ssh", "firewall") for change in run["plan"]):
            out.print(f"  the ssh and firewall changes run behind the host's own revert: undone after "
                      f"{confirm_timeout}s unless a new SSH connection from gpuprov confirms them")


def controls_table(runs: list[dict]) -> None:
    """One row per host and control: status, observed and expected value (a waiver's reason in the detail)."""
    from rich.table import Table

    from gpuprov.core.report import console, styled

    table = Table(title=styled("harden --check"), title_justify="left")
    for column in ("host", "control", "status", "observed", "expected"):
        table.add_column(column, overflow="fold")
    for run in runs:
        for control in run.get("controls") or []:
            table.add_row(styled(run["host"]), styled(control["id"]),
                          styled(control["status"], STATUS_STYLE.get(control["status"])),
                          styled(shown(control["observed"])[:400]), styled(shown(control["expected"])[:400]))
    console().print(table)


def summary_row(run: dict) -> dict:
    """The summary table's row of one host."""
    controls = run.get("controls") or []
    counts = {status: sum(1 for c in controls if c["status"] == status) for status in STATUS_STYLE}
    details = []
    if run.get("error"):
        details.append(run["error"]["error"].splitlines()[0])
    if run.get("refusals"):
        details.append(f"{len(run['refusals'])} lockout refusals")
    if run.get("guard"):
        details.append(run["guard"]["result"])
    failed = [c["id"] for c in controls if c["status"] == "fail"]
    if failed:
        details.append("failing: " + ", ".join(failed))
    return {"host": run["host"], "status": run["status"], "changes": len(run.get("plan") or []),
            "controller": (run.get("controller") or {}).get("address", ""),
            "controls": f"{counts['pass']} pass, {counts['fail']} fail, {counts['waived']} waived",
            "detail": "; ".join(details)[:160]}
