"""The controls are data: the profile loads, every control names a known probe and policy value, the GPU waivers
are there with their reasons, and a malformed control is refused."""

from __future__ import annotations

import pytest

from gpuprov.core.errors import GpuprovError
from gpuprov.harden.audit import audit
from gpuprov.harden.policy import build_policy
from gpuprov.harden.profile import controls, parse_control


def test_profile_loads_with_unique_ids():
    ids = [c.id for c in controls()]
    assert len(ids) == len(set(ids)) > 20


def test_gpu_waivers_are_recorded_with_reasons():
    waived = {c.id: c.waiver for c in controls() if c.waiver}
    assert set(waived) == {"firewall-outbound-deny", "ssh-tcp-forwarding", "tmp-noexec", "ip-forward-off",
                           "ptrace-scope-3", "kernel-modules-locked"}
    words = {"tmp-noexec": "Triton", "ip-forward-off": "Docker", "ptrace-scope-3": "cuda-gdb",
             "firewall-outbound-deny": "NCCL", "kernel-modules-locked": "nvidia_uvm"}
    assert all(word in waived[cid] for cid, word in words.items())


GOOD = {"id": "x-y", "area": "ssh", "description": "d", "check": {"sshd": "macs"}, "expected": "no"}


@pytest.mark.parametrize("bad", [
    {**GOOD, "id": "X Y"}, {**GOOD, "area": "kernel"}, {**GOOD, "check": {"shell": "id"}},
    {**GOOD, "check": {"sshd": "a", "sysctl": "b"}}, {**GOOD, "expected": {"matches": "x"}},
    {**GOOD, "expected": {"equals": {"policy": "nope"}}}, {**GOOD, "when": "nope"}, {**GOOD, "extra": 1},
    {**GOOD, "area": "system"}, {**GOOD, "check": {"firewall": "everything"}}, "not a mapping",
])
def test_a_malformed_control_is_refused(bad):
    with pytest.raises(GpuprovError, match="hardening profile"):
        parse_control(0, bad)


def test_waived_controls_never_fail_and_show_what_they_saw():
    facts = {"sysctl": {"net.ipv4.ip_forward": "1", "kernel.yama.ptrace_scope": "1", "kernel.modules_disabled": "0"},
             "tmp_options": ["rw", "nosuid", "nodev"], "os": {"id": "debian"}}
    results = {r.control.id: r for r in audit(facts, build_policy({}, {}), "", [])}
    assert {cid: (r.status, r.observed) for cid, r in results.items()} == {
        "tmp-noexec": ("waived", ["rw", "nosuid", "nodev"]), "ip-forward-off": ("waived", "1"),
        "ptrace-scope-3": ("waived", "1"), "kernel-modules-locked": ("waived", "0")}


def test_updates_controls_are_skipped_where_harden_does_not_manage_them():
    results = audit({"os": {"id": "rhel"}}, build_policy({}, {}), "", ["updates"])
    assert {r.status for r in results if r.control.area == "updates"} == {"skip"}
