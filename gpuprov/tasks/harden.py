"""`invoke harden`: firewall, sshd and unattended-upgrades hardening that cannot lock the operator out; `--check`
audits without changing anything."""

from __future__ import annotations

from gpuprov.tasks._common import BATCH_HELP, finish, host_task, only_components, open_fleet, whole_number

# gpuprov.harden.run.COMPONENTS, written out so that `invoke --list` imports nothing of gpuprov.harden
HARDEN_PARTS = ("firewall", "ssh", "updates")


@host_task(help={
    "check": "audit only: every control of the profile as pass/fail/waived with the value observed (exit 1 on "
             "a failure); changes nothing",
    "dry_run": "show the plan (with diffs) and the lockout checks; change nothing",
    "confirm_timeout": "seconds after which the host reverts a firewall/sshd change that gpuprov has not confirmed "
                       "over a new SSH connection (default: gpuprov.confirm_timeout, 60)",
    "only": "comma list of parts: " + ", ".join(HARDEN_PARTS),
    "i_have_console_access": "apply a policy that would lock gpuprov out (the host still reverts it when gpuprov "
                             "cannot connect again)",
    "max_fail": "stop starting new hosts after this many failures: a count (3) or a share (10%)",
    **BATCH_HELP,
    "json": "print the run report as JSON on stdout",
})
def harden(c, host=None, group=None, all=False, inventory=None, parallel=None, trust_new_hosts=False, check=False,
           dry_run=False, confirm_timeout=None, only=None, i_have_console_access=False, max_fail=None, json_=False,
           serial=None, batch_window=None, max_fail_percentage=None):
    """Harden hosts: inbound firewall (Docker-aware), sshd, unattended security upgrades; --check audits."""
    from gpuprov.core.config import MAX_CONFIRM_TIMEOUT, settings
    from gpuprov.core.runtime import run_fleet
    from gpuprov.harden.run import HardenJob, HardenOptions

    parts = only_components(only, HARDEN_PARTS) or frozenset(HARDEN_PARTS)
    timeout = settings(c).confirm_timeout if confirm_timeout is None else whole_number(
        "--confirm-timeout", confirm_timeout, 15, MAX_CONFIRM_TIMEOUT)
    job = HardenJob(HardenOptions(check=check, dry_run=dry_run, only=parts, confirm_timeout=timeout,
                                  console_access=i_have_console_access))
    fleet = open_fleet(c, host, group, all, inventory, parallel=parallel, trust_new_hosts=trust_new_hosts,
                       max_fail=max_fail, serial=serial, batch_window=batch_window,
                       max_fail_percentage=max_fail_percentage, json_=json_, kind=job.kind)
    finish(run_fleet(fleet, job))
