"""The Docker engine's HTTP API over its Unix socket, for what a build needs: ping, inspect and tag an image, and
build a context whose files the kernel sends (sendfile(2)).

Where the engine listens on a Unix socket (DOCKER_HOST unset or unix://), images.build talks to it here: no Docker
SDK to import (requests, urllib3 and paramiko with it) and no copy of the context's 250 MB of wheels through
Python, so a no-change rebuild costs about what `docker build`'s does. The request is the SDK's own (`APIClient.
build`): the same archive, parameters and labels, the proxies of the Docker config file as build arguments, and
the registry credentials as X-Registry-Config (made by the SDK's own docker.auth, imported only where the config
file holds credentials). Any other DOCKER_HOST (tcp, ssh, TLS) goes through the SDK (gpuprov.images.build).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

from gpuprov.core.errors import GpuprovError

DEFAULT_SOCKET = "/var/run/docker.sock"
PROXIES = {"httpProxy": ("http_proxy", "HTTP_PROXY"), "httpsProxy": ("https_proxy", "HTTPS_PROXY"),
           "ftpProxy": ("ftp_proxy", "FTP_PROXY"), "noProxy": ("no_proxy", "NO_PROXY")}
CREDENTIALS = ("auths", "credsStore", "credHelpers")


def socket_path(environ=os.environ) -> str | None:
    """The engine's Unix socket as the SDK's from_env finds it (None: DOCKER_HOST names something else)."""
    host = environ.get("DOCKER_HOST", "").strip()
    if not host:
        return DEFAULT_SOCKET
    if host.startswith("unix://") and len(host) > len("unix://"):
        return host[len("unix://"):]
    return None


class EngineRefused(Exception):
    """The engine answered with an error status; `explanation` is its message (as the SDK's APIError has)."""

    def __init__(self, status: int, explanation: str):
        super().__init__(f"{status}: {explanation}")
        self.status, self.explanation = status, explanation


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class SocketEngine:
    """The engine's API on the Unix socket `path`, a connection per request (so builds may run in threads); the
    timeout bounds each wait for the engine, the next item of a build's stream included."""

    def __init__(self, path: str, timeout: float = 3600):
        self.path, self.timeout = path, timeout

    def ping(self) -> None:
        """OSError or EngineRefused unless the engine answers."""
        self._call("GET", "/_ping")

    def inspect_image(self, reference: str) -> dict:
        """The engine's inspection of an image (EngineRefused 404 when it has none of that name)."""
        return json.loads(self._call("GET", f"/images/{quote(reference, safe='/:')}/json"))

    def tag(self, image: str, repository: str, tag: str, force: bool = True) -> bool:
        """Tag `image` as repository:tag (the SDK's signature; the engine replaces an existing tag)."""
        query = urlencode({"repo": repository, "tag": tag, "force": int(force)})
        self._call("POST", f"/images/{quote(image, safe='/:')}/tag?{query}")
        return True

    def build(self, parts: list, size: int, *, tag: str, labels: dict[str, str], nocache: bool = False
              ) -> Iterator[dict]:
        """Build the context archive made of `parts` (`size` bytes in all): bytes, and (path, count) for the first
        count bytes of a file, sent by the kernel. Yields the engine's build stream, decoded; GpuprovError when a
        file cannot be sent whole, EngineRefused when the engine refuses the build."""
        params = {"t": tag, "q": 0, "nocache": int(nocache), "rm": 1, "forcerm": 1, "pull": 0,
                  "labels": json.dumps(labels)}
        build_args = proxy_build_args()
        if build_args:
            params["buildargs"] = json.dumps(build_args)
        headers = {"Content-Type": "application/tar", "Content-Length": str(size), **registry_headers()}
        connection = _UnixConnection(self.path, self.timeout)
        try:
            connection.putrequest("POST", f"/build?{urlencode(params)}", skip_accept_encoding=True)
            for key, value in headers.items():
                connection.putheader(key, value)
            connection.endheaders()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):   # the engine stopped reading:
                _send(connection.sock, parts)                                   # its answer says why
            response = connection.getresponse()
            if response.status >= 400:
                raise EngineRefused(response.status, _message(response.read()))
            for line in response:
                if line.strip():
                    yield json.loads(line)
        finally:
            connection.close()

    def _call(self, method: str, path: str) -> bytes:
        connection = _UnixConnection(self.path, self.timeout)
        try:
            connection.request(method, path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status >= 400:
            raise EngineRefused(response.status, _message(body))
        return body


def _send(sock: socket.socket, parts: list) -> None:
    """The parts, bytes gathered up to a file's data, the file's data by sendfile(2)."""
    pending = bytearray()
    for part in parts:
        if isinstance(part, (bytes, bytearray)):
            pending += part
            continue
        if pending:
            sock.sendall(pending)
            pending.clear()
        path, count = part
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below; only its opening is the file's error
        except OSError as exc:
            raise GpuprovError(f"cannot send {path} to the engine: {exc.strerror or exc}", step="build context",
                               hint="render the image again (invoke images.render --name ...), then build "
                                    "it") from None
        with handle:
            sent = sock.sendfile(handle, 0, count) if count else 0
        if sent != count:
            raise GpuprovError(f"cannot send {path} to the engine: it shrank to {sent} bytes while it was sent",
                               step="build context", hint="render the image again (invoke images.render --name "
                                                          "...), then build it")
    if pending:
        sock.sendall(pending)


def _message(body: bytes) -> str:
    """The engine's error message ({"message": ...}), else its answer as text."""
    text = body.decode(errors="replace").strip()
    try:
        found = json.loads(text)
    except ValueError:
        return text
    return str(found.get("message") or text) if isinstance(found, dict) else text


def config_file() -> Path | None:
    """The Docker client's config file, the first that exists of those the SDK looks for: DOCKER_CONFIG/config.json,
    ~/.docker/config.json and the legacy ~/.dockercfg (credentials only)."""
    folder = os.environ.get("DOCKER_CONFIG")
    home = Path.home()
    paths = ([Path(folder) / "config.json"] if folder else []) + [home / ".docker" / "config.json", home / ".dockercfg"]
    return next((path for path in paths if path.exists()), None)


def docker_config(path: Path | None) -> dict:
    """The config file's settings; {} when there is none, or it is not a JSON object (as the SDK reads it)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8")) if path else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def proxy_build_args(config: dict | None = None) -> dict[str, str]:
    """The proxies of the config file (`proxies.default`) as the build arguments the SDK and the docker CLI give."""
    config = config if config is not None else docker_config(config_file())
    proxies = (config.get("proxies") or {}).get("default") or {}
    return {name: str(proxies[key]) for key, names in PROXIES.items() if proxies.get(key) for name in names}


_AUTH_LOCK = threading.Lock()


def registry_headers() -> dict[str, str]:
    """X-Registry-Config with every credential of the Docker config, as the SDK's build sends it (so that the engine
    can pull a base from a private registry); none when the config file holds none (the SDK is not imported)."""
    path = config_file()
    legacy = path is not None and path.name == ".dockercfg"     # credentials, nothing else
    if not legacy and not any(docker_config(path).get(key) for key in CREDENTIALS):
        return {}
    with _AUTH_LOCK:    # credential helpers run as processes: one build thread at a time
        from docker import auth

        found = auth.load_config().get_all_credentials()
    if auth.INDEX_URL not in found and auth.INDEX_NAME in found:
        found[auth.INDEX_URL] = found.get(auth.INDEX_NAME, {})
    return {"X-Registry-Config": auth.encode_header(found).decode()} if found else {}
