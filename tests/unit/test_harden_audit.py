"""Firewall controls judged on what nftables itself lists after loading the rendered ruleset (a scratch network
namespace), and on a table someone changed by hand."""

from __future__ import annotations

import subprocess

import pytest
from judges import needs_nft

from gpuprov.harden.audit import audit
from gpuprov.harden.firewall import LISTING, RULESET, UNIT, UNIT_FILE, build_rules, render, unit_file
from gpuprov.harden.policy import build_policy

VARIABLES = {"firewall": {"allow": [{"port": 22, "proto": "tcp", "sources": ["10.0.0.0/8"]}]},
             "cluster_cidrs": ["10.1.0.0/16"]}


def listing(tmp_path, ruleset: str, then: str = "") -> str:
    path = tmp_path / "ruleset.nft"
    path.write_text(ruleset)
    proc = subprocess.run(["unshare", "-n", "sh", "-c", f"nft -f {path} {then} && nft list table inet gpuprov"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("no permission to create a network namespace here")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def firewall_results(tmp_path, live: str, stored: str, ruleset: str) -> dict:
    facts = {"systemd": True, "nft": True, "nft_table": live.strip("\n"), "units": {UNIT: "enabled"},
             "files": {RULESET: ruleset, LISTING: stored, UNIT_FILE: unit_file()}, "os": {"id": "debian"}}
    policy = build_policy(VARIABLES, {"sshd": {"port": ["22"]}})
    return {r.control.id: (r.status, r.observed) for r in audit(facts, policy, ruleset, ["firewall"])
            if r.control.area == "firewall"}


@pytest.mark.root
@pytest.mark.tool
@needs_nft
def test_firewall_controls_pass_on_the_loaded_ruleset(tmp_path):
    ruleset = render(build_rules(VARIABLES, [22]))
    loaded = listing(tmp_path, ruleset)
    assert firewall_results(tmp_path, loaded, loaded, ruleset) == {
        "firewall-loaded": ("pass", "matches the inventory"), "firewall-persisted": ("pass", "matches the inventory"),
        "firewall-inbound-drop": ("pass", "drop"), "firewall-docker-published": ("pass", "present"),
        "firewall-outbound-deny": ("waived", "accept (no gpuprov chain)"),
        "firewall-no-other-ruleset": ("pass", "none")}


@pytest.mark.root
@pytest.mark.tool
@needs_nft
def test_a_rule_added_by_hand_is_caught(tmp_path):
    ruleset = render(build_rules(VARIABLES, [22]))
    loaded = listing(tmp_path, ruleset)
    edited = listing(tmp_path, ruleset, "&& nft add rule inet gpuprov input tcp dport 3306 accept")
    results = firewall_results(tmp_path, edited, loaded, ruleset)
    assert results["firewall-loaded"] == ("fail", "the loaded table differs from the ruleset gpuprov loaded")
    assert results["firewall-persisted"][0] == "pass"


@pytest.mark.root
@pytest.mark.tool
@needs_nft
def test_a_policy_accept_table_fails_the_inbound_control(tmp_path):
    ruleset = render(build_rules(VARIABLES, [22]))
    loose = listing(tmp_path, ruleset, "&& nft chain inet gpuprov input '{ policy accept; }'")
    assert firewall_results(tmp_path, loose, loose, ruleset)["firewall-inbound-drop"] == ("fail", "accept")


@pytest.mark.root
@pytest.mark.tool
@needs_nft
def test_another_firewall_fails_the_audit_and_is_named(tmp_path):
    ruleset = render(build_rules(VARIABLES, [22]))
    loaded = listing(tmp_path, ruleset)
    facts = {"systemd": True, "nft": True, "nft_table": loaded.strip("\n"), "units": {UNIT: "enabled"},
             "files": {RULESET: ruleset, LISTING: loaded, UNIT_FILE: unit_file()}, "os": {"id": "debian"},
             "other_firewalls": {"nftables.service": "enabled"},
             "other_rulesets": ["iptables-legacy filter: chain INPUT (policy drop)"]}
    policy = build_policy(VARIABLES, {"sshd": {"port": ["22"]}})
    (result,) = [r for r in audit(facts, policy, ruleset, ["firewall"]) if r.control.id == "firewall-no-other-ruleset"]
    assert (result.status, result.observed) == (
        "fail", ["nftables.service enabled", "iptables-legacy filter: chain INPUT (policy drop)"])
