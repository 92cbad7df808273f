"""Shared test helpers."""

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixture_text():
    """Read a captured command output from tests/fixtures/ (real outputs, provenance in its README)."""

    def read(relative: str) -> str:
        return (FIXTURES / relative).read_text()

    return read


@pytest.fixture(autouse=True)
def own_secrets(monkeypatch):
    """Each test masks only the secrets it registers itself (gpuprov.core.secrets keeps one registry per process,
    which a test's `pw` would otherwise turn into a mask over every later test's output)."""
    from gpuprov.core import secrets

    monkeypatch.setattr(secrets, "_values", set())
    monkeypatch.setattr(secrets, "_pattern", None)
