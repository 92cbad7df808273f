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
