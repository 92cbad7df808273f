"""A monitored host as the monitoring jobs' tests run it: a connection that answers the commands monitoring.deploy,
monitoring.server and monitoring.targets --server send (the address check, the textfile folder's state, the facts
script, the apply batch, the exporters' probe) from what the test says the host is, and records what it was sent."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

from gpuprov.core.connection import Result
from helpers.local_host import LocalConn

BARE_DEBIAN = {"os": {"family": "debian", "key": "debian-12"}, "packages": {}, "held": [], "services": {},
               "files": {}, "containers": []}
STEP_START = re.compile(r"@@gpuprov:step (\d+) start")


class MonitoredHost(LocalConn):
    """The tests' local connection answering as a Debian host that resolves its monitoring address to `own` (its
    own addresses found there), whose exporters print `metrics` ({exporter: lines of its metrics}), whose apply
    batch fails at step `fail_step` (None: every step succeeds) and whose facts are `facts`. `sent` names each
    command it answered: address, textfile, facts, apply, probe; `on_probe` runs when the exporters are read."""

    def __init__(self, host, *, own: tuple[str, ...] | None = None, metrics: dict[str, int] | None = None,
                 fail_step: int | None = None, facts: dict | None = None, on_probe: Callable[[], None] = lambda: None):
        super().__init__(host, answer=self._route)
        self.own = (host.vars.get("monitoring_address") or host.address,) if own is None else own
        self.metrics = {"node-exporter": 12} if metrics is None else metrics
        self.fail_step = fail_step
        self.facts = copy.deepcopy(BARE_DEBIAN if facts is None else facts)
        self.on_probe = on_probe
        self.sent: list[str] = []
        self.batches: list[str] = []

    def _route(self, command: str, stdin: str | None) -> Result:
        if "getent ahosts" in command:
            return self._answer("address", command, "".join(f"{a}\n" for a in self.own))
        if "dpkg-statoverride --list" in command:
            return self._answer("textfile", command, "folder=\npackage_dir=\noverride=\n")
        if command == "sh -s" and stdin and stdin.startswith("fetch() {"):
            self.on_probe()
            return self._answer("probe", command, "".join(f"{name} {n}\n" for name, n in self.metrics.items()))
        if command == "sh -s" and stdin and STEP_START.search(stdin):
            self.batches.append(stdin)
            return self._batch(command, len(STEP_START.findall(stdin)))
        if command == "sh -s":
            return self._answer("facts", command, "")
        raise AssertionError(f"{self.host.name}: a command the monitored host does not expect: {command}")

    def _answer(self, what: str, command: str, stdout: str, rc: int = 0) -> Result:
        self.sent.append(what)
        return Result(command, rc, stdout, "", 0.0)

    def _batch(self, command: str, steps: int) -> Result:
        out = ""
        for index in range(steps):
            out += f"@@gpuprov:step {index} start 100.0\n"
            if index == self.fail_step:
                out += f"E: step {index} broke\n@@gpuprov:step {index} rc=100 100.5\n"
                return self._answer("apply", command, out, rc=100)
            out += f"@@gpuprov:step {index} rc=0 100.5\n"
        return self._answer("apply", command, out + "@@gpuprov-batch:facts\n")


def answer_facts(monkeypatch) -> None:
    """The facts a MonitoredHost's facts script (and its apply batch's tail) prints are its `facts`."""
    monkeypatch.setattr("gpuprov.facts.gather.parse_gathered", lambda conn, stdout, stderr: copy.deepcopy(conn.facts))
