"""Harden one host: facts, policy, plan, lockout refusals, then the guarded apply, its verification on the effective
configuration and the confirmation over a new connection; or, with --check, the audit alone. A run that would change
the host is refused while another run's guard is undecided there (named in the error)."""

from __future__ import annotations

import getpass
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuprov.errors import GpuprovError
from gpuprov.harden import firewall, lockout, nft, sshd, updates
from gpuprov.harden.audit import audit
from gpuprov.harden.confirm import BY_HOST, GuardOutcome, confirm, revert_now
from gpuprov.harden.guard import MARK, Guard, undecided_script
from gpuprov.harden.policy import HardenPolicy, build_policy

COMPONENTS = ("firewall", "ssh", "updates")
GUARDED = ("ssh", "firewall")      # applied in this order, behind the guard
MANAGED_FILES = (*nft.FILES, sshd.DROPIN, *updates.FILES)


@dataclass(frozen=True)
class HardenOptions:
    """What the operator asked for."""

    check: bool = False
    dry_run: bool = False
    only: frozenset[str] = frozenset(COMPONENTS)
    confirm_timeout: int = 60
    console_access: bool = False


@dataclass
class HardenRun:
    """Everything that happened on one host, for the table and the JSON report."""

    host: str
    status: str = "unchanged"   # unchanged | planned | changed | checked | refused | rolled back | unknown | failed
    controller: dict | None = None
    refusals: list[str] = field(default_factory=list)
    overridden: list[str] = field(default_factory=list)
    plan: list[dict] = field(default_factory=list)
    steps: list = field(default_factory=list)
    guard: GuardOutcome | None = None
    controls: list[dict] = field(default_factory=list)
    facts_before: dict | None = None
    facts_after: dict | None = None

    def to_dict(self) -> dict:
        return {"host": self.host, "status": self.status, "controller": self.controller, "refusals": self.refusals,
                "overridden": self.overridden, "plan": self.plan, "steps": [s.to_dict() for s in self.steps],
                "guard": self.guard.to_dict() if self.guard else None, "controls": self.controls,
                "facts_before": self.facts_before, "facts_after": self.facts_after}

    @property
    def failed_controls(self) -> list[dict]:
        return [c for c in self.controls if c["status"] == "fail"]


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


def harden_host(conn, host, options: HardenOptions, say: Callable[[str, str], None] = lambda h, w: None) -> HardenRun:
    """The whole job on one connected host. Raises GpuprovError with the run so far attached."""
    from gpuprov.harden.facts import gather
    from gpuprov.plan import change_dict

    run = HardenRun(host.name)
    try:
        if not (options.check or options.dry_run):
            _refuse_if_undecided(conn)
        say(host.name, "facts")
        facts = run.facts_before = run.facts_after = gather(conn, MANAGED_FILES)
        run.controller = facts.get("controller")
        policy = build_policy(host.vars, facts)
        ruleset = firewall.render(list(policy.rules), policy.docker_bridges)
        if options.check:
            run.controls = [r.to_dict() for r in audit(facts, policy, ruleset, options.only)]
            run.status = "checked"
            return run
        changes = plan_changes(policy, facts, ruleset, options.only)
        run.plan = [change_dict(c) for c in changes]
        found = refusals(conn, policy, facts, changes)
        if found and not options.console_access:
            run.refusals, run.status = found, "refused"
            return run
        run.overridden = found
        if options.dry_run or not changes:
            run.status = "planned" if changes else "unchanged"
            run.controls = [r.to_dict() for r in audit(facts, policy, ruleset, options.only)]
            return run
        say(host.name, f"apply {len(changes)} changes")
        _apply(conn, run, changes, policy, ruleset, options)
        return run
    except GpuprovError as exc:
        run.status = "failed"
        exc.run = run
        raise


def _refuse_if_undecided(conn) -> None:
    """Refuse to start while another harden run's guard is armed on the host, naming that run."""
    result = conn.run("sh -s", sudo=True, stdin=undecided_script())
    owners = [line[len(MARK) + len("busy "):] for line in result.stdout.splitlines() if line.startswith(MARK + "busy")]
    if owners:
        raise GpuprovError(f"another harden run's guard is still undecided on this host: {'; '.join(owners)}",
                           host=conn.host.name, step="guard",
                           hint="wait for that run: it confirms, or the host reverts it within its --confirm-timeout "
                                "(or at the host's next boot); then rerun harden")


def _apply(conn, run: HardenRun, changes: list, policy: HardenPolicy, ruleset: str, options: HardenOptions) -> None:
    """Apply behind the guard, verify on the facts gathered with the batch, then confirm or revert."""
    from gpuprov.apply import apply_changes
    from gpuprov.harden.facts import facts_command, parse_gathered

    guarded = sorted((c for c in changes if c.component in GUARDED), key=lambda c: GUARDED.index(c.component))
    plain = [c for c in changes if c.component not in GUARDED]
    guard = _guard(guarded, options.confirm_timeout, run.controller)
    batch = plain + ([guard.arm(), *(guard.guarded(c) for c in guarded)] if guard else [])
    armed_before = time.monotonic()
    try:
        steps, run.facts_after = apply_changes(conn, batch, task="harden",
                                               facts=(facts_command(conn.host.user, MANAGED_FILES), parse_gathered))
    except GpuprovError as exc:
        run.steps = getattr(exc, "steps", [])
        if guard and any(step.component == "guard" and step.status == "done" for step in run.steps):
            run.guard = revert_now(conn, guard, armed_before, f"a step failed: {exc.message.splitlines()[0]}")
            exc.hint = (exc.hint or "") + _after_revert(run.guard)
        raise
    run.steps, run.status = steps, "changed"
    areas = {c.component for c in guarded}
    results = audit(run.facts_after, policy, ruleset, areas)
    wrong = [r.control.id for r in results if r.status == "fail"]
    if guard and wrong:
        run.guard = revert_now(conn, guard, armed_before, "the effective configuration is not the policy: "
                               + ", ".join(wrong) + _earlier_dropins(run.facts_after, wrong))
    elif guard:
        run.guard = confirm(conn, guard, armed_before)
    if run.guard and run.guard.rolled_back:
        run.status = "unknown" if run.guard.result == "unknown" else "rolled back"
        from gpuprov.harden.facts import gather

        fresh = conn.fresh()
        try:
            run.facts_after = gather(fresh.open(), MANAGED_FILES)
        finally:
            fresh.close()
    run.controls = [r.to_dict() for r in audit(run.facts_after, policy, ruleset, options.only)]


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
