"""`invoke harden`: firewall, sshd and unattended-upgrades hardening that cannot lock the operator out; `--check`
audits without changing anything."""

from __future__ import annotations

from invoke.exceptions import Exit

from gpuprov.json_text import dump_json
from gpuprov.tasks._common import (
    failed_run,
    host_task,
    only_components,
    run_settings,
    select_hosts,
    whole_number,
)

# gpuprov.harden.run.COMPONENTS, written out so that `invoke --list` imports nothing of gpuprov.harden
HARDEN_PARTS = ("firewall", "ssh", "updates")


@host_task(auto_shortflags=False, help={
    "check": "audit only: every control of the profile as pass/fail/waived with the value observed (exit 1 on "
             "a failure); changes nothing",
    "dry_run": "show the plan (with diffs) and the lockout checks; change nothing",
    "confirm_timeout": "seconds after which the host reverts a firewall/sshd change that gpuprov has not confirmed "
                       "over a new SSH connection (default: gpuprov.confirm_timeout, 60)",
    "only": "comma list of parts: " + ",".join(HARDEN_PARTS),
    "i_have_console_access": "apply a policy that would lock gpuprov out (the host still reverts it when gpuprov "
                             "cannot connect again)",
    "max_fail": "stop starting new hosts after this many failures: a count (3) or a share (10%)",
    "json": "print the run report as JSON on stdout",
})
def harden(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False, check=False,
           dry_run=False, confirm_timeout=None, only=None, i_have_console_access=False, max_fail=None, json_=False):
    """Harden hosts: inbound firewall (Docker-aware), sshd, unattended security upgrades; --check audits."""
    import sys

    from gpuprov.config import MAX_CONFIRM_TIMEOUT, path_setting, settings
    from gpuprov.errors import literal
    from gpuprov.executor import RunInterrupted, run_on_hosts
    from gpuprov.harden.output import controls_table, print_hosts, summary_row
    from gpuprov.harden.run import HardenOptions, harden_host
    from gpuprov.report import check_folder, progress_printer, summary_table, write_json_report

    parts = only_components(only, HARDEN_PARTS) or frozenset(HARDEN_PARTS)
    timeout = settings(c).confirm_timeout if confirm_timeout is None else whole_number(
        "--confirm-timeout", confirm_timeout, 15, MAX_CONFIRM_TIMEOUT)
    inv, hosts = select_hosts(c, host, group, all, inventory)
    run = run_settings(c, inv, trust_new_hosts=trust_new_hosts, parallel=parallel, max_fail=max_fail)
    reports = path_setting(c, "reports")
    new_reports = check_folder("gpuprov.reports", reports, write=True)
    options = HardenOptions(check=check, dry_run=dry_run, only=parts, confirm_timeout=timeout,
                            console_access=i_have_console_access)
    printer = progress_printer(quiet=json_)
    interrupted = False
    try:
        outcomes = run_on_hosts(hosts, lambda conn: harden_host(conn, conn.host, options,
                                                                say=lambda _n, what: printer(conn.host, what)),
                                run, jump_of=inv.jump_host, on_event=printer)
    except RunInterrupted as stop:
        outcomes, interrupted = stop.outcomes, True
    runs = [o.value.to_dict() if o.ok else failed_run(o) for o in outcomes]
    kind = "harden-check" if check else "harden"
    report = write_json_report(reports, kind, {"check": check, "dry_run": dry_run, "only": sorted(parts),
                                               "confirm_timeout": timeout, "interrupted": interrupted, "hosts": runs})
    if new_reports:
        print(f"created the folder {literal(str(reports))} (gpuprov.reports)", file=sys.stderr)
    if json_:
        print(dump_json({"report": str(report), "hosts": runs}))
    else:
        print_hosts(runs, dry_run, timeout)
        if check:
            controls_table(runs)
        summary_table(kind + (" (dry run)" if dry_run else ""), [summary_row(r) for r in runs],
                      ["host", "status", "changes", "controller", "controls", "detail"])
        print(f"report: {literal(str(report))}")
    if interrupted:
        raise Exit(code=130)
    code = _exit_code(outcomes, dry_run)
    if code:
        raise Exit(code=code)


def _exit_code(outcomes, dry_run: bool) -> int:
    """0 all good; 2 every failure was bad input; 1 a host failed, refused a lockout, was rolled back, does not say
    whether its guarded change stayed (unknown), or has a failing control (audited or after the run; not the state
    before a dry run)."""
    from gpuprov.errors import InputError

    failed = [o for o in outcomes if not o.ok]
    if failed:
        return 2 if all(isinstance(o.error, InputError) for o in failed) else 1
    for outcome in outcomes:
        run = outcome.value
        if run.status in ("refused", "rolled back", "unknown") or (run.failed_controls and not dry_run):
            return 1
    return 0
