"""Fixtures the unit tests share (helpers they share are in helpers/)."""

from __future__ import annotations

import pytest
from helpers.local_host import LocalConn


@pytest.fixture
def contacted(monkeypatch) -> list[str]:
    """Every host a task connects to (a LocalConn each, answering every command with nothing)."""
    calls: list[str] = []

    def connect(host, *args, **kwargs):
        calls.append(host.name)
        return LocalConn(host, answer=lambda command, stdin: "")

    monkeypatch.setattr("gpuprov.core.executor.connect", connect)
    return calls
