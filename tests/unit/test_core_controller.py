"""ControllerRunner with a fake SSH connection: a command whose link drops (or times out) is run again once on a new
connection, as rollout, inventory and health.deploy rely on; with retry=False (sbatch: not idempotent, a first
submission may have landed before the link failed) it is sent once and the failure raised."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuprov.core import executor, known_hosts
from gpuprov.core.controller import ControllerRunner
from gpuprov.core.errors import GpuprovError


class Link:
    """The connections opened, and every command sent on any of them; the first `drops` commands fail."""

    def __init__(self, drops: int):
        self.drops, self.sent, self.opened, self.closed = drops, [], 0, 0

    def connect(self, host, settings, known, jump=None):
        return self

    def open(self):
        self.opened += 1
        return self

    def close(self):
        self.closed += 1

    def run(self, command, sudo, timeout):
        self.sent.append((command, sudo))
        if self.drops:
            self.drops -= 1
            raise GpuprovError(f"command timed out after {timeout} s", host="ctl", command=command)
        return SimpleNamespace(rc=0, stdout="77\n", stderr="")


@pytest.fixture
def link(monkeypatch):
    def make(drops: int) -> tuple[Link, ControllerRunner]:
        fake = Link(drops)
        monkeypatch.setattr(executor, "connect", fake.connect)
        monkeypatch.setattr(known_hosts, "read_known_hosts", lambda path: None)
        host = SimpleNamespace(name="ctl", user="admin")
        return fake, ControllerRunner(host, SimpleNamespace(known_hosts="/nonexistent"))

    return make


def test_a_dropped_link_is_reconnected_and_the_command_run_again_once(link):
    fake, runner = link(1)
    assert runner(["squeue", "-h", "-j", "77"], True) == (0, "77\n", "")
    assert fake.sent == [("squeue -h -j 77", True)] * 2 and fake.opened == 2


def test_a_link_that_drops_twice_raises(link):
    fake, runner = link(2)
    with pytest.raises(GpuprovError):
        runner(["squeue"], True)
    assert len(fake.sent) == 2


def test_without_retry_a_command_is_sent_once_and_the_failure_raised(link):
    fake, runner = link(1)
    with pytest.raises(GpuprovError) as caught:
        runner(["sbatch", "--parsable", "--wrap", "true"], True, retry=False)
    assert "timed out" in caught.value.message
    assert fake.sent == [("sbatch --parsable --wrap true", True)] and fake.closed == 1
    # the next command opens a new connection
    assert runner(["squeue"], True, retry=False) == (0, "77\n", "") and fake.opened == 2
