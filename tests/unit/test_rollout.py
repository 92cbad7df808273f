"""The rollout's state machine, journal, budget, status and metric, with a scheduler and host steps standing in:
the states a host goes through and what the scheduler is asked are written out here, from the issue's contract
(drain, wait, upgrade, reboot, validate, resume; failed hosts stay drained; nothing is killed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.inventory import Host
from gpuprov.rollout import job as rollout_job
from gpuprov.rollout.job import Budget, RolloutJob, RolloutOptions
from gpuprov.rollout.journal import load, newest, open_journal
from gpuprov.rollout.scheduler import Job, NodeState, left_text
from gpuprov.rollout.status import metric_text, status_lines
from gpuprov.tasks.rollout import parse_duration

GPU = Host(name="gpu07", address="192.0.2.7")


@dataclass
class FakeScheduler:
    """A scheduler whose node states and job lists are set by the test; every request is recorded."""

    states: dict = field(default_factory=dict)
    job_polls: dict = field(default_factory=dict)     # node -> list of job lists, one per poll (last repeats)
    calls: list = field(default_factory=list)
    kind: str = "slurm"

    def nodes(self, hosts):
        return {h.name: self.states.get(h.name, NodeState(h.name)) for h in hosts}

    def jobs(self, host):
        polls = self.job_polls.get(host.name, [[]])
        return polls.pop(0) if len(polls) > 1 else polls[0]

    def drain(self, host, reason):
        self.calls.append(("drain", host.name, reason))
        self.states[host.name] = NodeState(host.name, drained=True, reason=reason, state="idle+drain")

    def resume(self, host):
        self.calls.append(("resume", host.name))
        self.states[host.name] = NodeState(host.name, state="idle")

    def set_reason(self, host, reason):
        self.calls.append(("set_reason", host.name, reason))
        self.states[host.name] = NodeState(host.name, drained=True, reason=reason, state="idle+drain")


def provision_run(changes: int, reboot: str = "not needed", mismatches=()):
    return SimpleNamespace(status="planned" if changes else "unchanged",
                           facts_before={"loaded_driver_version": "550.127.08"},
                           stack={"driver": {"version": "570.133.20"}, "cuda": {"version": "12.8"}},
                           plan={"changes": [{}] * changes}, reboot=reboot, reboot_detail="driver swap",
                           mismatches=list(mismatches))


@pytest.fixture
def steps(monkeypatch):
    """Host steps standing in: provision passes (dry run first), validation results, metric writes."""
    seen = SimpleNamespace(provision=[], validate=[], metrics=[], plan=[provision_run(3)],
                           upgrade=[provision_run(3, reboot="required"), provision_run(0)],
                           results=[{"check": "host.gpus", "status": "pass", "reason": "8 GPUs", "figures": {},
                                     "thresholds": {}}])

    def fake_provision(self, conn, say, *, dry_run=False, reboot="never"):
        seen.provision.append("plan" if dry_run else reboot)
        return seen.plan[0] if dry_run else seen.upgrade.pop(0)

    class FakeValidate:
        def __init__(self, options):
            seen.validate.append(options.level)

        def run_host(self, conn, say):
            failed = any(r["status"] == "fail" for r in seen.results)   # validation.host.host_status's words
            return SimpleNamespace(to_dict=lambda: {"status": "fail" if failed else "pass", "error": None,
                                                    "counts": {}, "results": seen.results})

    monkeypatch.setattr(RolloutJob, "_provision", fake_provision)
    monkeypatch.setattr("gpuprov.validation.host.ValidateJob", FakeValidate)
    monkeypatch.setattr(rollout_job, "_write_metric", lambda conn, journal, state, record=None:
                        seen.metrics.append(state))
    monkeypatch.setattr(rollout_job, "POLL_S", 0.0)
    monkeypatch.setattr(rollout_job, "RESUME_POLL_S", 0.0)
    return seen


def make_job(tmp_path, scheduler, *, wait_s=3600.0, validate="quick", state=None):
    journal = open_journal(tmp_path, {"hosts": ["gpu07"]}, ["gpu07"])
    if state:
        journal.transition("gpu07", state, "earlier run")
    return RolloutJob(RolloutOptions(wait_jobs_s=wait_s, validate=validate), journal, scheduler, tmp_path,
                      Budget(limit=1, shown="25% (1 host)"), [GPU])


def history(job) -> list[str]:
    return [item["state"] for item in load(job.journal.path).hosts["gpu07"]["history"]]


def test_an_idle_host_is_drained_upgraded_rebooted_validated_and_resumed(tmp_path, steps):
    scheduler = FakeScheduler()
    job = make_job(tmp_path, scheduler)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "resumed" and record.status == "changed"
    assert history(job) == ["draining", "drained", "upgrading", "rebooting", "validating", "resumed"]
    assert scheduler.calls == [
        ("drain", "gpu07", f"gpuprov rollout {job.journal.run_id}: driver 550.127.08 -> driver 570.133.20 CUDA 12.8"),
        ("resume", "gpu07")]
    assert steps.provision == ["plan", "never", "if-needed"]
    assert steps.validate == ["quick"]
    assert steps.metrics == ["draining", "drained", "upgrading", "validating", "resumed"]


def test_the_journal_has_each_state_before_its_action(tmp_path, steps, monkeypatch):
    scheduler = FakeScheduler()
    job = make_job(tmp_path, scheduler)
    on_disk = []
    real_drain = scheduler.drain

    def drain(host, reason):
        on_disk.append(load(job.journal.path).hosts["gpu07"]["state"])
        real_drain(host, reason)

    monkeypatch.setattr(scheduler, "drain", drain)
    job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert on_disk == ["draining"]


def test_a_job_that_ends_frees_its_host(tmp_path, steps):
    running = [Job("1234", "alice", "train", 600)]
    scheduler = FakeScheduler(job_polls={"gpu07": [running, running, []]})
    job = make_job(tmp_path, scheduler)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "resumed"
    assert load(job.journal.path).hosts["gpu07"]["jobs"] == []


def test_jobs_past_wait_jobs_skip_the_host_and_lift_the_drain_without_killing(tmp_path, steps):
    running = [Job("1234", "alice", "train", 11400)]
    scheduler = FakeScheduler(job_polls={"gpu07": [running]})
    job = make_job(tmp_path, scheduler, wait_s=0.01)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "skipped"
    assert "job 1234 (alice, 3 h 10 min left)" in record.reason
    assert [call[0] for call in scheduler.calls] == ["drain", "resume"]
    assert steps.provision == ["plan"]          # planned only: nothing was upgraded
    assert job.failing(record.to_dict())


def test_a_failed_validation_leaves_the_host_drained_with_the_reason(tmp_path, steps):
    steps.results = [{"check": "host.pcie", "status": "fail", "reason": "PCIe x8, expected x16",
                      "figures": {"width": 8}, "thresholds": {"width": 16}}]
    scheduler = FakeScheduler()
    job = make_job(tmp_path, scheduler)
    with pytest.raises(GpuprovError) as caught:
        job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    record = caught.value.run
    assert record.state == "failed"
    assert record.failed_checks == [{"check": "host.pcie", "reason": "PCIe x8, expected x16",
                                     "figures": {"width": 8}, "thresholds": {"width": 16}}]
    assert [call[0] for call in scheduler.calls] == ["drain", "set_reason"]
    assert scheduler.states["gpu07"].drained
    assert "host.pcie" in scheduler.calls[-1][2] and scheduler.calls[-1][2].startswith("gpuprov rollout ")
    assert load(job.journal.path).hosts["gpu07"]["state"] == "failed"


def test_a_node_an_admin_drained_is_left_alone(tmp_path, steps):
    scheduler = FakeScheduler(states={"gpu07": NodeState("gpu07", drained=True, reason="bad fan, ticket 42")})
    job = make_job(tmp_path, scheduler)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "skipped" and "bad fan, ticket 42" in record.reason
    assert scheduler.calls == []


def test_a_host_on_the_target_stack_is_never_drained(tmp_path, steps):
    steps.plan = [provision_run(0)]
    scheduler = FakeScheduler()
    job = make_job(tmp_path, scheduler)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "current" and scheduler.calls == []


@pytest.mark.parametrize("state, provision", [
    ("resumed", []),                                   # done: not touched again
    ("upgrading", ["plan", "never", "if-needed"]),    # drained earlier: not drained again, upgrade finished
    ("rebooting", ["plan", "if-needed"]),             # the upgrade applied: only the reboot pass
    ("validating", ["plan"]),
])
def test_a_rerun_resumes_each_host_from_its_journal_state(tmp_path, steps, state, provision):
    steps.upgrade = [provision_run(0, reboot="not needed"), provision_run(0)] if state != "upgrading" else \
        steps.upgrade
    job = make_job(tmp_path, FakeScheduler(), state=state)
    reason = f"gpuprov rollout {job.journal.run_id}: driver 550 -> driver 570"
    job.scheduler.states["gpu07"] = NodeState("gpu07", drained=True, reason=reason)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert steps.provision == provision
    assert [c for c in job.scheduler.calls if c[0] == "drain"] == []
    assert record.state == "resumed"
    assert ("resume", "gpu07") in job.scheduler.calls


def test_the_budget_counts_hosts_drained_outside_the_rollout():
    budget = Budget(limit=1, shown="25% (1 host)", others={"gpu03": "drained: maintenance"})
    assert budget.blocked(1) == ("blocked: max-unavailable 25% (1 host) used by 1 host drained or down outside "
                                 "this rollout: gpu03 (drained: maintenance)")
    assert Budget(limit=2, shown="50% (2 hosts)", others={"gpu03": "down"}).blocked(1) is None


def test_a_rerun_with_the_same_arguments_continues_the_journal(tmp_path):
    first = open_journal(tmp_path, {"hosts": ["a"], "drain": "slurm"}, ["a"])
    again = open_journal(tmp_path, {"drain": "slurm", "hosts": ["a"]}, ["a"])
    assert again.run_id == first.run_id
    other = open_journal(tmp_path, {"hosts": ["b"], "drain": "slurm"}, ["b"])
    assert other.run_id != first.run_id
    again.set_status("complete")
    later = open_journal(tmp_path, {"hosts": ["a"], "drain": "slurm"}, ["a"])
    assert later.run_id == first.run_id[:-1] + "2"
    assert newest(tmp_path, first.run_id.split("-")[0]).run_id == later.run_id


def test_a_dry_run_writes_no_journal(tmp_path):
    open_journal(tmp_path, {"hosts": ["a"]}, ["a"], dry_run=True)
    assert list(tmp_path.iterdir()) == []


def test_a_corrupt_journal_is_a_clear_error(tmp_path):
    path = tmp_path / "rollout-journal-0123abcd-1.json"
    path.write_text("{not json")
    with pytest.raises(InputError, match="not a readable rollout journal"):
        newest(tmp_path)
    assert path.read_text() == "{not json"


def test_status_says_what_a_host_waits_for(tmp_path):
    journal = open_journal(tmp_path, {"hosts": ["gpu07", "gpu08"]}, ["gpu07", "gpu08"])
    journal.transition("gpu07", "draining", "waiting for running jobs to end")
    journal.note("gpu07", jobs=[Job("1234", "alice", "train", 11400).to_dict()], seen="2026-12-03T07:00:00Z")
    journal.set_status("blocked", "blocked: max-unavailable 25% (1 host) used by 1 host drained or down outside "
                                  "this rollout: gpu03 (drained: maintenance)")
    seen = 1796281200.0                 # 2026-12-03T07:00:00Z (date -ud @1796281200)
    lines = status_lines(load(journal.path), now=seen + 600)
    assert any(line.startswith("gpu07: waits for job 1234 (alice, 3 h left)") for line in lines), lines
    assert "gpu08: selected since" in "\n".join(lines)
    assert any(line.startswith("blocked: max-unavailable 25% (1 host) used by 1 host") for line in lines)


@pytest.mark.parametrize("seconds, text", [(None, "no time limit"), (45, "45 s left"), (600, "10 min left"),
                                           (11400, "3 h 10 min left"), (90000, "1 d 1 h left")])
def test_time_left_reads_as_people_say_it(seconds, text):
    assert left_text(seconds) == text


@pytest.mark.parametrize("value, seconds", [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("45", 45)])
def test_wait_jobs_durations(value, seconds):
    assert parse_duration("--wait-jobs", value) == seconds


@pytest.mark.parametrize("value", ["", "0", "-5s", "1.5h", "10 minutes", "1w", "٣s"])
def test_a_bad_wait_jobs_is_exit_2_naming_the_flag(value):
    with pytest.raises(InputError, match="--wait-jobs"):
        parse_duration("--wait-jobs", value)


@pytest.mark.tool
def test_the_rollout_metric_is_valid_exposition_text(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.geteuid() != 0:
            pytest.skip("promtool is not on PATH")
        from gpuprov.monitoring.promtool import promtool_path

        promtool = promtool_path(install=True)
    text = metric_text('a1b2c3d4-1"x', "draining", 1764748800.0)
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert 'gpuprov_rollout_state{run="a1b2c3d4-1\\"x",state="draining"} 1.0' in text.splitlines()
    assert sum(line.endswith(" 1.0") for line in text.splitlines() if line.startswith("gpuprov_rollout_state{")) == 1


def test_the_journal_file_is_json_with_every_host(tmp_path):
    journal = open_journal(tmp_path, {"hosts": ["a", "b"]}, ["a", "b"])
    data = json.loads(journal.path.read_text())
    assert set(data["hosts"]) == {"a", "b"} and data["status"] == "running"


def fleet_of(tmp_path, names):
    from pathlib import Path

    from gpuprov.core.executor import Settings
    from gpuprov.core.runtime import Fleet

    inventory = SimpleNamespace(path=Path(tmp_path) / "inventory.yaml", jump_host=lambda host: None)
    return Fleet(inventory, [Host(name=n, address="192.0.2.1") for n in names],
                 Settings(known_hosts=tmp_path / "known_hosts"), tmp_path)


def prepared(tmp_path, monkeypatch, scheduler, names, **flags):
    from gpuprov.core.batches import Size
    from gpuprov.rollout import plan

    monkeypatch.setattr("gpuprov.rollout.connect.scheduler_for", lambda kind, fleet: scheduler)
    options = {"kind": "slurm", "locks": tmp_path / "locks", "to_lock": None, "update_lock": True,
               "batch": Size(count=1), "max_unavailable": Size(percent=50), "canary": 1, "wait_jobs_s": 60.0,
               "validate": "none", "checks": None, "wheelhouse": tmp_path, "dry_run": False, **flags}
    return plan.prepare(fleet_of(tmp_path, names), **options)


def test_idle_hosts_go_first_then_busy_ones_soonest_free_then_unavailable_ones(tmp_path, monkeypatch):
    from gpuprov.core.batches import Size

    scheduler = FakeScheduler(states={"gpu02": NodeState("gpu02", drained=True, reason="bad fan")},
                              job_polls={"gpu01": [[Job("7", "bob", "", 7200)]], "gpu04": [[Job("8", "eve", "", 60)]]})
    ready = prepared(tmp_path, monkeypatch, scheduler, ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"],
                     max_unavailable=Size(count=2))
    assert [h.name for h in ready.fleet.hosts] == ["gpu03", "gpu05", "gpu04", "gpu01", "gpu02"]
    assert [len(batch) for batch in ready.fleet.settings.batches.batches(ready.fleet.hosts)] == [1, 1, 1, 1, 1]
    assert ready.blocked is None and ready.job.budget.others == {"gpu02": "drained: bad fan"}


def test_a_budget_used_up_by_others_starts_nothing_and_says_why(tmp_path, monkeypatch, capsys):
    scheduler = FakeScheduler(states={"gpu02": NodeState("gpu02", drained=True, reason="bad fan, ticket 42")})
    ready = prepared(tmp_path, monkeypatch, scheduler, ["gpu01", "gpu02"])
    assert ready.run() == 1
    assert scheduler.calls == []
    err = capsys.readouterr().err
    assert ("blocked: max-unavailable 50% (1 host) used by 1 host drained or down outside this rollout: gpu02 "
            "(drained: bad fan, ticket 42)") in err
    assert load(ready.journal.path).data["status"] == "blocked"


def test_the_canary_batch_goes_alone_then_batch_sized_ones(tmp_path, monkeypatch):
    from gpuprov.core.batches import Size

    ready = prepared(tmp_path, monkeypatch, FakeScheduler(), [f"gpu{i:02d}" for i in range(1, 8)],
                     batch=Size(count=3), max_unavailable=Size(percent=100))
    assert [len(b) for b in ready.fleet.settings.batches.batches(ready.fleet.hosts)] == [1, 3, 3]


@given(st.text(max_size=12))
def test_any_wait_jobs_text_is_a_duration_or_exit_2(text):
    try:
        seconds = parse_duration("--wait-jobs", text)
    except InputError as exc:
        assert "--wait-jobs" in str(exc)
        return
    number, unit = re.fullmatch(r"\s*([0-9]+)(s|m|min|h|d)?\s*", text).groups()
    assert seconds == int(number) * {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}[unit] > 0


@pytest.mark.parametrize("variables, message", [
    ([{}, {}], "--drain slurm: no scheduler.controller for gpu01, gpu02"),
    ([{"controller": "ctl1"}, {"controller": "ctl2"}], "the hosts name different controllers (ctl1, ctl2)"),
])
def test_slurm_needs_one_controller_named_in_the_inventory(tmp_path, variables, message):
    from gpuprov.rollout.connect import scheduler_for

    fleet = fleet_of(tmp_path, ["gpu01", "gpu02"])
    for host, settings in zip(fleet.hosts, variables, strict=True):
        host.vars["scheduler"] = settings
    with pytest.raises(InputError) as caught:
        scheduler_for("slurm", fleet)
    assert message in str(caught.value)


def test_hooks_without_a_state_command_are_refused_before_any_command(tmp_path):
    from gpuprov.rollout.connect import scheduler_for

    fleet = fleet_of(tmp_path, ["gpu01"])
    fleet.hosts[0].vars["scheduler"] = {"cordon": "c {node} {reason}", "busy": "b {node}", "uncordon": "u {node}"}
    with pytest.raises(InputError, match="hosts without scheduler.cordon, scheduler.busy, scheduler.uncordon, "
                                         "scheduler.state: gpu01"):
        scheduler_for("hook", fleet)


@pytest.mark.parametrize("scheduler, where", [
    ("{kind: slurmm}", "7:15: hosts.gpu01.vars.scheduler.kind: must be one of slurm, hook, none, not 'slurmm'"),
    ("{controller: 'ctl; rm -rf /'}", "7:21: hosts.gpu01.vars.scheduler.controller: bad controller host"),
    ("{cordon: ['c {node} {reason}', \"x\\ty\"]}", "7:39: hosts.gpu01.vars.scheduler.cordon[1]: bad command"),
])
def test_bad_scheduler_variables_are_located_errors(tmp_path, scheduler, where):
    from gpuprov.inventory import load_inventory

    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  gpu01:\n    address: 192.0.2.1\n    vars:\n      hardware: {gpu: L40S, count: 4}\n"
                    "      scheduler:\n"
                    f"        {scheduler[1:-1].split(':', 1)[0]}: {scheduler[1:-1].split(':', 1)[1].strip()}\n")
    text = path.read_text()
    with pytest.raises(InputError) as caught:
        load_inventory(path)
    assert where in str(caught.value), str(caught.value)
    assert path.read_text() == text


def test_the_plan_pass_leaves_the_lock_to_be_moved_by_the_upgrade(tmp_path, monkeypatch):
    """provision --update-lock moves a lock once per run (moved_locks): the dry-run plan pass must not count."""
    seen = []

    class Recording:
        def __init__(self, options, inventory_dir):
            seen.append(options)

        def run_host(self, conn, say):
            return None

    monkeypatch.setattr("gpuprov.provision.run.ProvisionJob", Recording)
    job = make_job(tmp_path, FakeScheduler())
    job.options = RolloutOptions(update_lock=True)
    job._provision(SimpleNamespace(host=GPU), print, dry_run=True)
    job._provision(SimpleNamespace(host=GPU), print, reboot="never")
    job._provision(SimpleNamespace(host=GPU), print, reboot="if-needed")
    assert [o.dry_run for o in seen] == [True, False, False] and all(o.update_lock for o in seen)
    assert seen[0].moved_locks is not job.moved_locks
    assert seen[1].moved_locks is job.moved_locks and seen[2].moved_locks is job.moved_locks


def test_a_failed_host_is_tried_again_from_its_drain_waiting_for_its_jobs(tmp_path, steps):
    """A failure while draining (the controller unreachable) may leave jobs on the node: they are waited for."""
    running = [Job("1234", "alice", "train", 600)]
    scheduler = FakeScheduler(job_polls={"gpu07": [running, []]})
    job = make_job(tmp_path, scheduler, state="failed")
    scheduler.states["gpu07"] = NodeState("gpu07", drained=True,
                                          reason=f"gpuprov rollout {job.journal.run_id}: failed draining: x")
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "resumed"
    assert history(job)[1:] == ["draining", "draining", "drained", "upgrading", "rebooting", "validating",
                                "resumed"]


def test_a_node_resumed_by_someone_since_the_last_run_is_drained_again_before_its_upgrade(tmp_path, steps):
    running = [Job("77", "bob", "eval", 300)]
    scheduler = FakeScheduler(job_polls={"gpu07": [running, []]})     # the node took a job meanwhile
    job = make_job(tmp_path, scheduler, state="drained")
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "resumed"
    assert [c[0] for c in scheduler.calls] == ["drain", "resume"]
    assert history(job)[1:3] == ["draining", "draining"] and "waits for job 77 (bob, 5 min left)" in \
        load(job.journal.path).hosts["gpu07"]["history"][2]["detail"]


def test_a_host_another_rollout_left_failed_can_be_rolled_back_alone(tmp_path, steps):
    scheduler = FakeScheduler(states={"gpu07": NodeState("gpu07", drained=True,
                                                         reason="gpuprov rollout deadbeef-1: failed validating: x")})
    job = make_job(tmp_path, scheduler)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "resumed"
    assert scheduler.calls[0][0] == "drain"
    assert scheduler.calls[0][2].startswith(f"gpuprov rollout {job.journal.run_id}:")


def test_a_dry_run_asks_the_scheduler_nothing_that_changes_it(tmp_path, steps):
    scheduler = FakeScheduler()
    job = make_job(tmp_path, scheduler, state="resumed")
    job.dry_run = True
    scheduler.states["gpu07"] = NodeState("gpu07", drained=True, reason=f"gpuprov rollout {job.journal.run_id}: x")
    job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert scheduler.calls == []


def test_ctrl_c_stops_the_wait_for_jobs_and_lifts_the_drain(tmp_path, steps):
    running = [Job("1234", "alice", "train", 600)]
    scheduler = FakeScheduler(job_polls={"gpu07": [running]})
    job = make_job(tmp_path, scheduler)
    job.hooks(None).interrupted()
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "skipped" and record.reason.startswith("interrupted (Ctrl-C) while jobs still run: job 1234")
    assert [c[0] for c in scheduler.calls] == ["drain", "resume"]
    assert load(job.journal.path).data["status"] == "interrupted"


def test_ctrl_c_stops_a_host_between_steps_leaving_it_drained(tmp_path, steps, monkeypatch):
    scheduler = FakeScheduler()
    job = make_job(tmp_path, scheduler)
    real = RolloutJob._move

    def move(self, conn, record, state, detail, **fields):
        real(self, conn, record, state, detail, **fields)
        if state == "upgrading":
            self.stopping.set()              # Ctrl-C while the upgrade runs: it finishes its step

    monkeypatch.setattr(RolloutJob, "_move", move)
    with pytest.raises(GpuprovError, match="interrupted"):
        job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert steps.provision == ["plan", "never"] and scheduler.states["gpu07"].drained


def test_the_budget_counts_this_runs_failed_hosts_left_drained(tmp_path):
    journal = open_journal(tmp_path, {"hosts": ["a", "b"]}, ["a", "b"])
    journal.transition("a", "failed", "validating: x")
    scheduler = FakeScheduler(states={"a": NodeState("a", drained=True,
                                                     reason=f"gpuprov rollout {journal.run_id}: failed x")})
    hosts = [Host(name=n, address="192.0.2.1") for n in ("a", "b")]
    job = RolloutJob(RolloutOptions(), journal, scheduler, tmp_path, Budget(limit=1, shown="50% (1 host)"), hosts)
    with pytest.raises(GpuprovError, match="a \\(failed in this rollout, left drained\\)"):
        job._before_batch(2, [hosts[1]])


def test_preparing_writes_nothing(tmp_path, monkeypatch):
    prepared(tmp_path, monkeypatch, FakeScheduler(), ["gpu01", "gpu02"])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_second_rollout_on_a_host_in_use_stops_before_anything(tmp_path):
    from gpuprov.rollout.plan import _hosts_taken

    with _hosts_taken(tmp_path, ["gpu01", "gpu02"], dry_run=False), \
            pytest.raises(GpuprovError, match="another rollout runs on gpu02"), \
            _hosts_taken(tmp_path, ["gpu02", "gpu03"], dry_run=False):
        pass
    with _hosts_taken(tmp_path, ["gpu02"], dry_run=False):     # released at the end of the first
        pass


def test_hosts_of_different_schedulers_are_refused_unless_drain_says_which():
    from gpuprov.tasks.rollout import _drain_of

    hosts = [Host(name="a", address="192.0.2.1", vars={"scheduler": {"kind": "slurm"}}),
             Host(name="b", address="192.0.2.2")]
    with pytest.raises(InputError, match="different schedulers: none: b; slurm: a"):
        _drain_of(hosts)
    assert _drain_of(hosts[1:]) == "none"


def test_a_host_rolled_back_alone_gets_a_lock_of_its_own(tmp_path):
    from gpuprov.rollout.plan import _targets

    locks = tmp_path / "locks"
    (locks / "history").mkdir(parents=True)
    group = [Host(name=n, address="192.0.2.1", groups=["gpu"]) for n in ("gpu01", "gpu02")]
    (locks / "gpu.lock.yaml").write_text("x")
    (locks / "history" / "gpu.20261201T000000Z.lock.yaml").write_text("x")
    inventory = SimpleNamespace(hosts={h.name: h for h in group})
    journal = open_journal(tmp_path, {"hosts": ["gpu02"]}, ["gpu02"], dry_run=True)
    journal.data["target_lock"] = str(locks / "history" / "gpu.20261201T000000Z.lock.yaml")
    assert _targets(inventory, group[1:], locks, "previous", journal) == [
        (locks / "gpu02.lock.yaml", locks / "history" / "gpu.20261201T000000Z.lock.yaml")]
    assert _targets(inventory, group, locks, "previous", journal) == [
        (locks / "gpu.lock.yaml", locks / "history" / "gpu.20261201T000000Z.lock.yaml")]


def test_a_lifted_drain_is_waited_for_until_the_node_answers(tmp_path, steps):
    """Slurm shows a node whose drain was just lifted as not responding for a moment: the skip returns only once
    the node is back, so the next batch (and the operator) see it in service."""
    running = [Job("1234", "alice", "train", 600)]

    class Slow(FakeScheduler):
        answers = 0

        def resume(self, host):
            super().resume(host)
            self.states[host.name] = NodeState(host.name, down=True, state="mixed+not_responding")

        def nodes(self, hosts):
            if self.states.get("gpu07", NodeState("gpu07")).down:
                self.answers += 1
                if self.answers > 2:
                    self.states["gpu07"] = NodeState("gpu07", state="mixed")
            return super().nodes(hosts)

    scheduler = Slow(job_polls={"gpu07": [running]})
    job = make_job(tmp_path, scheduler, wait_s=0.01)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "skipped" and record.notices == []
    assert scheduler.nodes([GPU])["gpu07"].state == "mixed" and scheduler.answers == 3


def test_a_failed_host_whose_jobs_outlive_the_wait_stays_drained(tmp_path, steps):
    running = [Job("1234", "alice", "train", 600)]
    scheduler = FakeScheduler(job_polls={"gpu07": [running]},
                              states={"gpu07": NodeState("gpu07", drained=True,
                                                         reason="gpuprov rollout deadbeef-1: failed validating: x")})
    job = make_job(tmp_path, scheduler, wait_s=0.01)
    record = job.run_host(SimpleNamespace(host=GPU), lambda what: None)
    assert record.state == "skipped" and [c[0] for c in scheduler.calls] == ["drain"]
    assert scheduler.states["gpu07"].drained
