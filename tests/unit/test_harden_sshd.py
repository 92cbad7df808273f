"""The sshd drop-in judged by OpenSSH itself (sshd -t, sshd -T), by ssh-audit against a real sshd on 127.0.0.1, and
by paramiko's own handshake; the audit's verdicts on the effective configuration sshd prints."""

from __future__ import annotations

import subprocess

import paramiko
import pytest
from judges import (
    needs_sshd,
    paramiko_handshake,
    running_sshd,
    ssh_audit,
    ssh_audit_failures,
    sshd,
    sshd_config,
)

from gpuprov.harden import sshd as harden_sshd
from gpuprov.harden.audit import audit
from gpuprov.harden.facts import parse_sshd
from gpuprov.harden.lockout import ssh_refusals
from gpuprov.harden.policy import build_policy

pytestmark = [pytest.mark.root, pytest.mark.tool, needs_sshd]


def host_supports() -> dict:
    """What this machine's OpenSSH supports, asked of `ssh -Q` directly."""
    query = {"kex_algorithms": "kex", "ciphers": "cipher", "macs": "mac", "host_key_algorithms": "key-sig"}
    return {kind: subprocess.run(["ssh", "-Q", q], capture_output=True, text=True, check=True).stdout.split()
            for kind, q in query.items()}


def policy_for(ssh_hardening: dict | None = None):
    variables = {"ssh_hardening": ssh_hardening} if ssh_hardening else {}
    return build_policy(variables, {"ssh_supports": host_supports(), "sshd": {"port": ["22"]}})


def effective(tmp_path, dropin: str) -> dict:
    """`sshd -T` of a configuration that starts with the drop-in, parsed as the harden facts parse it."""
    result = sshd("-T", "-f", str(sshd_config(tmp_path, dropin)))
    assert result.returncode == 0, result.stderr
    config, error = parse_sshd(result.stdout + "\n@@rc=0")
    assert error is None
    return config


POLICIES = [None, {"permit_root_login": "no", "allow_users": ["gpuadmin", "ops@10.0.0.0/8"],
                   "allow_groups": ["sudo"], "x11_forwarding": True, "max_auth_tries": 5, "login_grace_time": 45},
            {"agent_forwarding": True, "client_alive_interval": 120, "client_alive_count_max": 2}]


@pytest.mark.parametrize("settings", POLICIES)
def test_sshd_accepts_every_rendered_dropin(tmp_path, settings):
    result = sshd("-t", "-f", str(sshd_config(tmp_path, harden_sshd.render(policy_for(settings)))))
    assert result.returncode == 0, result.stderr


def test_effective_configuration_is_the_baseline(tmp_path):
    config = effective(tmp_path, harden_sshd.render(policy_for()))
    # the dev-sec ssh-hardening values, written out here rather than taken from gpuprov
    expected = {"passwordauthentication": "no", "kbdinteractiveauthentication": "no", "permitemptypasswords": "no",
                "hostbasedauthentication": "no", "x11forwarding": "no", "allowagentforwarding": "no",
                "maxauthtries": "3", "logingracetime": "30", "clientaliveinterval": "300",
                "clientalivecountmax": "3", "permitrootlogin": "without-password", "permituserenvironment": "no"}
    assert {key: config[key][0] for key in expected} == expected
    assert "chacha20-poly1305@openssh.com" in config["ciphers"][0] and "cbc" not in config["ciphers"][0]
    assert "hmac-sha1" not in config["macs"][0] and "-etm@openssh.com" in config["macs"][0]
    assert "ecdh-sha2" not in config["kexalgorithms"][0] and "curve25519-sha256" in config["kexalgorithms"][0]


@pytest.mark.parametrize("settings", POLICIES)
def test_ssh_controls_pass_on_what_sshd_prints(tmp_path, settings):
    policy = policy_for(settings)
    facts = {"sshd": effective(tmp_path, harden_sshd.render(policy)), "os": {"id": "debian"}}
    results = audit(facts, policy, "", ["ssh"])
    judged = {r.control.id: r.status for r in results if r.control.area == "ssh"}
    assert judged.pop("ssh-tcp-forwarding") == "waived"
    allow = "pass" if settings and "allow_users" in settings else "skip"
    assert judged.pop("ssh-allow-users") == allow and judged.pop("ssh-allow-groups") == allow
    assert set(judged.values()) == {"pass"}, judged


def test_controls_catch_a_weaker_configuration(tmp_path):
    policy = policy_for()
    weak = "PasswordAuthentication yes\nMaxAuthTries 6\nCiphers aes128-cbc,aes256-ctr\n"
    facts = {"sshd": effective(tmp_path, weak + harden_sshd.render(policy)), "os": {"id": "debian"}}
    failed = {r.control.id: r.observed for r in audit(facts, policy, "", ["ssh"]) if r.status == "fail"}
    assert failed == {"ssh-password-authentication": "yes", "ssh-max-auth-tries": "6",
                      "ssh-ciphers": ["aes128-cbc", "aes256-ctr"]}


def test_an_algorithm_this_openssh_lacks_is_rejected_by_sshd_t(tmp_path):
    # ML-KEM key exchange arrived in OpenSSH 9.9; an inventory written for newer hosts names it explicitly
    policy = policy_for({"kex_algorithms": ["mlkem768x25519-sha256-unknown", "curve25519-sha256"]})
    result = sshd("-t", "-f", str(sshd_config(tmp_path, harden_sshd.render(policy))))
    assert result.returncode != 0 and "KexAlgorithms" in result.stderr


def test_ssh_audit_finds_no_failure_after_hardening(tmp_path):
    config = sshd_config(tmp_path, harden_sshd.render(policy_for()))
    with running_sshd(config) as port:
        report = ssh_audit("127.0.0.1", port)
    assert ssh_audit_failures(report) == []


def test_ssh_audit_finds_failures_in_openssh_defaults(tmp_path):
    """The judge judges: the same sshd with its defaults has failure-level findings."""
    with running_sshd(sshd_config(tmp_path, "")) as port:
        report = ssh_audit("127.0.0.1", port)
    assert ssh_audit_failures(report)


def test_paramiko_still_negotiates_with_the_hardened_sshd(tmp_path):
    config = sshd_config(tmp_path, harden_sshd.render(policy_for()))
    with running_sshd(config) as port:
        assert paramiko_handshake(port) in paramiko.Transport._preferred_ciphers


def test_a_policy_paramiko_cannot_speak_is_refused_and_really_locks_paramiko_out(tmp_path):
    policy = policy_for({"ciphers": ["chacha20-poly1305@openssh.com"], "macs": ["umac-128-etm@openssh.com"]})
    found = ssh_refusals(policy, {"controller": {"address": "127.0.0.1", "port": 22}}, "root", "ssh-ed25519")
    assert [line.split(" ", 1)[0] for line in found] == ["Ciphers", "MACs"]
    with running_sshd(sshd_config(tmp_path, harden_sshd.render(policy))) as port, \
            pytest.raises(paramiko.SSHException):
        paramiko_handshake(port)


def host_ssh_dir(tmp_path, policy, monkeypatch, others: dict[str, str] | None = None) -> tuple:
    """A stand-in /etc/ssh under tmp_path (sshd_config Including its sshd_config.d, a test host key), the harden
    module pointed at it, and gpuprov's drop-in in place with the rendered policy."""
    etc = tmp_path / "ssh"
    (etc / "sshd_config.d").mkdir(parents=True)
    sshd_config(etc, f"Include {etc}/sshd_config.d/*.conf\n")
    for name, text in (others or {}).items():
        (etc / "sshd_config.d" / name).write_text(text)
    dropin = etc / "sshd_config.d" / "10-gpuprov-hardening.conf"
    dropin.write_text(harden_sshd.render(policy))
    monkeypatch.setattr(harden_sshd, "SSH_DIR", str(etc))
    monkeypatch.setattr(harden_sshd, "DROPIN", str(dropin))
    return etc, dropin


def run_until_reload(change) -> subprocess.CompletedProcess:
    """The change's steps up to (not including) the sshd reload, as the apply batch runs a step (`set -e`)."""
    assert change.commands[-1] == harden_sshd.RELOAD_SSHD
    return subprocess.run(["sh", "-ec", "\n".join(change.commands[:-1])], capture_output=True, text=True, timeout=60)


def test_a_dropin_sshd_rejects_never_replaces_the_old_one(tmp_path, monkeypatch):
    good = policy_for()
    etc, dropin = host_ssh_dir(tmp_path, good, monkeypatch)
    before = dropin.read_text()
    bad = policy_for({"kex_algorithms": ["mlkem768x25519-sha256-unknown", "curve25519-sha256"]})
    result = run_until_reload(harden_sshd.change(bad, {"files": {str(dropin): before}}))
    assert result.returncode != 0
    assert "sshd -t rejected the configuration" in result.stderr and "KexAlgorithms" in result.stderr
    assert dropin.read_text() == before
    assert sorted(path.name for path in dropin.parent.iterdir()) == [dropin.name]   # nothing staged left behind
    assert sshd("-t", "-f", str(etc / "sshd_config")).returncode == 0


def test_an_accepted_dropin_replaces_the_old_one_and_sshd_reads_it(tmp_path, monkeypatch):
    etc, dropin = host_ssh_dir(tmp_path, policy_for(), monkeypatch)
    wanted = policy_for({"max_auth_tries": 5, "x11_forwarding": True})
    result = run_until_reload(harden_sshd.change(wanted, {"files": {str(dropin): dropin.read_text()}}))
    assert result.returncode == 0, result.stderr
    assert dropin.read_text() == harden_sshd.render(wanted)
    assert oct(dropin.stat().st_mode & 0o777) == "0o600"
    printed = sshd("-T", "-f", str(etc / "sshd_config")).stdout.splitlines()
    assert "maxauthtries 5" in printed and "x11forwarding yes" in printed


def test_the_check_judges_the_whole_configuration_with_the_other_dropins(tmp_path, monkeypatch):
    """Another drop-in sshd cannot read fails the check too: sshd would refuse the reload with it."""
    _, dropin = host_ssh_dir(tmp_path, policy_for(), monkeypatch, {"60-broken.conf": "NoSuchOption yes\n"})
    before = dropin.read_text()
    result = run_until_reload(harden_sshd.change(policy_for({"max_auth_tries": 4}), {"files": {str(dropin): before}}))
    assert result.returncode != 0 and "60-broken.conf" in result.stderr and "NoSuchOption" in result.stderr
    assert dropin.read_text() == before
