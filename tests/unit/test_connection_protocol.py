"""One Connection protocol (gpuprov.core.connection.Connection): the SSH connection the product uses and the local
one the tests use answer it alike, method by method, so a test host cannot drift from what a real host offers."""

from __future__ import annotations

import inspect

from helpers.local_host import LocalConn

from gpuprov.core.connection import Connection, HostConnection

METHODS = [name for name, value in vars(Connection).items() if callable(value) and not name.startswith("_")]


def test_the_protocol_names_what_host_jobs_ask_of_a_host():
    assert sorted(METHODS) == ["close", "fresh", "open", "open_tunnel", "run", "server_key_type", "sftp"]


def test_the_local_connection_is_a_connection():
    assert isinstance(LocalConn(), Connection)


def test_both_implementations_take_the_protocols_arguments():
    for name in METHODS:
        wanted = inspect.signature(getattr(Connection, name)).parameters
        for implementation in (HostConnection, LocalConn):
            got = inspect.signature(getattr(implementation, name)).parameters
            assert list(got) == list(wanted), (implementation.__name__, name, list(got))
            assert [p.kind for p in got.values()] == [p.kind for p in wanted.values()], (implementation.__name__, name)
