"""The fleet runtime every host job runs on (gpuprov.core.runtime): the per-host template, the failed host's entry,
the report, Ctrl-C, a stopped batch run and the one exit-code policy. Hosts are stand-ins (`contacted`): nothing
leaves this machine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from gpuprov.core.batches import BatchHooks, batch_plan
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.executor import RunInterrupted, Settings
from gpuprov.core.operations import Change
from gpuprov.core.runtime import Fleet, HostJob, HostRecord, exit_code, run_fleet
from gpuprov.inventory import Host

HOSTS = [Host(name=f"gpu{i:02d}", address="192.0.2.1") for i in range(1, 5)]


class Inventory:
    @staticmethod
    def jump_host(host):
        return None


@dataclass
class CountingRecord(HostRecord):
    applied: list = field(default_factory=list)

    def details(self) -> dict:
        return {"applied": self.applied}


class CountingJob(HostJob):
    """Plans one change per host; `behave` decides per host what its steps do."""

    kind = "counting"

    def __init__(self, dry_run: bool = False, behave=None, held=()):
        super().__init__(dry_run)
        self.behave = behave or {}
        self.held = set(held)
        self.calls: list[tuple[str, str]] = []

    def new_record(self, host) -> CountingRecord:
        return CountingRecord(host.name)

    def gather(self, conn, record):
        self.calls.append((record.host, "gather"))
        action = self.behave.get(record.host)
        if action is not None:
            action()
        return {"os": {"family": "debian"}}

    def plan(self, conn, record):
        self.calls.append((record.host, "plan"))
        changes = [Change("thing", f"set the thing on {record.host}", ("true",))]
        record.plan = [{"component": c.component, "summary": c.summary} for c in changes]
        return changes

    def apply(self, conn, record, changes):
        self.calls.append((record.host, "apply"))
        record.applied = [c.summary for c in changes]
        if record.host in self.held:
            record.notices.append("held back")
            raise GpuprovError("the step failed", host=record.host, step="apply", command="true")

    def verify(self, conn, record, say):
        self.calls.append((record.host, "verify"))

    def failing(self, entry: dict) -> bool:
        return "still wrong" in entry["notices"]


def fleet(tmp_path, hosts=HOSTS, **flags) -> Fleet:
    settings = Settings(known_hosts=tmp_path / "known_hosts", batches=batch_plan(**flags) if flags else None)
    return Fleet(Inventory(), list(hosts), settings, tmp_path / "reports", quiet=True)


def report(tmp_path) -> dict:
    return json.loads((tmp_path / "reports" / "counting-latest.json").read_text())


def test_a_dry_run_plans_on_every_host_and_applies_nothing(tmp_path, contacted, capsys):
    job = CountingJob(dry_run=True)
    assert run_fleet(fleet(tmp_path), job) == 0
    assert sorted(contacted) == [h.name for h in HOSTS]
    assert {step for _, step in job.calls} == {"gather", "plan"}
    entries = report(tmp_path)["hosts"]
    assert [e["status"] for e in entries] == ["planned"] * 4 and report(tmp_path)["dry_run"] is True
    printed = json.loads(capsys.readouterr().out)
    assert printed["report"].endswith(".json") and [e["host"] for e in printed["hosts"]] == [h.name for h in HOSTS]


def test_a_real_run_applies_then_verifies_and_reports_the_job_fields(tmp_path, contacted):
    job = CountingJob()
    assert run_fleet(fleet(tmp_path), job) == 0
    assert [step for host, step in job.calls if host == "gpu01"] == ["gather", "plan", "apply", "verify"]
    entry = report(tmp_path)["hosts"][0]
    assert entry["status"] == "changed" and entry["applied"] == ["set the thing on gpu01"]
    assert entry["facts_before"] == {"os": {"family": "debian"}}


def test_a_failed_host_keeps_what_it_did_and_the_others_finish(tmp_path, contacted):
    job = CountingJob(held={"gpu02"})
    assert run_fleet(fleet(tmp_path), job) == 1
    entries = {e["host"]: e for e in report(tmp_path)["hosts"]}
    failed = entries["gpu02"]
    assert failed["status"] == "failed" and failed["error"]["step"] == "apply"
    assert failed["applied"] == ["set the thing on gpu02"] and failed["notices"] == ["held back"]
    assert {entries[name]["status"] for name in ("gpu01", "gpu03", "gpu04")} == {"changed"}


def test_bad_input_on_every_failed_host_is_exit_2(tmp_path, contacted):
    def bad():
        raise InputError("not a valid value", host="gpu01", step="facts")

    assert run_fleet(fleet(tmp_path), CountingJob(behave={"gpu01": bad})) == 2


def test_a_gpuprov_bug_on_one_host_is_that_hosts_failure(tmp_path, contacted):
    def bug():
        raise KeyError("surprise")

    assert run_fleet(fleet(tmp_path), CountingJob(behave={"gpu03": bug})) == 1
    entry = report(tmp_path)["hosts"][2]
    assert entry["status"] == "failed" and "internal error: KeyError" in entry["error"]["error"]


def test_ctrl_c_writes_the_report_of_what_completed_and_exits_130(tmp_path, contacted, monkeypatch, capsys):
    job = CountingJob()

    def interrupted(hosts, work, settings, **kwargs):
        from gpuprov.core.executor import Outcome

        done = Outcome(hosts[0], value=CountingRecord(hosts[0].name, status="changed"))
        rest = [Outcome(h, skipped=True, error=GpuprovError("not started: interrupted (Ctrl-C)", host=h.name))
                for h in hosts[1:]]
        raise RunInterrupted([done, *rest])

    monkeypatch.setattr("gpuprov.core.executor.run_on_hosts", interrupted)
    assert run_fleet(fleet(tmp_path), job) == 130
    written = report(tmp_path)
    assert written["interrupted"] is True
    assert [e["status"] for e in written["hosts"]] == ["changed", "skipped", "skipped", "skipped"]
    assert "interrupted (Ctrl-C)" in capsys.readouterr().err


def test_a_host_not_where_asked_is_exit_1_without_a_failure(tmp_path, contacted):
    class StillWrong(CountingJob):
        def verify(self, conn, record, say):
            record.notices.append("still wrong")

    assert run_fleet(fleet(tmp_path), StillWrong()) == 1


def test_a_gate_that_stops_the_run_reports_every_host_and_exits_1(tmp_path, contacted, capsys):
    class Gated(CountingJob):
        def hooks(self, fleet):
            return BatchHooks(gate=lambda outcomes: "the cluster is short of nodes" if len(outcomes) >= 2 else None)

    assert run_fleet(fleet(tmp_path, serial="2"), Gated()) == 1
    entries = report(tmp_path)["hosts"]
    assert [e["status"] for e in entries] == ["changed", "changed", "skipped", "skipped"]
    assert "the cluster is short of nodes" in entries[2]["error"]["error"]


def test_a_hook_that_raises_is_reported_and_exits_1(tmp_path, contacted, capsys):
    class Broken(CountingJob):
        def hooks(self, fleet):
            def drain(index, hosts):
                if index == 2:
                    raise GpuprovError("scontrol update failed", step="drain", command="scontrol update ...")
            return BatchHooks(before_batch=drain)

    assert run_fleet(fleet(tmp_path, serial="2"), Broken()) == 1
    written = report(tmp_path)
    assert "scontrol update failed" in written["stopped"]["error"]
    assert [e["status"] for e in written["hosts"]][:2] == ["changed", "changed"]
    assert "scontrol update failed" in capsys.readouterr().err


@pytest.mark.parametrize(("interrupted", "stopped", "errors", "code"), [
    (True, False, [None], 130),
    (False, True, [None], 1),
    (False, False, [InputError("x"), InputError("y")], 2),
    (False, False, [InputError("x"), GpuprovError("y")], 1),
    (False, False, [None, None], 0),
])
def test_the_exit_code_policy(interrupted, stopped, errors, code):
    from gpuprov.core.executor import Outcome

    outcomes = [Outcome(h, error=e) for h, e in zip(HOSTS[:len(errors)], errors, strict=True)]
    entries = [{"host": h.name, "notices": []} for h in HOSTS[:len(errors)]]
    assert exit_code(CountingJob(), outcomes, entries, interrupted, stopped) == code


def test_every_host_job_reads_only_declared_variables():
    """Each job names the variables it reads, and each is declared in a capability's variables.py (the loader
    checks it there): a job cannot read a variable nobody checks."""
    import importlib

    from gpuprov.inventory.variables import registry

    for module in ("gpuprov.provision.run", "gpuprov.harden.run", "gpuprov.monitoring.deploy",
                   "gpuprov.validation.host", "gpuprov.images.run_job"):
        importlib.import_module(module)
    jobs = [job for job in _subclasses(HostJob)           # the jobs themselves, not a capability's shared base
            if job.__module__.startswith("gpuprov.") and not job.__subclasses__()]
    declared = {name.split(".")[0] for name in registry()}
    assert len(jobs) >= 7
    for job in jobs:
        assert job.variables, f"{job.__name__} declares no variables"
        assert set(job.variables) <= declared, f"{job.__name__}: {set(job.variables) - declared} are not declared"


def _subclasses(cls) -> list[type]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]
