"""One harden run's decisions, the host played by facts that real tools produced (sshd -T of the rendered drop-in,
nft's listing of the rendered ruleset): refuse a lockout before anything is sent, apply behind the guard in order,
revert when the result is not the policy, confirm otherwise; a second run changes nothing."""

from __future__ import annotations

import re
import subprocess

import pytest
from helpers.local_host import LocalConn
from judges import needs_nft, needs_sshd, sshd, sshd_config

import gpuprov.core.apply
import gpuprov.harden.facts
import gpuprov.harden.run
from gpuprov.core.apply import StepResult
from gpuprov.core.errors import GpuprovError
from gpuprov.core.operations import Change
from gpuprov.harden import firewall, nft, updates
from gpuprov.harden import sshd as harden_sshd
from gpuprov.harden.confirm import GuardOutcome, console_hint
from gpuprov.harden.facts import parse_sshd
from gpuprov.harden.guard import MARK, undecided_script
from gpuprov.harden.policy import build_policy
from gpuprov.harden.run import HardenJob, HardenOptions
from gpuprov.inventory import Host
from gpuprov.stack import families

pytestmark = [pytest.mark.root, pytest.mark.tool, needs_sshd, needs_nft]
VARIABLES = {"firewall": {"allow": [{"port": 22, "proto": "tcp", "sources": ["10.0.0.0/8"]}]}}
SUPPORTS = {"kex_algorithms": ["curve25519-sha256", "curve25519-sha256@libssh.org", "diffie-hellman-group16-sha512"],
            "ciphers": ["aes256-gcm@openssh.com", "aes128-ctr"], "macs": ["hmac-sha2-256-etm@openssh.com"],
            "host_key_algorithms": ["ssh-ed25519", "rsa-sha2-512"]}


def host_conn(undecided: str = "") -> LocalConn:
    """What a harden run asks of a connection (the commands themselves go through the patched apply): only the
    check for another run's undecided guard reaches it, and the host answers `undecided`."""
    return LocalConn(HOST, answer=lambda command, stdin: undecided)


def bare_facts(tmp_path, controller: str) -> dict:
    result = sshd("-T", "-f", str(sshd_config(tmp_path, "", "bare_config")))
    return {"os": {"id": "debian", "family": "debian"}, "systemd": True, "nft": True, "nft_table": None,
            "controller": {"address": controller, "port": 22}, "user_groups": ["root"],
            "sshd": parse_sshd(result.stdout + "\n@@rc=0")[0], "ssh_supports": SUPPORTS,
            "packages": {"unattended-upgrades": "2.9.1"}, "units": {t: "enabled" for t in updates.TIMERS},
            "apt_config": {}, "files": {}, "complete": True}


def hardened_facts(tmp_path, facts: dict) -> dict:
    """The same host as the real tools show it once the rendered files are in place."""
    policy = build_policy(VARIABLES, facts)
    dropin, ruleset = harden_sshd.render(policy), firewall.render(list(policy.rules))
    effective = sshd("-T", "-f", str(sshd_config(tmp_path, dropin, "hardened_config")))
    path = tmp_path / "ruleset.nft"
    path.write_text(ruleset)
    listing = subprocess.run(["unshare", "-n", "sh", "-c", f"nft -f {path} && nft list table inet gpuprov"],
                             capture_output=True, text=True, check=True).stdout
    return {**facts, "sshd": parse_sshd(effective.stdout + "\n@@rc=0")[0], "nft_table": listing.strip("\n"),
            "units": {**facts["units"], firewall.UNIT: "enabled"},
            "apt_config": {"APT::Periodic::Unattended-Upgrade": ["1"], "APT::Periodic::Update-Package-Lists": ["1"],
                           "Unattended-Upgrade::Origins-Pattern": ["origin=Debian,label=Debian-Security"],
                           "Unattended-Upgrade::Package-Blacklist": list(families.BLACKLIST)},
            "files": {harden_sshd.DROPIN: dropin, firewall.RULESET: ruleset, firewall.LISTING: listing,
                      firewall.UNIT_FILE: firewall.unit_file(), updates.AUTO_UPGRADES: updates.auto_upgrades("debian"),
                      families.UNATTENDED: families.unattended()}}


class FakeHost:
    """The host as one run sees it: its facts before and after the batch; records batches, confirmations, reverts."""

    def __init__(self, monkeypatch, before: dict, after: dict, confirmed: bool = True):
        self.batches, self.reverts, self.confirms = [], [], 0
        self.facts = before

        def gather(conn, files):
            return self.facts

        def apply_changes(conn, changes, **kwargs):
            self.changes = changes
            self.batches.append([c.component for c in changes])
            self.facts = after
            return [StepResult(c.component, c.summary, list(c.commands), 0, 0.1, "") for c in changes], after

        def confirm(conn, guard, armed_before):
            self.confirms += 1
            if not confirmed:
                self.facts = before
            return GuardOutcome(guard, "confirmed" if confirmed else "rolled back by the host")

        def revert_now(conn, guard, armed_before, why):
            self.reverts.append(why)
            self.facts = before
            return GuardOutcome(guard, "reverted by gpuprov", why)

        monkeypatch.setattr(gpuprov.harden.facts, "gather", gather)
        monkeypatch.setattr(gpuprov.core.apply, "apply_changes", apply_changes)
        monkeypatch.setattr(gpuprov.harden.run, "confirm", confirm)
        monkeypatch.setattr(gpuprov.harden.run, "revert_now", revert_now)


HOST = Host(name="gpu01", address="10.0.0.1", vars=VARIABLES)


def harden(options: HardenOptions | None = None, conn: LocalConn | None = None):
    return HardenJob(options or HardenOptions()).run_host(conn or host_conn(), lambda what: None)


def test_lockout_is_refused_before_anything_is_sent(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="172.17.0.1")
    host = FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    run = harden()
    assert run.status == "refused" and host.batches == [] and "172.17.0.1" in run.refusals[0]
    assert {c["component"] for c in run.plan} == {"ssh", "firewall", "updates"}


def test_forced_lockout_is_applied_behind_the_guard_and_rolled_back(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="172.17.0.1")
    host = FakeHost(monkeypatch, before, hardened_facts(tmp_path, before), confirmed=False)
    run = harden(HardenOptions(console_access=True))
    assert host.batches == [["updates", "updates", "guard", "ssh", "firewall"]]
    assert run.status == "rolled back" and run.overridden and run.guard.result == "rolled back by the host"


def test_applied_confirmed_then_a_second_run_changes_nothing(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    host = FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    run = harden()
    assert run.status == "changed" and host.confirms == 1 and host.reverts == []
    assert run.failed_controls == []
    again = harden()
    assert again.status == "unchanged" and again.plan == [] and len(host.batches) == 1


def test_a_result_that_is_not_the_policy_is_reverted_at_once(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    after = hardened_facts(tmp_path, before)
    after["sshd"] = {**after["sshd"], "passwordauthentication": ["yes"]}   # an earlier drop-in won
    host = FakeHost(monkeypatch, before, after)
    run = harden()
    assert run.status == "rolled back" and host.confirms == 0
    assert host.reverts == ["the effective configuration is not the policy: ssh-password-authentication "
                            "(/etc/ssh/sshd_config must Include /etc/ssh/sshd_config.d/*.conf before its own settings)"]


def test_check_changes_nothing_and_reports_every_control(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    host = FakeHost(monkeypatch, before, before)
    run = harden(HardenOptions(check=True))
    assert run.status == "checked" and host.batches == [] and run.plan == []
    failing = {c["id"] for c in run.failed_controls}
    assert {"firewall-loaded", "ssh-password-authentication", "ssh-max-auth-tries", "ssh-kex",
            "updates-periodic"} <= failing
    assert "ssh-hostbased" not in failing   # OpenSSH's own default is already no


def test_only_limits_the_plan(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="172.17.0.1")   # a firewall would lock out; ssh alone does not
    host = FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    run = harden(HardenOptions(only=frozenset({"ssh"})))
    assert host.batches == [["guard", "ssh"]] and run.status == "changed"
    assert {c["area"] for c in run.controls} == {"ssh", "system"}


@pytest.mark.parametrize("part", ["firewall", "ssh"])
def test_the_guard_restores_exactly_the_guarded_files(part):
    guard = gpuprov.harden.run._guard([Change(part, "x", ("true",))], 60)
    expected = {"firewall": (*nft.GUARDED_FILES,), "ssh": (harden_sshd.DROPIN,)}[part]
    assert guard.files == expected and guard.restore_table is (part == "firewall")


def test_nftables_is_installed_before_the_guard_is_armed(tmp_path, monkeypatch):
    before = {**bare_facts(tmp_path, controller="10.3.4.5"), "nft": False}
    host = FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    harden()
    assert host.batches == [["updates", "updates", "packages", "guard", "ssh", "firewall"]]
    assert "apt-get" in host.changes[2].commands[-1] and "nftables" in host.changes[2].commands[-1]
    assert not any("apt-get" in command for change in host.changes[3:] for command in change.commands)


def test_every_guarded_step_holds_the_lock_and_refuses_after_the_decision(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    host = FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    harden()
    guard = host.changes[2]
    run_dir = re.search(r"mkdir -m 700 (\S+)", "\n".join(guard.commands)).group(1)
    assert run_dir.startswith("/var/lib/gpuprov/harden/")
    for change in host.changes[3:]:
        lock, check = change.commands[:2]
        assert lock == "exec 9>>/var/lib/gpuprov/harden/lock && flock 9"
        assert check.startswith(f"if [ ! -f {run_dir}/armed ] || [ -d {run_dir}/decided ]; then")
    assert "from controller 10.3.4.5 (" in "\n".join(guard.commands)


def test_a_run_is_refused_before_anything_while_another_guard_is_undecided(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    host = FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    first = "run 20261202T020000-ab12cd34 from controller 10.9.9.9 (op@ctl), started 2026-12-02T02:00:01Z"
    conn = host_conn(undecided=f"{MARK}busy {first}\n")
    with pytest.raises(GpuprovError) as caught:
        harden(conn=conn)
    assert caught.value.message == f"another harden run's guard is still undecided on this host: {first}"
    assert caught.value.step == "guard" and host.batches == []
    assert harden(HardenOptions(dry_run=True), conn=conn).status == "planned"   # a dry run changes nothing


@pytest.mark.parametrize(("result", "said"), [
    ("unknown", "whether the previous firewall and sshd configuration are back is unknown: on the host's console"),
    ("rolled back by the host", "were put back; the host reverted by itself before the batch ended"),
    ("reverted by gpuprov", "configuration were put back"),
])
def test_a_failed_batch_says_what_became_of_the_previous_configuration(tmp_path, monkeypatch, result, said):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    FakeHost(monkeypatch, before, before)

    def failing(conn, changes, **kwargs):
        error = GpuprovError("ssh: x failed with exit code 1", host="gpu01", step="ssh", hint="fix it")
        error.steps = [StepResult("guard", "arm", [], 0, 0.1, "")]
        raise error

    def revert_now(conn, guard, armed_before, why):
        return GuardOutcome(guard, result, why, hint=console_hint(guard) if result == "unknown" else "")

    monkeypatch.setattr(gpuprov.core.apply, "apply_changes", failing)
    monkeypatch.setattr(gpuprov.harden.run, "revert_now", revert_now)
    with pytest.raises(GpuprovError) as caught:
        harden()
    assert said in caught.value.hint and caught.value.run.guard.result == result


def test_a_confirmation_without_a_decision_is_unknown_and_exits_1(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    monkeypatch.setattr(gpuprov.harden.run, "confirm",
                        lambda conn, guard, armed_before: GuardOutcome(guard, "unknown", "no decision"))
    run = harden()
    assert run.status == "unknown" and run.guard.result == "unknown"
    assert HardenJob(HardenOptions()).failing(run.to_dict()) is True


def test_a_failed_batch_keeps_its_steps_once_even_when_the_revert_fails_too(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    FakeHost(monkeypatch, before, before)
    armed = [StepResult("updates", "x", [], 0, 0.1, ""), StepResult("guard", "arm", [], 0, 0.1, "")]

    def failing(conn, changes, **kwargs):
        error = GpuprovError("ssh: x failed with exit code 1", host="gpu01", step="ssh")
        error.steps = list(armed)
        raise error

    monkeypatch.setattr(gpuprov.core.apply, "apply_changes", failing)
    with pytest.raises(GpuprovError) as caught:
        harden()
    assert caught.value.run.steps == armed and caught.value.run.status == "failed"

    def unreachable(conn, guard, armed_before, why):
        raise GpuprovError(f"{why}, and the host still does not answer", host="gpu01", step="confirm")

    monkeypatch.setattr(gpuprov.harden.run, "revert_now", unreachable)
    with pytest.raises(GpuprovError) as caught:
        harden()
    assert caught.value.step == "confirm" and caught.value.run.steps == armed


def test_progress_says_facts_then_the_apply(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    FakeHost(monkeypatch, before, hardened_facts(tmp_path, before))
    said = []
    HardenJob(HardenOptions()).run_host(host_conn(), said.append)
    assert said == ["facts", "apply 4 changes"]


def test_check_and_dry_run_never_ask_about_another_runs_guard(tmp_path, monkeypatch):
    before = bare_facts(tmp_path, controller="10.3.4.5")
    FakeHost(monkeypatch, before, before)
    for options in (HardenOptions(check=True), HardenOptions(dry_run=True)):
        conn = host_conn()
        HardenJob(options).run_host(conn, lambda what: None)
        assert conn.stdins == []
    conn = host_conn()
    HardenJob(HardenOptions()).run_host(conn, lambda what: None)
    assert conn.stdins == [undecided_script()]
