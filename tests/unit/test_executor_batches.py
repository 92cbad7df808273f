"""Batches in the executor: Ansible's `serial` and `max_fail_percentage`, Salt's sliding window (`salt -b`), the
hooks and gate a rolling change runs between batches, and the flag text they come from.

Expected batch sizes are worked out by hand from Ansible's documented rules (Ansible docs, "Controlling playbook
execution: strategies and more", section "Setting the batch size with serial": a percentage is of the total
number of hosts in the play; "if the number of hosts does not divide equally into the number of passes, the final
pass contains the remainder"; "no matter how small the percentage, the number of hosts per pass will always be 1
or greater"; with a list, "any remaining hosts after the last batch will use the last value"; section "Setting a
maximum failure percentage": the play aborts when more than that percentage of the hosts in the current batch
fail; "the percentage set must be exceeded, not equaled"). Hosts are stand-ins (`contacted`): nothing leaves
this machine.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.core.batches import BatchHooks, BatchPlan, Size, batch_plan
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.executor import HookError, RunInterrupted, Settings, run_on_hosts
from gpuprov.inventory import Host


def hosts(count: int) -> list[Host]:
    return [Host(name=f"h{i:02d}", address="192.0.2.1") for i in range(count)]


def names(group) -> list[str]:
    return [host.name for host in group]


def sizes(serial: str, count: int) -> list[int]:
    return [len(group) for group in batch_plan(serial=serial).batches(hosts(count))]


def settings(tmp_path, parallel: int = 32, **flags) -> Settings:
    return Settings(known_hosts=tmp_path / "known_hosts", parallel=parallel, batches=batch_plan(**flags))


class Recorder:
    """Work that records when each host starts and ends, in one list shared by every worker."""

    def __init__(self, fail: set[str] = frozenset(), before_end=None):
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.fail = fail
        self.before_end = before_end

    def __call__(self, conn):
        name = conn.host.name
        with self.lock:
            self.events.append(("start", name))
        try:
            value = self.before_end(name) if self.before_end else None
            if name in self.fail:
                raise GpuprovError("upgrade failed", host=name)
            return value
        finally:
            with self.lock:
                self.events.append(("end", name))

    def position(self, kind: str, name: str) -> int:
        return self.events.index((kind, name))


# ------------------------------------------------------------------------------------------ batch sizes

@pytest.mark.parametrize(("serial", "count", "expected"), [
    # one host: any size is one batch of it (50% of 1 is 0.5, at least 1)
    ("5", 1, [1]), ("50%", 1, [1]), ("1,5,20%", 1, [1]), ("100%", 1, [1]),
    # 7 hosts: 3 a pass leaves 1; 30% of 7 = 2.1 -> 2; 50% = 3.5 -> 3; 10% = 0.7 -> 1 (at least 1)
    ("3", 7, [3, 3, 1]), ("30%", 7, [2, 2, 2, 1]), ("50%", 7, [3, 3, 1]), ("10%", 7, [1] * 7), ("100%", 7, [7]),
    ("20", 7, [7]),
    # a list: 1, then 5, then 20% of 7 = 1.4 -> 1 for the host left
    ("1,5,20%", 7, [1, 5, 1]), ("2,1", 7, [2, 1, 1, 1, 1, 1]),
    # 32 hosts: 10% = 3.2 -> 3 (ten passes of 3, the remainder 2); 25% = 8; 3% = 0.96 -> 1; 7 a pass leaves 4
    ("10%", 32, [3] * 10 + [2]), ("25%", 32, [8, 8, 8, 8]), ("3%", 32, [1] * 32), ("7", 32, [7, 7, 7, 7, 4]),
    # 1, 5, then 20% of 32 = 6.4 -> 6 for the 26 left: 6, 6, 6, 6 and the remainder 2
    ("1,5,20%", 32, [1, 5, 6, 6, 6, 6, 2]), ("1, 50%", 32, [1, 16, 15]),
])
def test_batch_sizes_follow_ansibles_rules(serial, count, expected):
    assert sizes(serial, count) == expected


@pytest.mark.parametrize(("window", "count", "expected"), [("3", 7, 3), ("25%", 7, 1), ("25%", 32, 8),
                                                            ("1%", 1, 1), ("100", 7, 100)])
def test_window_sizes(window, count, expected):
    assert batch_plan(window=window).window_size(count) == expected


def test_no_flags_is_no_plan_and_a_window_or_no_serial_is_one_batch():
    assert batch_plan() is None
    assert [names(group) for group in batch_plan(window="2").batches(hosts(3))] == [["h00", "h01", "h02"]]
    assert [len(group) for group in batch_plan(max_fail_percentage="10").batches(hosts(5))] == [5]
    assert BatchPlan().batches([]) == [] and batch_plan(serial="2").batches([]) == []


def expected_sizes(items: list[tuple[int, bool]], count: int) -> list[int]:
    """Ansible's _get_serialized_batches, transcribed: each size from the list in turn, the last repeating."""
    left, result = count, []
    while left > 0:
        value, percent = items[min(len(result), len(items) - 1)]
        size = max(value * count // 100, 1) if percent else value
        result.append(min(size, left))
        left -= result[-1]
    return result


SIZES = st.one_of(st.tuples(st.integers(1, 50), st.just(False)), st.tuples(st.integers(1, 100), st.just(True)))


@given(st.lists(SIZES, min_size=1, max_size=5), st.integers(0, 120))
def test_every_host_is_in_one_batch_in_order_with_the_declared_sizes(items, count):
    text = ",".join(f"{value}%" if percent else str(value) for value, percent in items)
    plan = batch_plan(serial=text)
    assert plan.serial == tuple(Size(percent=v) if p else Size(count=v) for v, p in items)
    groups = plan.batches(hosts(count))
    assert [host for group in groups for host in group] == hosts(count)
    assert [len(group) for group in groups] == expected_sizes(items, count)


# ------------------------------------------------------------------------------------------ flag text

@pytest.mark.parametrize(("flag", "text"), [
    ("--serial", "0"), ("--serial", "-1"), ("--serial", "0%"), ("--serial", "101%"), ("--serial", "nan"),
    ("--serial", "NaN%"), ("--serial", "inf"), ("--serial", "1.5"), ("--serial", "1e3"), ("--serial", "٣"),
    ("--serial", "²"), ("--serial", "５"), ("--serial", ""), ("--serial", " "), ("--serial", "5,"),
    ("--serial", "1,,2"), ("--serial", "%"), ("--serial", "+3"), ("--batch-window", "0"),
    ("--batch-window", "150%"), ("--batch-window", "2,3"), ("--batch-window", ""), ("--batch-window", "-2"),
    ("--max-fail-percentage", "101"), ("--max-fail-percentage", "-1"), ("--max-fail-percentage", "nan"),
    ("--max-fail-percentage", ""), ("--max-fail-percentage", "٥٠"), ("--max-fail-percentage", "1e2"),
    ("--max-fail-percentage", "100.5%"),
])
def test_bad_flag_text_is_an_input_error_naming_the_flag(flag, text):
    keyword = {"--serial": "serial", "--batch-window": "window", "--max-fail-percentage": "max_fail_percentage"}
    with pytest.raises(InputError) as caught:
        batch_plan(**{keyword[flag]: text})
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith(f"{flag} {text!r}: ")


def test_serial_and_window_together_are_refused():
    with pytest.raises(InputError, match="--serial and --batch-window were both given"):
        batch_plan(serial="2", window="2")


@pytest.mark.parametrize(("text", "expected"), [("0", 0.0), ("25", 25.0), ("25%", 25.0), ("33.5", 33.5),
                                                ("100%", 100.0)])
def test_max_fail_percentage_text(text, expected):
    assert batch_plan(max_fail_percentage=text).max_fail_percentage == expected


# ------------------------------------------------------------------------------------------ serial runs

def test_no_host_of_a_batch_starts_before_the_previous_batch_ends(tmp_path, contacted):
    barriers = {}
    for batch in (["h00", "h01", "h02"], ["h03", "h04", "h05"], ["h06"]):
        barrier = threading.Barrier(len(batch), timeout=5)   # a batch's hosts are in flight together
        barriers.update(dict.fromkeys(batch, barrier))
    work = Recorder(before_end=lambda name: barriers[name].wait())
    outcomes = run_on_hosts(hosts(7), work, settings(tmp_path, serial="3"))
    assert all(outcome.ok for outcome in outcomes)
    for first, second in ((["h00", "h01", "h02"], ["h03", "h04", "h05"]), (["h03", "h04", "h05"], ["h06"])):
        assert max(work.position("end", name) for name in first) < min(work.position("start", n) for n in second)


def test_hooks_run_around_each_batch_in_order(tmp_path, contacted):
    calls = []
    hooks = BatchHooks(before_batch=lambda index, group: calls.append(("before", index, names(group))),
                       after_batch=lambda index, group: calls.append(
                           ("after", index, [(o.host.name, o.ok) for o in group])),
                       gate=lambda so_far: calls.append(("gate", names(o.host for o in so_far))))
    run_on_hosts(hosts(5), Recorder(fail={"h03"}), settings(tmp_path, serial="1,2"), hooks=hooks)
    assert calls == [
        ("before", 1, ["h00"]), ("after", 1, [("h00", True)]), ("gate", ["h00"]),
        ("before", 2, ["h01", "h02"]), ("after", 2, [("h01", True), ("h02", True)]), ("gate", ["h00", "h01", "h02"]),
        ("before", 3, ["h03", "h04"]), ("after", 3, [("h03", False), ("h04", True)]),
        ("gate", ["h00", "h01", "h02", "h03", "h04"])]


def test_max_fail_percentage_stops_after_the_batch_that_exceeds_it(tmp_path, contacted):
    events = []
    outcomes = run_on_hosts(hosts(8), Recorder(fail={"h02"}), settings(tmp_path, serial="2", max_fail_percentage="49"),
                            on_event=lambda host, event: events.append((host.name, event)))
    assert contacted == ["h00", "h01", "h02", "h03"]     # batch 2 (h02, h03) ends whole, then the run stops
    assert [(o.host.name, o.ok, o.skipped) for o in outcomes[:4]] == [
        ("h00", True, False), ("h01", True, False), ("h02", False, False), ("h03", True, False)]
    for outcome in outcomes[4:]:
        assert outcome.skipped
        assert outcome.error.message == ("not started: 1 of 2 hosts failed in batch 2, more than "
                                         "--max-fail-percentage 49% allows")
        assert outcome.error.hint == "fix the failed hosts, then rerun"
    assert events[-4:] == [(f"h0{i}", "skipped") for i in range(4, 8)]


def test_max_fail_percentage_must_be_exceeded_not_equaled(tmp_path, contacted):
    outcomes = run_on_hosts(hosts(6), Recorder(fail={"h02"}), settings(tmp_path, serial="2", max_fail_percentage="50"))
    assert contacted == names(hosts(6)) and [o.ok for o in outcomes] == [True, True, False, True, True, True]


def test_max_fail_percentage_zero_stops_at_a_batch_with_one_failure(tmp_path, contacted):
    outcomes = run_on_hosts(hosts(6), Recorder(fail={"h00"}), settings(tmp_path, serial="3", max_fail_percentage="0"))
    assert contacted == ["h00", "h01", "h02"] and all(o.skipped for o in outcomes[3:])


def test_a_batch_where_every_host_failed_stops_the_run_as_in_ansible(tmp_path, contacted):
    outcomes = run_on_hosts(hosts(6), Recorder(fail={"h02", "h03"}), settings(tmp_path, serial="2"))
    assert contacted == ["h00", "h01", "h02", "h03"]
    assert outcomes[4].error.message == "not started: every host of batch 2 failed (2)"


def test_max_fail_still_counts_over_the_whole_run_inside_a_batch(tmp_path, contacted):
    after = []
    run = Settings(known_hosts=tmp_path / "kh", parallel=1, max_fail="0", batches=batch_plan(serial="3"))
    outcomes = run_on_hosts(hosts(6), Recorder(fail={"h00"}), run,
                            hooks=BatchHooks(after_batch=lambda index, group: after.append(
                                [(o.host.name, o.skipped) for o in group])))
    assert contacted == ["h00"]
    assert after == [[("h00", False), ("h01", True), ("h02", True)]]   # the batch's unstarted hosts, skipped
    assert outcomes[1].error.message == "not started: 1 hosts failed, more than --max-fail 0 allows"
    assert outcomes[5].error.message == outcomes[1].error.message


def test_the_gate_stops_the_run_with_its_reason(tmp_path, contacted):
    seen = []

    def gate(so_far):
        seen.append(len(so_far))
        return "GPU health below 90% after the upgrade" if len(so_far) == 4 else None

    outcomes = run_on_hosts(hosts(7), Recorder(), settings(tmp_path, serial="2"), hooks=BatchHooks(gate=gate))
    assert seen == [2, 4] and contacted == ["h00", "h01", "h02", "h03"]
    assert [o.skipped for o in outcomes] == [False] * 4 + [True] * 3
    assert outcomes[4].error.message == ("not started: stopped by the gate after batch 2: GPU health below 90% "
                                         "after the upgrade")


def test_a_before_batch_hook_that_raises_is_a_hook_error_with_every_outcome(tmp_path, contacted):
    def drain(index, group):
        if index == 2:
            raise RuntimeError("slurmctld did not answer")

    with pytest.raises(HookError) as caught:
        run_on_hosts(hosts(5), Recorder(), settings(tmp_path, serial="2"), hooks=BatchHooks(before_batch=drain))
    error = caught.value
    assert error.exit_code == 1 and error.step == "before_batch"
    assert error.message == "before_batch failed: internal error: RuntimeError: slurmctld did not answer"
    assert "Traceback" in error.output and "drain" in error.output
    assert contacted == ["h00", "h01"]
    assert [(o.host.name, o.ok, o.skipped) for o in error.outcomes] == [
        ("h00", True, False), ("h01", True, False), ("h02", False, True), ("h03", False, True), ("h04", False, True)]
    assert error.outcomes[2].error.message == "not started: before_batch failed"


def test_an_after_batch_hook_error_keeps_its_host_and_hint(tmp_path, contacted):
    def resume(index, group):
        raise GpuprovError("scontrol update state=resume failed", host=group[0].host.name, command="scontrol ...",
                           hint="resume the node by hand")

    with pytest.raises(HookError) as caught:
        run_on_hosts(hosts(4), Recorder(), settings(tmp_path, serial="2"), hooks=BatchHooks(after_batch=resume))
    error = caught.value
    assert (error.message, error.host, error.step, error.command, error.hint) == (
        "after_batch failed: scontrol update state=resume failed", "h00", "after_batch", "scontrol ...",
        "resume the node by hand")
    assert contacted == ["h00", "h01"] and [o.skipped for o in error.outcomes] == [False, False, True, True]


def test_a_gate_that_raises_stops_the_run(tmp_path, contacted):
    def gate(so_far):
        raise KeyError("health")

    with pytest.raises(HookError, match=r"gate failed: internal error: KeyError: 'health'") as caught:
        run_on_hosts(hosts(3), Recorder(), settings(tmp_path, serial="1"), hooks=BatchHooks(gate=gate))
    assert contacted == ["h00"] and [o.skipped for o in caught.value.outcomes] == [False, True, True]


def interrupt_main() -> None:
    """Ctrl-C: SIGINT delivered to the main thread, as the terminal does."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_ctrl_c_inside_a_batch_finishes_it_and_calls_no_more_hooks(tmp_path, contacted):
    after = []
    both = threading.Barrier(2, timeout=5)

    def behave(name):
        if name in ("h02", "h03"):
            both.wait()                 # h03 is in flight: no later start can race with the interrupt
            if name == "h02":
                time.sleep(0.3)         # the run is waiting for its hosts by now
                interrupt_main()
        return name

    with pytest.raises(RunInterrupted) as caught:
        run_on_hosts(hosts(6), Recorder(before_end=behave), settings(tmp_path, serial="2"),
                     hooks=BatchHooks(after_batch=lambda index, group: after.append(index)))
    outcomes = caught.value.outcomes
    assert [(o.host.name, o.ok) for o in outcomes[:4]] == [("h00", True), ("h01", True), ("h02", True), ("h03", True)]
    assert all(o.skipped and o.error.message == "not started: interrupted (Ctrl-C)" for o in outcomes[4:])
    assert after == [1] and contacted == ["h00", "h01", "h02", "h03"]


def test_without_a_plan_hooks_see_one_batch_of_every_host(tmp_path, contacted):
    calls = []
    hooks = BatchHooks(before_batch=lambda index, group: calls.append((index, names(group))),
                       after_batch=lambda index, group: calls.append((index, len(group))))
    outcomes = run_on_hosts(hosts(3), Recorder(), Settings(known_hosts=tmp_path / "kh"), hooks=hooks)
    assert calls == [(1, ["h00", "h01", "h02"]), (1, 3)] and all(o.ok for o in outcomes)


# ------------------------------------------------------------------------------------------ sliding window

class Flight:
    """Hosts in flight at once: each host waits (up to 5 s) until `full` hosts are in flight or no host is left
    to start, so that a window that lets more in is seen, and records the most ever in flight."""

    def __init__(self, total: int, full: int):
        self.total, self.full = total, full
        self.now = self.most = self.begun = 0
        self.cond = threading.Condition()

    def __call__(self, conn) -> int:
        with self.cond:
            self.now += 1
            self.begun += 1
            self.most = max(self.most, self.now)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.now >= self.full or self.begun == self.total, timeout=5)
            self.now -= 1
            self.cond.notify_all()
            return self.most


def test_a_window_never_has_more_than_its_size_in_flight(tmp_path, contacted):
    flight = Flight(total=10, full=3)
    outcomes = run_on_hosts(hosts(10), flight, settings(tmp_path, parallel=8, window="3"))
    assert flight.most == 3 and all(o.ok for o in outcomes) and len(contacted) == 10


def test_a_window_starts_a_host_as_soon_as_one_ends(tmp_path, contacted):
    h02_started = threading.Event()

    def behave(name):
        if name == "h02":
            h02_started.set()
        if name == "h00":
            return h02_started.wait(5)    # h01 ended; h02 starts while h00 is still in flight
        return True

    work = Recorder(before_end=behave)
    outcomes = run_on_hosts(hosts(3), work, settings(tmp_path, window="2"))
    assert [o.value for o in outcomes] == [True, True, True]
    assert work.position("start", "h02") < work.position("end", "h00")


def test_window_hooks_run_per_host_and_the_gate_after_each_host(tmp_path, contacted):
    calls = []
    hooks = BatchHooks(before_batch=lambda index, group: calls.append(("before", index, names(group))),
                       after_batch=lambda index, group: calls.append(("after", index, group[0].host.name)),
                       gate=lambda so_far: "stop" if len(so_far) == 2 else None)
    outcomes = run_on_hosts(hosts(4), Recorder(), settings(tmp_path, parallel=1, window="1"), hooks=hooks)
    assert calls == [("before", 1, ["h00"]), ("after", 1, "h00"), ("before", 2, ["h01"]), ("after", 2, "h01")]
    assert outcomes[2].error.message == ("not started: stopped by the gate after the window (the last 1 hosts to "
                                         "end): stop")


def test_window_max_fail_percentage_is_judged_over_the_last_window_of_hosts(tmp_path, contacted):
    # window 2, 50%: one failure among the last 2 hosts is 50% (not more); two are 100%
    outcomes = run_on_hosts(hosts(6), Recorder(fail={"h01", "h03", "h04"}),
                            settings(tmp_path, parallel=1, window="2", max_fail_percentage="50"))
    assert contacted == ["h00", "h01", "h02", "h03", "h04"]
    assert outcomes[5].error.message == ("not started: 2 of 2 hosts failed in the window (the last 2 hosts to "
                                         "end), more than --max-fail-percentage 50% allows")


def test_a_window_before_hook_error_starts_no_more_hosts(tmp_path, contacted):
    def drain(index, group):
        if index == 2:
            raise GpuprovError("scontrol drain refused", host=group[0].name)

    with pytest.raises(HookError, match="before_batch failed: scontrol drain refused") as caught:
        run_on_hosts(hosts(3), Recorder(), settings(tmp_path, parallel=1, window="1"),
                     hooks=BatchHooks(before_batch=drain))
    assert contacted == ["h00"] and [o.skipped for o in caught.value.outcomes] == [False, True, True]
