"""`invoke rollout`: move hosts to a new stack through the scheduler without killing a job."""

from __future__ import annotations

import re

from gpuprov.core.errors import literal
from gpuprov.tasks._common import finish, host_task, open_fleet

DRAINS = ("slurm", "hook", "none")
VALIDATIONS = ("quick", "burn-in", "none")
_DURATION = re.compile(r"([0-9]+)(s|m|min|h|d)?")
_UNITS = {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


@host_task(shards=False, help={
    "to_lock": "roll out to this lock file (PATH), or `previous`: the governing lock's last version (rollback)",
    "update_lock": "re-resolve the stack and move the lock to it (the old lock is kept in locks/history/)",
    "batch": "hosts upgraded at once after the canary: a count (2) or a share (25%); default 1",
    "max_unavailable": "hosts out of service at once, counting hosts drained by others or down: a count or a "
                       "share; default 25%",
    "canary": "hosts in the first batch, alone (0: none); default 1",
    "drain": "slurm | hook | none (default: the hosts' scheduler.kind, else none)",
    "wait_jobs": "how long a drained host may wait for its jobs (30s, 10m, 2h); past it the host is skipped, "
                 "never killed; default 1h",
    "validate": "quick | burn-in | none: the suite run on each upgraded host before it is resumed; default quick",
    "checks": "comma list of checks to run (validate --only)",
    "max_fail": "stop starting new hosts after this many failures (default 1: the first failure stops the rollout)",
    "dry_run": "show what would happen to each host (and the budget) and change nothing",
    "status": "print where each host of the rollout is and why it waits, from its journal; change nothing",
    "json": "print the run report as JSON on stdout",
    "shard": "refused: a rollout is not split into shards (its --max-unavailable, canary and batches are budgets "
             "over the whole selection); roll out from one controller",
})
def rollout(c, host=None, group=None, all=False, inventory=None, to_lock=None, update_lock=False, batch="1",
            max_unavailable="25%", canary="1", drain=None, wait_jobs="1h", validate="quick", checks=None,
            max_fail="1", dry_run=False, status=False, json_=False, trust_new_hosts=False, parallel=None,
            shard=None):
    """Drain, upgrade, reboot, validate and resume hosts in budgeted batches; rerun the same command to resume."""
    from gpuprov.core.batches import parse_size
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError

    if shard is not None:
        raise InputError(f"--shard {literal(str(shard))}: a rollout is not split into shards: --max-unavailable, "
                         "the canary and the batches are budgets over the whole selection, and shards running at "
                         "once would each spend all of it (N shards, up to N times the hosts out of service) and "
                         "drain hosts through the scheduler without seeing each other's batches", step="rollout",
                         hint="roll out from one controller (it works on --parallel hosts at once, within the "
                              "budget); --shard splits validate, provision and preflight runs")
    if status:
        finish(_status(c, host, group, all, inventory, to_lock, update_lock, drain))
        return
    if to_lock is not None and update_lock:
        raise InputError("--to-lock and --update-lock were both given", step="rollout",
                         hint="--update-lock moves the lock to a newly resolved stack; --to-lock takes a lock as it is")
    for flag, value, choices in (("--drain", drain, DRAINS), ("--validate", validate, VALIDATIONS)):
        if value is not None and value not in choices:
            raise InputError(f"{flag} must be one of {', '.join(choices)}, not {value!r}", step="rollout")
    batch_size = parse_size("--batch", str(batch))
    unavailable = parse_size("--max-unavailable", str(max_unavailable))
    canary_count = _count("--canary", canary)
    wait_s = parse_duration("--wait-jobs", wait_jobs)
    check_names = _checks(validate, checks)
    fleet = open_fleet(c, host, group, all, inventory, parallel=parallel, trust_new_hosts=trust_new_hosts,
                       max_fail=max_fail, json_=json_, kind="rollout")
    kind = drain or _drain_of(fleet.hosts)
    locks = path_setting(c, "locks")
    from gpuprov.rollout.plan import prepare

    prepared = prepare(fleet, kind=kind, locks=locks, to_lock=to_lock, update_lock=update_lock, batch=batch_size,
                       max_unavailable=unavailable, canary=canary_count, wait_jobs_s=wait_s, validate=validate,
                       checks=check_names, wheelhouse=path_setting(c, "wheelhouse"), dry_run=dry_run)
    finish(prepared.run())


def _status(c, host, group, all_, inventory, to_lock, update_lock, drain) -> int:
    """--status: the journal of these arguments (or the newest one when no host is selected)."""
    from gpuprov.core.config import path_setting
    from gpuprov.core.errors import InputError
    from gpuprov.rollout.journal import newest
    from gpuprov.rollout.plan import arguments
    from gpuprov.rollout.status import status_lines
    from gpuprov.tasks._common import select_hosts

    reports = path_setting(c, "reports")
    digest = None
    if host or group or all_:
        from gpuprov.rollout.journal import arguments_digest

        _inv, hosts = select_hosts(c, host, group, all_, inventory)
        digest = arguments_digest(arguments(hosts, to_lock, update_lock, drain or _drain_of(hosts)))
    journal = newest(reports, digest) if reports.is_dir() else None
    if journal is None:
        raise InputError(f"no rollout journal in {reports}" + (" for these arguments" if digest else ""),
                         step="rollout --status", hint="start one with invoke rollout --group NAME")
    print("\n".join(status_lines(journal)))
    return 0


def _drain_of(hosts: list) -> str:
    """The hosts' scheduler.kind (none where no host names one); InputError when they name different ones."""
    from gpuprov.core.errors import InputError

    kinds: dict[str, list[str]] = {}
    for host in hosts:
        kinds.setdefault((host.vars.get("scheduler") or {}).get("kind") or "none", []).append(host.name)
    if len(kinds) > 1:
        raise InputError("the selected hosts drain through different schedulers: " + "; ".join(
            f"{kind}: {', '.join(names)}" for kind, names in sorted(kinds.items())), step="rollout",
                         hint="roll out one scheduler's hosts at a time (--group), or say which with --drain")
    return next(iter(kinds), "none")


def _count(flag: str, value) -> int:
    from gpuprov.tasks._common import whole_number

    return whole_number(flag, value, 0, 10000)


def parse_duration(flag: str, value) -> float:
    """`30s`, `10m`, `2h`, `1d` or plain seconds; InputError naming the flag otherwise."""
    from gpuprov.core.errors import InputError

    match = _DURATION.fullmatch(str(value).strip())
    if match is None or int(match[1]) == 0:
        raise InputError(f"{flag} {value!r}: give a duration like 30s, 10m, 2h or 1d (at least 1 s)",
                         step="rollout")
    return float(int(match[1]) * _UNITS[match[2]])


def _checks(level: str, checks: str | None) -> tuple[str, ...] | None:
    """--checks, as validate --only takes it (checked here, before any host)."""
    if checks is None:
        return None
    from gpuprov.core.errors import InputError

    if level == "none":
        raise InputError("--checks with --validate none: nothing would run them", step="rollout")
    from gpuprov.tasks.validate import _checks as validate_checks

    return validate_checks(level, checks)
