"""Logging in (gpuprov.core.connection): private keys in every format OpenSSH's ssh-keygen writes (OpenSSH, `-m PEM`,
`-m PKCS8`) log in; a refused, unreadable or passphrase-protected key is an authentication error (exit 1), never
retried as a network error; a host covered only by a known_hosts `@cert-authority` line is refused, naming the
line; connect retries stop at the first Ctrl-C.

The keys are made by the real `ssh-keygen`; the server is paramiko's, in a thread, letting in only the public
half ssh-keygen wrote (`KEY.pub`), and counting the connections it is offered."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest
from helpers.ssh_server import serve_ssh

from gpuprov.core.connection import ConnectError, HostConnection, HostKeyError, KeyFileError
from gpuprov.core.known_hosts import read_known_hosts
from gpuprov.inventory import Host

pytestmark = [pytest.mark.tool,
              pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")]


def keygen(path: Path, kind: str, fmt: str | None = None, passphrase: str = "") -> Path:
    """A private key written by `ssh-keygen -t KIND [-m FMT] -N PASSPHRASE`; its public half beside it."""
    command = ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", "", "-f", str(path)]
    subprocess.run(command + (["-m", fmt] if fmt else []), check=True, capture_output=True)
    return path


def host_key(tmp_path: Path) -> paramiko.PKey:
    return paramiko.Ed25519Key.from_private_key_file(str(keygen(tmp_path / "host_key", "ed25519")))


class _Allow(paramiko.ServerInterface):
    def __init__(self, allowed: str):
        self.allowed = allowed

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL if f"{key.get_name()} {key.get_base64()}" == self.allowed \
            else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED


def ssh_server(server_key: paramiko.PKey, allowed: str):
    """A local SSH server letting in the public key `allowed` (`TYPE BASE64`); yields (port, connections)."""
    return serve_ssh(server_key, _Allow(allowed))


def known(tmp_path: Path, port: int, key: paramiko.PKey, marker: str = "") -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(f"{marker}[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}\n")
    return path


def public(path: Path) -> str:
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def login(tmp_path: Path, identity: Path, allowed: Path, retries: int = 2) -> tuple[HostConnection, list]:
    server_key = host_key(tmp_path)
    with ssh_server(server_key, public(allowed)) as (port, transports):
        host = Host(name="gpu01", address="127.0.0.1", port=port, user="root", identity_file=str(identity))
        conn = HostConnection(host, known_hosts=read_known_hosts(known(tmp_path, port, server_key)),
                              retries=retries)
        try:
            conn.open()
            assert conn._conn.transport.is_authenticated()
        finally:
            conn.close()
        return conn, transports


@pytest.mark.parametrize(("kind", "fmt", "header"), [
    ("rsa", "PEM", "-----BEGIN RSA PRIVATE KEY-----"),
    ("ecdsa", "PEM", "-----BEGIN EC PRIVATE KEY-----"),
    ("rsa", "PKCS8", "-----BEGIN PRIVATE KEY-----"),
    ("ecdsa", "PKCS8", "-----BEGIN PRIVATE KEY-----"),
    ("ed25519", None, "-----BEGIN OPENSSH PRIVATE KEY-----"),
    ("ecdsa", None, "-----BEGIN OPENSSH PRIVATE KEY-----"),
])
def test_keys_in_each_format_ssh_keygen_writes_log_in(tmp_path, kind, fmt, header):
    identity = keygen(tmp_path / "id", kind, fmt)
    assert identity.read_text().splitlines()[0] == header   # the format asked for, as ssh-keygen wrote it
    _, transports = login(tmp_path, identity, identity)
    assert len(transports) == 1


def test_a_refused_pem_key_is_an_authentication_error_not_retried(tmp_path):
    identity = keygen(tmp_path / "id_ecdsa", "ecdsa", "PEM")
    other = keygen(tmp_path / "other", "ed25519")
    with pytest.raises(ConnectError) as raised:
        login(tmp_path, identity, other, retries=3)
    assert not isinstance(raised.value, KeyFileError)
    assert raised.value.message == "authentication failed as root: Authentication failed."
    assert raised.value.exit_code == 1
    assert "expected OPENSSH key" not in str(raised.value)


@pytest.mark.parametrize(("make", "problem"), [
    (lambda d: keygen(d / "id", "ed25519", passphrase="a passphrase"),
     "the key is protected by a passphrase, which gpuprov does not ask for"),
    (lambda d: keygen(d / "id", "ecdsa", "PEM", passphrase="a passphrase"),
     "the key is protected by a passphrase, which gpuprov does not ask for"),
    (lambda d: Path(f"{keygen(d / 'id', 'ed25519')}.pub"), "not a private key gpuprov can read"),
    (lambda d: d / "missing", "cannot read it: No such file or directory"),
])
def test_a_key_that_cannot_be_used_is_an_authentication_error_before_any_connection(tmp_path, monkeypatch, make,
                                                                                      problem):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)   # no agent to hold a passphrase key
    identity = make(tmp_path)
    allowed = keygen(tmp_path / "allowed", "ed25519")
    with pytest.raises(KeyFileError) as raised:
        login(tmp_path, identity, allowed)
    assert raised.value.message.startswith(f"identity file {identity}: {problem}")
    assert raised.value.exit_code == 1 and raised.value.host == "gpu01" and raised.value.step == "connect"


@pytest.mark.skipif(shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None,
                    reason="needs OpenSSH's ssh-agent and ssh-add")
def test_a_passphrase_key_is_used_through_the_agent_that_holds_it(tmp_path, monkeypatch):
    # ssh's way: IdentityFile names a key with a passphrase, ssh-agent holds it, the agent signs
    identity = keygen(tmp_path / "id", "ed25519", passphrase="a passphrase")
    askpass = tmp_path / "askpass"
    askpass.write_text("#!/bin/sh\necho 'a passphrase'\n")
    askpass.chmod(0o700)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
               "DISPLAY": ":0"}
        subprocess.run(["ssh-add", str(identity)], env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        _, transports = login(tmp_path, identity, identity)
        assert len(transports) == 1
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_a_host_only_a_cert_authority_covers_is_refused_naming_the_line(tmp_path):
    ca = keygen(tmp_path / "ca", "ed25519")
    identity = keygen(tmp_path / "id", "ed25519")
    server_key = host_key(tmp_path)
    # the host's key signed by the CA, as a host certificate: what an operator who trusts the CA has
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "gpu01", "-h", "-n", "127.0.0.1",
                    str(tmp_path / "host_key.pub")], check=True, capture_output=True)
    assert (tmp_path / "host_key-cert.pub").exists()
    with ssh_server(server_key, public(identity)) as (port, transports):
        path = tmp_path / "known_hosts"
        path.write_text(f"# fleet CA\n@cert-authority [127.0.0.1]:{port} {public(ca)}\n")
        host = Host(name="gpu01", address="127.0.0.1", port=port, identity_file=str(identity))
        for trust_new in (False, True):
            conn = HostConnection(host, known_hosts=read_known_hosts(path), trust_new=trust_new, retries=0)
            with pytest.raises(HostKeyError) as raised:
                conn.open()
            assert raised.value.message.startswith(
                f"[127.0.0.1]:{port} is trusted through a host certificate authority (@cert-authority at {path}:2), "
                "and gpuprov (paramiko) cannot verify host certificates")
            assert f"ssh-keyscan -p {port} 127.0.0.1" in raised.value.hint
        assert path.read_text() == f"# fleet CA\n@cert-authority [127.0.0.1]:{port} {public(ca)}\n"


# -- Ctrl-C -----------------------------------------------------------------------------------------------------

def closed_port() -> int:
    """A local port nothing listens on: every connect is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Attempts:
    """Every connect attempt HostConnection makes (`made`, the host names); `first` is set at the first."""

    def __init__(self):
        self.made: list[str] = []
        self.first = threading.Event()


@pytest.fixture
def attempts(monkeypatch) -> Attempts:
    seen = Attempts()
    build = HostConnection._fabric_connection

    def counting(self, host, gateway=None):
        seen.made.append(host.name)
        seen.first.set()
        return build(self, host, gateway)

    monkeypatch.setattr(HostConnection, "_fabric_connection", counting)
    return seen


def unreachable(tmp_path: Path, retries: int) -> HostConnection:
    host = Host(name="gpu01", address="127.0.0.1", port=closed_port())
    return HostConnection(host, known_hosts=read_known_hosts(tmp_path / "known_hosts"), retries=retries)


def test_stop_retrying_ends_a_connect_in_progress_after_its_attempt(tmp_path, attempts):
    conn = unreachable(tmp_path, retries=50)
    failed: list = []

    def worker():
        try:
            conn.open()
        except ConnectError as exc:
            failed.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert attempts.first.wait(30)
    conn.stop_retrying()       # what a run does for its connections in progress at the first Ctrl-C
    thread.join(60)
    assert not thread.is_alive()
    assert attempts.made == ["gpu01"]
    assert failed[0].message.startswith(f"cannot reach 127.0.0.1:{conn.host.port} after 1 attempts (Ctrl-C: not "
                                        "retried): NoValidConnectionsError")


def test_ctrl_c_in_the_retry_pause_is_not_swallowed(tmp_path, attempts):
    conn = unreachable(tmp_path, retries=50)
    main = threading.get_ident()

    def press_ctrl_c():
        attempts.first.wait(30)
        signal.pthread_kill(main, signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c)
    presser.start()
    with pytest.raises(KeyboardInterrupt):
        conn.open()   # 50 retries: it would take minutes to give up by itself
    presser.join()
    assert attempts.made == ["gpu01"]


def test_ctrl_c_during_an_attempt_is_not_retried(tmp_path, attempts, monkeypatch):
    import fabric

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(fabric.Connection, "open", interrupted)
    conn = unreachable(tmp_path, retries=5)
    with pytest.raises(KeyboardInterrupt):
        conn.open()
    assert attempts.made == ["gpu01"]
    assert conn._conn is None


def test_without_ctrl_c_a_network_error_is_retried(tmp_path, attempts):
    conn = unreachable(tmp_path, retries=1)
    with pytest.raises(ConnectError) as raised:
        conn.open()
    assert attempts.made == ["gpu01", "gpu01"]
    assert "after 2 attempts: NoValidConnectionsError" in raised.value.message


def test_a_run_stops_connect_retries_at_the_first_ctrl_c(tmp_path, attempts, monkeypatch):
    import gpuprov.core.executor as executor

    host = Host(name="gpu01", address="127.0.0.1", port=closed_port())
    wait, pressed = executor.wait, []

    def ctrl_c_once_connecting(*args, **kwargs):
        """The run's wait for its hosts, where Ctrl-C lands while they work: once the host's first attempt began."""
        if attempts.first.is_set() and not pressed:
            pressed.append(True)
            raise KeyboardInterrupt
        return wait(*args, **kwargs)

    monkeypatch.setattr(executor, "wait", ctrl_c_once_connecting)
    with pytest.raises(executor.RunInterrupted) as raised:   # 50 retries: minutes, were they not stopped
        executor.run_on_hosts([host], lambda conn: None,
                              executor.Settings(known_hosts=tmp_path / "known_hosts", connect_retries=50))
    [outcome] = raised.value.outcomes
    assert attempts.made == ["gpu01"]
    assert outcome.error.message.startswith(f"cannot reach 127.0.0.1:{host.port} after 1 attempts (Ctrl-C: not "
                                            "retried)")
