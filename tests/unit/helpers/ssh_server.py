"""A local SSH server (paramiko's) for connection tests: its host key, and what a ServerInterface lets in."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import paramiko


@contextmanager
def serve_ssh(host_key: paramiko.PKey, server: paramiko.ServerInterface) -> Iterator[tuple[int, list]]:
    """Listen on 127.0.0.1 with `host_key`, each connection judged by `server`; yields (port, transports)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    transports: list = []

    def serve():
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(client)
            transport.add_server_key(host_key)
            transports.append(transport)
            with suppress(paramiko.SSHException, EOFError, OSError):
                transport.start_server(server=server)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], transports
    finally:
        listener.close()
        for transport in transports:
            transport.close()
