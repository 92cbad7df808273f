"""Harden one host: facts, policy, plan, lockout refusals, then the guarded apply, its verification on the effective
configuration and the confirmation over a new connection; or, with --check, the audit alone. A run that would change
the host is refused while another run's guard is undecided there (named in the error).

`HardenJob` is the fleet runtime's job (gpuprov.core.runtime): its steps run in the runtime's order (facts, plan,
refusals, the dry run's end or the apply, the audit), and `HardenRecord` is what the report says of each host.
"""

from __future__ import annotations

import getpass
import secrets
import socket
import time
from dataclasses import dataclass, field

from gpuprov.core.errors import GpuprovError
from gpuprov.core.runtime import HostJob, HostRecord
from gpuprov.harden import firewall, lockout, nft, sshd, updates
from gpuprov.harden.audit import audit
from gpuprov.harden.confirm import BY_HOST, GuardOutcome, confirm, revert_now
from gpuprov.harden.guard import MARK, Guard, undecided_script
from gpuprov.harden.policy import HardenPolicy, build_policy
from gpuprov.harden.variables import VARIABLES

COMPONENTS = ("firewall", "ssh", "updates")
GUARDED = ("ssh", "firewall")      # applied in this order, behind the guard
MANAGED_FILES = (*nft.FILES, sshd.DROPIN, *updates.FILES)
# a harden run ends in one of these (and failed or skipped when it raised); the first three exit 1
NOT_WHERE_ASKED = ("refused", "rolled back", "unknown")


@dataclass(frozen=True)
class HardenOptions:
    """What the operator asked for."""

    check: bool = False
    dry_run: bool = False
    only: frozenset[str] = frozenset(COMPONENTS)
    confirm_timeout: int = 60
    console_access: bool = False


@dataclass
class HardenRecord(HostRecord):
    """One host's harden run: the controller's address as the host sees it, the lockout refusals (and those
    --i-have-console-access overrode), the guard's outcome and the controls audited. `plan` is the list of planned
    changes (change_dict); status: unchanged | planned | changed | checked | refused | rolled back | unknown |
    failed | skipped. The policy and ruleset the run works from stay out of the report."""

    plan: list[dict] = field(default_factory=list)
    controller: dict | None = None
    refusals: list[str] = field(default_factory=list)
    overridden: list[str] = field(default_factory=list)
    guard: GuardOutcome | None = None
    controls: list[dict] = field(default_factory=list)
    policy: HardenPolicy | None = field(default=None, repr=False)
    ruleset: str = field(default="", repr=False)

    def details(self) -> dict:
        return {"controller": self.controller, "refusals": self.refusals, "overridden": self.overridden,
                "guard": self.guard.to_dict() if self.guard else None, "controls": self.controls}

    @property
    def failed_controls(self) -> list[dict]:
        return failing_controls(self.controls)


def failing_controls(controls: list[dict]) -> list[dict]:
    """The controls (audit results as in the report) that fail."""
    return [c for c in controls if c["status"] == "fail"]


def plan_changes(policy: HardenPolicy, facts: dict, ruleset: str, only: frozenset[str]) -> list:
    """The changes the host needs, in the order they apply (updates, then the guarded ssh and firewall)."""
    planned = list(updates.changes(facts)) if "updates" in only else []
    if "ssh" in only:
        planned.append(sshd.change(policy, facts))
    if "firewall" in only:
        planned.append(nft.install(facts))
        rules = ", ".join(r.comment if r.port is None or r.comment.startswith("allow") else
                          f"{r.comment} {r.port}/{r.proto}" for r in policy.rules)
        planned.append(nft.change(facts, ruleset, f"load gpuprov's nftables table: inbound default drop, allow "
                                                  f"{rules}; published Docker ports filtered"))
    return [change for change in planned if change is not None]


def refusals(conn, policy: HardenPolicy, facts: dict, changes: list) -> list[str]:
    """Why applying `changes` would lock gpuprov out."""
    parts = {change.component for change in changes}
    found = []
    if "ssh" in parts:
        found += lockout.ssh_refusals(policy, facts, conn.host.user, conn.server_key_type())
    if "firewall" in parts:
        found += lockout.firewall_refusals(policy, facts)
    return found


class HardenJob(HostJob):
    """`invoke harden`: the firewall, sshd and unattended-upgrades policy on each host, never locking gpuprov out
    (lockouts refused unless --i-have-console-access, the ssh and firewall changes behind the host's own revert);
    `--check` audits alone (report harden-check)."""

    kind = "harden"
    columns = ("host", "status", "changes", "controller", "controls", "detail")
    variables = tuple(dict.fromkeys(spec.name.split(".")[0] for spec in VARIABLES))

    def __init__(self, options: HardenOptions):
        super().__init__(options.dry_run)
        self.options = options
        if options.check:
            self.kind = "harden-check"

    def new_record(self, host) -> HardenRecord:
        return HardenRecord(host.name)

    def managed_files(self, host) -> tuple[str, ...]:
        return MANAGED_FILES

    def gather(self, conn, record: HardenRecord) -> dict:
        """A run that may change the host is refused first while another run's guard is undecided there; then
        harden's own facts (with the controller's address as the host sees it)."""
        from gpuprov.harden.facts import gather

        if not (self.options.check or self.dry_run):
            _refuse_if_undecided(conn)
        facts = gather(conn, MANAGED_FILES)
        record.controller = facts.get("controller")
        return facts

    def plan(self, conn, record: HardenRecord) -> list:
        """The host's policy and ruleset, then the changes it needs (none with --check: the audit alone)."""
        from gpuprov.core.operations import change_dict

        record.policy = build_policy(conn.host.vars, record.facts_before)
        record.ruleset = firewall.render(list(record.policy.rules), record.policy.docker_bridges)
        if self.options.check:
            record.status = "checked"
            return []
        changes = plan_changes(record.policy, record.facts_before, record.ruleset, self.options.only)
        record.plan = [change_dict(c) for c in changes]
        return changes

    def refuse(self, conn, record: HardenRecord, changes: list) -> list:
        """Nothing runs when a change would lock gpuprov out, unless --i-have-console-access (then said)."""
        found = refusals(conn, record.policy, record.facts_before, changes)
        if found and not self.options.console_access:
            record.refusals, record.status = found, "refused"
            return []
        record.overridden = found
        return changes

    def planned(self, record: HardenRecord, changes: list) -> None:
        """A dry run (or --check --dry-run) ends here: planned or unchanged (checked and refused stay), audited on
        the facts before."""
        if record.status == "unchanged":
            record.status = "planned" if changes else "unchanged"
        self._audit(record)

    def apply(self, conn, record: HardenRecord, changes: list) -> None:
        _apply(conn, record, changes, self.options)

    def verify(self, conn, record: HardenRecord, say) -> None:
        """After the guarded apply (confirmed or reverted) or when nothing was to change: the audit."""
        self._audit(record)

    def _audit(self, record: HardenRecord) -> None:
        """The controls of the parts asked for, on the facts after the run (a refused run audits nothing)."""
        if record.status != "refused":
            record.controls = [r.to_dict() for r in audit(record.facts_after, record.policy, record.ruleset,
                                                           self.options.only)]

    def failing(self, entry: dict) -> bool:
        """A lockout refused, a guarded change rolled back or not known to have stayed, or a failing control
        (audited, or after the run; not the state before a dry run)."""
        return entry["status"] in NOT_WHERE_ASKED or bool(failing_controls(entry.get("controls") or [])
                                                          and not self.dry_run)

    def row(self, entry: dict) -> dict:
        from gpuprov.harden.output import summary_row

        return summary_row(entry)

    def print_details(self, entries: list[dict]) -> None:
        from gpuprov.harden.output import controls_table, print_hosts

        print_hosts(entries, self.dry_run, self.options.confirm_timeout)
        if self.options.check:
            controls_table(entries)

    def report_fields(self) -> dict:
        return {"check": self.options.check, "dry_run": self.dry_run, "only": sorted(self.options.only),
                "confirm_timeout": self.options.confirm_timeout}


def _refuse_if_undecided(conn) -> None:
    """Refuse to start while another harden run's guard is armed on the host, naming that run."""
    result = conn.run("sh -s", sudo=True, stdin=undecided_script())
    owners = [line[len(MARK) + len("busy "):] for line in result.stdout.splitlines() if line.startswith(MARK + "busy")]
    if owners:
        raise GpuprovError(f"another harden run's guard is still undecided on this host: {'; '.join(owners)}",
                           host=conn.host.name, step="guard",
                           hint="wait for that run: it confirms, or the host reverts it within its --confirm-timeout "
                                "(or at the host's next boot); then rerun harden")


def _apply(conn, record: HardenRecord, changes: list, options: HardenOptions) -> None:
    """Apply behind the guard, verify on the facts gathered with the batch, then confirm or revert. A failed batch
    raises with its steps (`exc.steps`, the runtime records them); so does an error while reverting it."""
    from gpuprov.core.apply import apply_changes
    from gpuprov.harden.facts import facts_command, parse_gathered

    guarded = sorted((c for c in changes if c.component in GUARDED), key=lambda c: GUARDED.index(c.component))
    plain = [c for c in changes if c.component not in GUARDED]
    guard = _guard(guarded, options.confirm_timeout, record.controller)
    batch = plain + ([guard.arm(), *(guard.guarded(c) for c in guarded)] if guard else [])
    armed_before = time.monotonic()
    try:
        steps, record.facts_after = apply_changes(conn, batch, task="harden",
                                                  facts=(facts_command(conn.host.user, MANAGED_FILES),
                                                         parse_gathered))
    except GpuprovError as exc:
        done = getattr(exc, "steps", [])
        if guard and any(step.component == "guard" and step.status == "done" for step in done):
            try:
                record.guard = revert_now(conn, guard, armed_before,
                                          f"a step failed: {exc.message.splitlines()[0]}")
            except GpuprovError as lost:
                lost.steps = done
                raise
            exc.hint = (exc.hint or "") + _after_revert(record.guard)
        raise
    record.steps, record.status = steps, "changed"
    areas = {c.component for c in guarded}
    results = audit(record.facts_after, record.policy, record.ruleset, areas)
    wrong = [r.control.id for r in results if r.status == "fail"]
    if guard and wrong:
        record.guard = revert_now(conn, guard, armed_before, "the effective configuration is not the policy: "
                                  + ", ".join(wrong) + _earlier_dropins(record.facts_after, wrong))
    elif guard:
        record.guard = confirm(conn, guard, armed_before)
    if record.guard and record.guard.rolled_back:
        record.status = "unknown" if record.guard.result == "unknown" else "rolled back"
        from gpuprov.harden.facts import gather

        fresh = conn.fresh()
        try:
            record.facts_after = gather(fresh.open(), MANAGED_FILES)
        finally:
            fresh.close()


def _earlier_dropins(facts: dict, wrong: list[str]) -> str:
    """Where an sshd setting that did not take effect may come from: drop-ins read before gpuprov's."""
    name = sshd.DROPIN.rsplit("/", 1)[1]
    earlier = [f for f in facts.get("sshd_dropins") or [] if f.endswith(".conf") and f < name]
    if not any(control.startswith("ssh-") for control in wrong):
        return ""
    return (f" (sshd keeps the first value it reads: {', '.join(earlier)} in {sshd.DROPIN_DIR} sort before "
            f"{name}; and /etc/ssh/sshd_config must Include {sshd.DROPIN_DIR}/*.conf before its own settings)"
            if earlier else f" (/etc/ssh/sshd_config must Include {sshd.DROPIN_DIR}/*.conf before its own settings)")


def _after_revert(outcome: GuardOutcome) -> str:
    """What the hint of a failed guarded batch adds: whether the previous configuration is back."""
    if outcome.result == "unknown":
        return f"; whether the previous firewall and sshd configuration are back is unknown: {outcome.hint}"
    slow = ("; the host reverted by itself before the batch ended (a --confirm-timeout shorter than the guarded steps "
            "take, or a reboot)" if outcome.result == BY_HOST else "")
    return "; the host's previous firewall and sshd configuration were put back" + slow


def _operator() -> str:
    """user@host of the controller, as far as it knows."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _guard(guarded: list, seconds: int, controller: dict | None = None) -> Guard | None:
    """The revert that protects the guarded changes (None when there are none)."""
    if not guarded:
        return None
    parts = {c.component for c in guarded}
    files = (nft.GUARDED_FILES if "firewall" in parts else ()) + ((sshd.DROPIN,) if "ssh" in parts else ())
    reload = (("systemctl daemon-reload >/dev/null 2>&1 || true",) if "firewall" in parts else ()) + (
        (sshd.RELOAD_SSHD,) if "ssh" in parts else ())
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(4)
    owner = f"run {run_id} from controller {(controller or {}).get('address') or 'unknown'} ({_operator()})"
    return Guard(run_id, seconds, files, "firewall" in parts, reload, owner=owner)
