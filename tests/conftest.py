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
def no_users_ssh_config(monkeypatch):
    """No test reads the ~/.ssh/config of whoever runs it (gpuprov.ssh_config's default): a `Host *` there would
    change the lab's connections. A test that wants one names it (INVOKE_GPUPROV_SSH_CONFIG, apply_ssh_config)."""
    monkeypatch.setenv("INVOKE_GPUPROV_SSH_CONFIG", "")


@pytest.fixture(autouse=True)
def own_secrets(monkeypatch):
    """Each test masks only the secrets it registers itself (gpuprov.core.secrets keeps one registry per process,
    which a test's `pw` would otherwise turn into a mask over every later test's output)."""
    from gpuprov.core import secrets

    monkeypatch.setattr(secrets, "_values", set())
    monkeypatch.setattr(secrets, "_pattern", None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Two queues for `pytest -n 2 --dist loadgroup` (the README's test command): the tests that use the Docker
    engine (markers lab and docker, or a test's own xdist_group) in order on one worker, every other test on the
    other. The lab's fleets then never run side by side, and the unit tests run while the lab waits on its hosts."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            engine = item.get_closest_marker("lab") or item.get_closest_marker("docker")
            item.add_marker(pytest.mark.xdist_group("engine" if engine else "unit"))
