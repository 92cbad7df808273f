"""Fixtures the unit tests share (helpers they share are in helpers/)."""

from __future__ import annotations

import pytest
from helpers.tasks import FakeConnection


@pytest.fixture
def contacted(monkeypatch) -> list[str]:
    """Every host a task connects to (a FakeConnection each)."""
    calls: list[str] = []

    def connect(host, *args, **kwargs):
        calls.append(host.name)
        return FakeConnection(host)

    monkeypatch.setattr("gpuprov.executor.connect", connect)
    return calls
