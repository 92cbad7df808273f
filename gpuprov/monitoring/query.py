"""Prometheus's HTTP API (/api/v1/...): directly at a URL, or through the monitoring host's SSH connection to its
port 9090 on its monitoring address (Prometheus behind a bastion or a firewall needs no port opened for the
controller)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from gpuprov.core.errors import GpuprovError
from gpuprov.monitoring.policy import PROMETHEUS_PORT, build_policy

Fetch = Callable[[str], bytes]   # path with query string -> response body


class Prometheus:
    """The few API calls gpuprov makes; every error names what was asked and where."""

    def __init__(self, fetch: Fetch, where: str):
        self.fetch = fetch
        self.where = where

    def _get(self, path: str, **params) -> object:
        url = f"/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            body = json.loads(self.fetch(url))
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise GpuprovError(f"Prometheus at {self.where} did not answer {url}: {exc}", step="prometheus",
                               hint="check that Prometheus runs there (invoke monitoring.server) and is reachable"
                               ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else body
            raise GpuprovError(f"Prometheus at {self.where} refused {url}: {error}", step="prometheus",
                               hint="check the query")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant vector: [{"metric": {labels}, "value": float}]."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self._get("query", **params)
        if data.get("resultType") == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": item["metric"], "value": float(item["value"][1])} for item in data["result"]]

    def alerts(self) -> list[dict]:
        return self._get("alerts")["alerts"]

    def targets(self) -> list[dict]:
        return self._get("targets", state="active")["activeTargets"]

    def wait_for(self, what: str, test: Callable[[], bool], timeout: float, every: float = 1.0) -> None:
        """Poll `test` until it holds; GpuprovError naming `what` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not test():
            if time.monotonic() > deadline:
                raise GpuprovError(f"Prometheus at {self.where}: {what} did not happen within {timeout:g} s",
                                   step="prometheus")
            time.sleep(every)


def at_url(url: str, timeout: float = 30) -> Prometheus:
    """Prometheus at a URL the controller reaches (http://host:9090)."""
    base = url.rstrip("/")

    def fetch(path: str) -> bytes:
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:   # Prometheus answers a bad query with 400 and a JSON error
            return exc.read()

    return Prometheus(fetch, base)


def through_ssh(conn, timeout: float = 30) -> Prometheus:
    """Prometheus on the connected host, reached through its SSH connection at the host's monitoring address and
    port 9090, where gpuprov's Prometheus listens (and nowhere else: not on 127.0.0.1). The request is HTTP/1.0, so
    the answer is the bytes up to the end of the stream (never chunked)."""
    policy = build_policy(conn.host)
    listen = policy.prometheus_listen

    def fetch(path: str) -> bytes:
        import paramiko

        try:
            channel = conn.open_tunnel(PROMETHEUS_PORT, policy.address)
        except paramiko.SSHException as exc:   # the host refused the tunnel: nothing listens there
            reason = getattr(exc, "text", "") or str(exc)
            raise ConnectionError(f"the SSH tunnel to {listen} was refused ({reason})") from None
        channel.settimeout(timeout)
        try:
            channel.sendall(f"GET {path} HTTP/1.0\r\nHost: {listen}\r\n\r\n".encode())
            data = bytearray()
            while chunk := channel.recv(65536):
                data += chunk
        finally:
            channel.close()
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or not status[0].startswith(b"HTTP/"):
            raise http.client.HTTPException(f"not an HTTP answer: {head[:80]!r}")
        return body

    return Prometheus(fetch, f"{conn.host.name} ({listen} through SSH)")
