"""Refusals before applying: nothing in common with paramiko, the verified host key type dropped, the connecting
user left out, root shut out while gpuprov is root."""

from __future__ import annotations

import paramiko
import pytest

from gpuprov.harden.lockout import firewall_refusals, ssh_refusals
from gpuprov.harden.policy import build_policy

FACTS = {"controller": {"address": "10.0.5.9", "port": 22}, "user_groups": ["gpuadmin", "sudo"],
         "sshd": {"port": ["22"]}}


def refusals(settings: dict, user: str = "gpuadmin", key_type: str = "ssh-ed25519", facts: dict = FACTS) -> list[str]:
    return ssh_refusals(build_policy({"ssh_hardening": settings}, facts), facts, user, key_type)


def test_the_baseline_refuses_nothing():
    assert refusals({}) == [] and refusals({}, user="root") == []


@pytest.mark.parametrize(("settings", "first_word"), [
    ({"ciphers": ["chacha20-poly1305@openssh.com"]}, "Ciphers"),
    ({"macs": ["umac-128-etm@openssh.com", "umac-64-etm@openssh.com"]}, "MACs"),
    ({"kex_algorithms": ["sntrup761x25519-sha512@openssh.com"]}, "KexAlgorithms"),
])
def test_nothing_in_common_with_paramiko(settings, first_word):
    (found,) = refusals(settings)
    assert found.startswith(first_word) and "paramiko" in found
    kind = {"Ciphers": "_preferred_ciphers", "MACs": "_preferred_macs", "KexAlgorithms": "_preferred_kex"}[first_word]
    assert not set(next(iter(settings.values()))) & set(getattr(paramiko.Transport, kind))


def test_one_algorithm_in_common_is_enough():
    assert refusals({"ciphers": ["chacha20-poly1305@openssh.com", "aes256-gcm@openssh.com"]}) == []


@pytest.mark.parametrize(("key_type", "refused"), [("ssh-ed25519", True), ("ssh-rsa", False),
                                                    ("ecdsa-sha2-nistp256", True)])
def test_the_host_key_gpuprov_verifies_must_stay_offered(key_type, refused):
    found = refusals({"host_key_algorithms": ["rsa-sha2-512", "rsa-sha2-256"]}, key_type=key_type)
    assert bool(found) is refused


@pytest.mark.parametrize(("allow_users", "refused"), [
    (["gpuadmin"], False), (["gpu*"], False), (["gpuadmin@10.0.0.0/16"], False), (["gpuadmin@10.0.5.*"], False),
    (["ops"], True), (["gpuadmin@192.168.0.0/16"], True), (["root"], True),
])
def test_allow_users_must_keep_the_connecting_user(allow_users, refused):
    assert bool(refusals({"allow_users": allow_users})) is refused


@pytest.mark.parametrize(("allow_groups", "refused"), [(["sudo"], False), (["wheel", "gpu*"], False),
                                                        (["wheel"], True)])
def test_allow_groups_must_keep_one_of_the_users_groups(allow_groups, refused):
    assert bool(refusals({"allow_groups": allow_groups})) is refused


def test_root_login_no_while_gpuprov_is_root():
    assert refusals({"permit_root_login": "no"}, user="gpuadmin") == []
    (found,) = refusals({"permit_root_login": "no"}, user="root")
    assert "PermitRootLogin no" in found


@pytest.mark.parametrize(("others", "words"), [
    ({"other_firewalls": {"ufw": "enabled, active"}}, ["ufw is enabled, active", "`ufw disable`"]),
    ({"other_firewalls": {"firewalld.service": "active"}}, ["firewalld.service is active",
                                                            "`systemctl disable --now firewalld`"]),
    ({"other_firewalls": {"nftables.service": "enabled"}}, ["nftables.service is enabled", "flush ruleset",
                                                            "`systemctl disable nftables.service` (not --now"]),
    ({"other_rulesets": ["table inet f2b-table: chain input (1 rules)"]},
     ["another ruleset filters this host (table inet f2b-table: chain input (1 rules))"]),
])
def test_a_firewall_gpuprov_does_not_own_is_refused_with_what_to_do(others, words):
    """Refused rather than integrated, the reason naming the firewall, how to turn it off and how to leave the
    firewall to it; the SSH path itself is open (the only refusal is that one)."""
    facts = {**FACTS, **others}
    (found,) = firewall_refusals(build_policy({}, facts), facts)
    assert all(word in found for word in words) and "gpuprov refuses" in found
    assert "--only ssh,updates" in found


def test_no_refusal_without_another_firewall():
    facts = {**FACTS, "other_firewalls": {}, "other_rulesets": []}
    assert firewall_refusals(build_policy({}, facts), facts) == []
