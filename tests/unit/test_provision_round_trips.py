"""Round trips of one provision run: facts are gathered once before, come back with the apply batch, and are
gathered once more only after a reboot; a run with nothing to do makes one round trip."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers.ops import bare_facts, make_repo, make_stack, provisioned_facts

import gpuprov.core.apply
import gpuprov.facts.gather
import gpuprov.provision.plan
import gpuprov.provision.run
from gpuprov.core.apply import StepResult
from gpuprov.inventory import Host
from gpuprov.provision.run import Options, ProvisionJob

STACK = make_stack()


class Calls:
    """Counts what the run sends to the host; the host answers from canned facts."""

    def __init__(self, monkeypatch, first: dict):
        self.gathers, self.applies, self.plans, self.reboots = 0, [], 0, 0
        self.facts = first
        done = provisioned_facts("debian", STACK, make_repo())
        plan_host = gpuprov.provision.plan.plan_host

        def gather(conn, files=()):
            self.gathers += 1
            return self.facts

        def apply_changes(conn, changes, *, disrupt=False, managed_files=(), known=None):
            self.applies.append(len(changes))
            # the batch records each change that takes effect at the next boot (apply.step_body)
            self.facts = done | {"gpuprov_reboot_pending": [f"{c.component}: {c.summary}" for c in changes
                                                            if c.reboot]}
            return [StepResult(c.component, c.summary, list(c.commands), 0, 0.1, "") for c in changes], self.facts

        def plan(*args, **kwargs):
            self.plans += 1
            return plan_host(*args, **kwargs)

        def reboot(conn, timeout, disrupt=False):
            self.reboots += 1

        monkeypatch.setattr(gpuprov.facts.gather, "gather", gather)
        monkeypatch.setattr(gpuprov.core.apply, "apply_changes", apply_changes)
        monkeypatch.setattr(gpuprov.provision.plan, "plan_host", plan)
        monkeypatch.setattr(gpuprov.provision.run, "reboot_and_wait", reboot)
        monkeypatch.setattr(gpuprov.provision.run, "stack_for", lambda host, facts, options: (STACK, None, []))


HOST = Host(name="gpu01", address="10.0.0.1")


def run(options: Options):
    return ProvisionJob(options, None).run_host(SimpleNamespace(host=HOST), lambda what: None)


@pytest.mark.parametrize(("reboot", "gathers", "reboots", "plans"), [("never", 1, 0, 2), ("if-needed", 2, 1, 3)])
def test_from_bare_facts_are_gathered_once_before_and_once_after_a_reboot(monkeypatch, reboot, gathers, reboots,
                                                                          plans):
    calls = Calls(monkeypatch, bare_facts() | {"gpu_processes": [], "containers": None})
    result = run(Options(reboot=reboot, skip_preflight=True))
    assert result.status == "changed" and result.facts_after is calls.facts
    assert result.reboot == ("done" if reboot == "if-needed" else "required")
    assert (calls.gathers, len(calls.applies), calls.reboots, calls.plans) == (gathers, 1, reboots, plans)


def test_a_host_in_state_costs_one_round_trip(monkeypatch):
    calls = Calls(monkeypatch, provisioned_facts("debian", STACK, make_repo()))
    result = run(Options(skip_preflight=True))
    assert (result.status, result.reboot) == ("unchanged", "not needed")
    assert (calls.gathers, calls.applies, calls.reboots, calls.plans) == (1, [], 0, 1)
