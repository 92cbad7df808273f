"""One harden run's decisions, the host played by facts that real tools produced (sshd -T of the rendered drop-in,
nft's listing of the rendered ruleset): refuse a lockout before anything is sent, apply behind the guard in order,
revert when the result is not the policy, confirm otherwise; a second run changes nothing."""

from __future__ import annotations

import subprocess

import pytest
from judges import needs_nft, needs_sshd, sshd, sshd_config

import gpuprov.apply
import gpuprov.harden.facts
import gpuprov.harden.run
from gpuprov.apply import StepResult
from gpuprov.harden import firewall, nft, updates
from gpuprov.harden import sshd as harden_sshd
from gpuprov.harden.confirm import GuardOutcome
from gpuprov.harden.facts import parse_sshd
from gpuprov.harden.policy import build_policy
from gpuprov.harden.run import HardenOptions, harden_host
from gpuprov.inventory import Host
from gpuprov.ops import pins

pytestmark = [needs_sshd, needs_nft]
VARIABLES = {"firewall": {"allow": [{"port": 22, "proto": "tcp", "sources": ["10.0.0.0/8"]}]}}
SUPPORTS = {"kex_algorithms": ["curve25519-sha256", "curve25519-sha256@libssh.org", "diffie-hellman-group16-sha512"],
            "ciphers": ["aes256-gcm@openssh.com", "aes128-ctr"], "macs": ["hmac-sha2-256-etm@openssh.com"],
            "host_key_algorithms": ["ssh-ed25519", "rsa-sha2-512"]}


class Conn:
    """What harden_host asks of a connection (the commands themselves go through the patched apply)."""

    connect_timeout = 5

    def __init__(self, host):
        self.host = host

    def server_key_type(self):
        return "ssh-ed25519"

    def fresh(self, **kwargs):
        return self

    def open(self):
        return self

    def close(self):
        pass


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
                           "Unattended-Upgrade::Package-Blacklist": list(pins.BLACKLIST)},
            "files": {harden_sshd.DROPIN: dropin, firewall.RULESET: ruleset, firewall.LISTING: listing,
                      firewall.UNIT_FILE: firewall.unit_file(), updates.AUTO_UPGRADES: updates.auto_upgrades("debian"),
                      pins.UNATTENDED: pins.unattended()}}


class FakeHost:
    """The host as one run sees it: its facts before and after the batch; records batches, confirmations, reverts."""

    def __init__(self, monkeypatch, before: dict, after: dict, confirmed: bool = True):
        self.batches, self.reverts, self.confirms = [], [], 0
        self.facts = before

        def gather(conn, files):
            return self.facts

        def apply_changes(conn, changes, **kwargs):
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
        monkeypatch.setattr(gpuprov.apply, "apply_changes", apply_changes)
        monkeypatch.setattr(gpuprov.harden.run, "confirm", confirm)
        monkeypatch.setattr(gpuprov.harden.run, "revert_now", revert_now)


HOST = Host(name="gpu01", address="10.0.0.1", vars=VARIABLES)


def harden(options: HardenOptions | None = None):
    return harden_host(Conn(HOST), HOST, options or HardenOptions())


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
    guard = gpuprov.harden.run._guard([gpuprov.ops.Change(part, "x", ("true",))], 60)
    expected = {"firewall": (*nft.GUARDED_FILES,), "ssh": (harden_sshd.DROPIN,)}[part]
    assert guard.files == expected and guard.restore_table is (part == "firewall")
