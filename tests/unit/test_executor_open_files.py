"""The pool fits the controller's open-files limit: the soft limit raised toward the hard one when the hosts need
more, fewer hosts at once (said, never silently) when they still do not fit; and the descriptors one host's
connection holds, measured over a real SSH connection through a jump host (paramiko's server, in another process,
so that only the client's descriptors are counted here)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading

import pytest

import gpuprov.core.connection
from gpuprov.core.connection import HostConnection
from gpuprov.core.errors import GpuprovError
from gpuprov.core.executor import Settings, run_on_hosts
from gpuprov.core.known_hosts import read_known_hosts
from gpuprov.core.open_files import FDS_PER_HOST, fit_open_files
from gpuprov.inventory import Host

INF = resource.RLIM_INFINITY


@pytest.fixture
def limits(monkeypatch):
    """RLIMIT_NOFILE as the test sets it (`limits.now`); every setrlimit call is recorded and applied, or refused
    with `limits.refuse` (macOS refuses more than OPEN_MAX)."""

    class Limits:
        now = (1024, 1024)
        calls: list = []
        refuse: Exception | None = None

    def getrlimit(which):
        assert which == resource.RLIMIT_NOFILE
        return Limits.now

    def setrlimit(which, value):
        assert which == resource.RLIMIT_NOFILE
        Limits.calls.append(value)
        if Limits.refuse is not None:
            raise Limits.refuse
        Limits.now = value

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    Limits.calls = []
    return Limits


# 10 descriptors in use + a margin of 32 = 42 before any host; 6 a host (figures worked out by hand below).

def test_a_pool_that_fits_changes_nothing(limits):
    limits.now = (256, 4096)
    fitted = fit_open_files(32, in_use=10)                 # 42 + 32 * 6 = 234 <= 256
    assert (fitted.parallel, fitted.soft, fitted.notice) == (32, 256, None) and limits.calls == []


def test_the_soft_limit_is_raised_to_what_the_pool_needs(limits):
    limits.now = (128, 4096)
    fitted = fit_open_files(32, in_use=10)
    assert limits.calls == [(234, 4096)] and fitted.parallel == 32
    assert fitted.notice == "open files: soft limit raised from 128 to 234 (hard 4096) for 32 hosts at once"


def test_a_pool_over_the_hard_limit_is_raised_to_it_then_shrunk_and_said(limits):
    limits.now = (128, 200)
    fitted = fit_open_files(32, in_use=10)                 # (200 - 42) // 6 = 26 hosts fit
    assert limits.calls == [(200, 200)] and (fitted.parallel, fitted.soft) == (26, 200)
    assert fitted.notice == (
        "open files: soft limit raised from 128 to 200 (hard 200) for 32 hosts at once; open files: the limit (200, "
        "hard 200) fits 26 hosts at once at 6 descriptors each, not 32: running 26 at once; raise the hard limit "
        "(ulimit -Hn, limits.conf) to run more")


def test_at_the_hard_limit_the_pool_shrinks_without_asking(limits):
    limits.now = (128, 128)
    fitted = fit_open_files(32, in_use=10)                 # (128 - 42) // 6 = 14
    assert limits.calls == [] and fitted.parallel == 14 and "fits 14 hosts at once" in fitted.notice


def test_a_refused_raise_shrinks_the_pool(limits):
    limits.now, limits.refuse = (256, INF), ValueError("not allowed to raise maximum limit")
    fitted = fit_open_files(100, in_use=10)                # needs 642; (256 - 42) // 6 = 35
    assert limits.calls == [(642, INF)] and fitted.parallel == 35
    assert fitted.notice.startswith("open files: the limit (256, hard unlimited) fits 35 hosts at once")


def test_an_unlimited_soft_limit_fits_any_pool(limits):
    limits.now = (INF, INF)
    assert fit_open_files(5000, in_use=10).parallel == 5000 and limits.calls == []


def test_no_room_for_one_host_is_an_error_saying_what_to_do(limits):
    limits.now = (45, 45)
    with pytest.raises(GpuprovError) as caught:
        fit_open_files(4, in_use=10)                        # 42 in use, 45 - 42 < 6
    assert caught.value.message == ("the open-files limit (45, hard 45) leaves no room for one host: 42 descriptors "
                                    "are in use and a host needs 6")
    assert caught.value.step == "open files" and "ulimit -n" in caught.value.hint


def test_run_on_hosts_runs_fewer_at_once_and_says_so(tmp_path, limits, monkeypatch, contacted):
    monkeypatch.setattr("gpuprov.core.open_files._open_descriptors", lambda: 10)
    limits.now = (66, 66)                                   # (66 - 42) // 6 = 4 hosts at once
    lock, now, most = threading.Lock(), [0], [0]
    all_in = threading.Barrier(4, timeout=5)                # the first four hosts are in flight together

    def work(conn):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        if conn.host.name < "h4":
            all_in.wait()
        with lock:
            now[0] -= 1

    notices = []
    hosts = [Host(name=f"h{i}", address="192.0.2.1") for i in range(10)]
    outcomes = run_on_hosts(hosts, work, Settings(known_hosts=tmp_path / "kh", parallel=10), on_notice=notices.append)
    assert all(o.ok for o in outcomes) and most[0] == 4
    assert notices == ["open files: the limit (66, hard 66) fits 4 hosts at once at 6 descriptors each, not 10: "
                       "running 4 at once; raise the hard limit (ulimit -Hn, limits.conf) to run more"]


def test_a_run_whose_pool_fits_says_nothing(tmp_path, limits, monkeypatch, contacted):
    monkeypatch.setattr("gpuprov.core.open_files._open_descriptors", lambda: 10)
    notices = []
    run_on_hosts([Host(name="a", address="192.0.2.1")], lambda conn: None, Settings(known_hosts=tmp_path / "kh"),
                 on_notice=notices.append)
    assert notices == [] and limits.calls == []


# --------------------------------------------------------------------------- measured over a real connection

SERVER = r'''
import socket, sys, threading
import paramiko

KEY = paramiko.ECDSAKey.generate()


class Server(paramiko.ServerInterface):
    """Lets any key in; runs every command as `echo ok`; forwards direct-tcpip (the jump host's part)."""

    forward = None

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        def answer():
            while channel.recv(4096):      # the client's end of input comes after it saw the exec succeed
                pass
            channel.sendall(b"ok\n")
            channel.send_exit_status(0)
            channel.close()
        threading.Thread(target=answer, daemon=True).start()
        return True

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.forward = destination
        return paramiko.OPEN_SUCCEEDED


def pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        source.close()
        sink.close()


def serve(client):
    transport = paramiko.Transport(client)
    transport.add_server_key(KEY)
    server = Server()
    transport.start_server(server=server)
    while transport.is_active():
        channel = transport.accept(1)
        if channel is not None and server.forward is not None:
            target, server.forward = socket.create_connection(server.forward), None
            threading.Thread(target=pump, args=(channel, target), daemon=True).start()
            threading.Thread(target=pump, args=(target, channel), daemon=True).start()


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], KEY.get_name(), KEY.get_base64(), flush=True)
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
'''


@pytest.fixture
def ssh_server(tmp_path):
    """A local SSH server in another process: its port and a known_hosts file that knows it."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        port, kind, key = proc.stdout.readline().split()
        (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
        yield int(port), read_known_hosts(tmp_path / "known_hosts")
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd (Linux)")
@pytest.mark.parametrize("through_jump", [False, True])
def test_a_connection_running_a_command_holds_three_descriptors(tmp_path, ssh_server, monkeypatch, through_jump):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    port, known_hosts = ssh_server
    identity = tmp_path / "id_ed25519"
    identity.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    host = Host(name="gpu01", address="127.0.0.1", port=port, user="root", identity_file=str(identity))
    jump = Host(name="bastion", address="127.0.0.1", port=port, user="root", identity_file=str(identity))
    held = []
    drain = gpuprov.core.connection._drain

    def counting(channel, *args):
        out = drain(channel, *args)
        held.append(descriptors() - before)     # the command's channel is still open here
        return out

    monkeypatch.setattr(gpuprov.core.connection, "_drain", counting)
    conn = HostConnection(host, known_hosts=known_hosts, retries=0, jump=jump if through_jump else None)
    before = descriptors()
    try:
        assert conn.run("true").stdout == "ok\n"
    finally:
        conn.close()
    # one TCP socket (to the jump host when there is one: the host's SSH session rides in its channel) and the
    # pipe pair paramiko makes for the channel that select() waits on
    assert len(held[0]) == 3
    assert descriptors() - before == set()
    # a host's work may hold two connections at once (harden's fresh() while the first is open)
    assert 2 * len(held[0]) == FDS_PER_HOST
