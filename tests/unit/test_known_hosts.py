"""known_hosts files (gpuprov.core.known_hosts): OpenSSH's forms are matched for the right host and port (plain,
`[host]:port`, hashed `|1|`, wildcards, negation, @revoked), and every corrupt form is exit 2 naming the file and
line, found before any host is contacted, with the file left byte for byte as it was (trust on first use
included). Matching is checked against `ssh-keygen -F` and against a real SSH handshake with paramiko's server.

Expected texts are written out here; fingerprints and hashed names are computed from OpenSSH's definitions
(SHA256 of the key blob, HMAC-SHA1 of the host name), not by gpuprov."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import shutil
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest
from helpers.ssh_server import serve_ssh
from helpers.tasks import INVENTORY, exit_code
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invoke import Config, Context

from gpuprov.core.connection import ConnectError, HostConnection, HostKeyError
from gpuprov.core.errors import InputError
from gpuprov.core.known_hosts import KnownHostsError, read_known_hosts
from gpuprov.inventory import Host
from gpuprov.tasks import facts as facts_tasks
from gpuprov.tasks import provision as provision_tasks
from gpuprov.tasks import stack as stack_tasks

# an ed25519 host key and an RSA one, as `ssh-keygen -t ed25519` / `-t rsa` write them (public halves)
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO9IB98eRT/roQlUqiSrFsI5ezSR0zxdwzlCKEcYMTJS"
OTHER_ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqKxaMrl2ipbNoDWEIGcsqD4Jf6ao3gZYzW8EkB7+Fw"
DSS = "ssh-dss AAAAB3NzaC1kc3MAAACBAP//"
HINT = ("fix or delete that line (ssh-keygen -R HOST -f FILE removes a host's entries), or point "
        "gpuprov.known_hosts (invoke.yaml) or the inventory's known_hosts at a known_hosts file")


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    """A hashed known_hosts name as OpenSSH writes it: |1|base64(salt)|base64(HMAC-SHA1(salt, name))."""
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def fingerprint(public: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key line's key."""
    blob = base64.b64decode(public.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def written(tmp_path: Path, text: str | bytes, name: str = "known_hosts") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def types_for(path: Path, name: str) -> list[str]:
    return [key.get_name() for key in read_known_hosts(path).keys_for(name)]


# --------------------------------------------------------------------------------------------- matching

MATCHING = f"""\
# a comment, then the forms OpenSSH writes
gpu01 {ED25519}
[10.0.0.5]:2222 {ED25519} port 2222 only
{hashed("gpu02")} {ED25519}
{hashed("[10.0.0.6]:2200")} {ED25519}
*.lab,!bad.lab {ED25519}
gpu0?.rack {ED25519}
@cert-authority *.ca {ED25519}
old {DSS}
"""


@pytest.mark.parametrize(("name", "known"), [
    ("gpu01", True), ("GPU01", True), ("[gpu01]:2222", False),
    ("[10.0.0.5]:2222", True), ("10.0.0.5", False), ("[10.0.0.5]:22", False), ("[10.0.0.5]:2223", False),
    ("gpu02", True), ("[gpu02]:2222", False),
    ("[10.0.0.6]:2200", True), ("10.0.0.6", False),
    ("x.lab", True), ("bad.lab", False), ("lab", False),
    ("gpu07.rack", True), ("gpu10.rack", False),
    ("host.ca", False),  # a certificate authority, not a host key
    ("old", False),  # a key type paramiko cannot use is read, and never matches
])
def test_each_form_is_matched_for_its_host_and_port(tmp_path, name, known):
    assert types_for(written(tmp_path, MATCHING), name) == (["ssh-ed25519"] if known else [])


@pytest.mark.tool
@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
@pytest.mark.parametrize("name", ["gpu01", "[gpu01]:2222", "[10.0.0.5]:2222", "10.0.0.5", "gpu02",
                                  "[10.0.0.6]:2200", "x.lab", "bad.lab", "gpu07.rack"])
def test_matching_agrees_with_ssh_keygen(tmp_path, name):
    path = written(tmp_path, MATCHING.replace(f"old {DSS}\n", ""))
    found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True)
    assert bool(types_for(path, name)) == (found.returncode == 0 and ED25519.split()[1] in found.stdout)


def test_a_revoked_key_is_never_a_known_key(tmp_path):
    path = written(tmp_path, f"gpu01 {ED25519}\n@revoked * {ED25519}\n")
    known = read_known_hosts(path)
    assert known.keys_for("gpu01") == []
    assert known.revoked("gpu01", known.entries[0].key).line == 2


def test_a_missing_file_knows_no_host(tmp_path):
    assert read_known_hosts(tmp_path / "none").entries == []
    assert not (tmp_path / "none").exists()


def test_crlf_line_ends_and_a_missing_last_newline_are_read(tmp_path):
    path = written(tmp_path, f"gpu01 {ED25519}\r\n# note\r\ngpu02 {ED25519}".encode())
    assert types_for(path, "gpu01") == types_for(path, "gpu02") == ["ssh-ed25519"]


# ------------------------------------------------------------------------------------------- bad files

ED_BLOB = ED25519.split()[1]


@pytest.mark.parametrize(("text", "line", "message"), [
    ("gpu01 ssh-ed25519\n", 1, "expected HOSTS KEYTYPE KEY [COMMENT], found 2 fields 'gpu01 ssh-ed25519'"),
    (f"# ok\n\ngpu01 {ED25519}\njunk\n", 4, "expected HOSTS KEYTYPE KEY [COMMENT], found 1 field 'junk'"),
    (f"@foo gpu01 {ED25519}\n", 1, "unknown marker '@foo': the markers are @cert-authority and @revoked"),
    ("@revoked gpu01\n", 1, "expected @MARKER HOSTS KEYTYPE KEY [COMMENT], found 1 field '@revoked gpu01'"),
    (f"[gpu01]:99999 {ED25519}\n", 1, "bad host '[gpu01]:99999': a port other than 22 is written [HOST]:PORT, "
                                      "with a PORT from 1 to 65535"),
    (f"[gpu01] {ED25519}\n", 1, "bad host '[gpu01]': a port other than 22 is written [HOST]:PORT, with a PORT "
                                "from 1 to 65535"),
    (f"[gpu01]:22x {ED25519}\n", 1, "bad host '[gpu01]:22x': a port other than 22 is written [HOST]:PORT, with a "
                                    "PORT from 1 to 65535"),
    (f"[gpu01]:２２ {ED25519}\n", 1, "bad host '[gpu01]:２２': a port other than 22 is written [HOST]:PORT, with a "
                                   "PORT from 1 to 65535"),
    (f"gpu01,,gpu02 {ED25519}\n", 1, "empty host name in 'gpu01,,gpu02'"),
    (f"gpu/01 {ED25519}\n", 1, "bad host name 'gpu/01': letters, digits, '.', '-', '_', ':', '%', the wildcards "
                               "'*' and '?', or [HOST]:PORT"),
    (f"gpu\x1b01 {ED25519}\n", 1, "bad host name 'gpu\\x1b01': letters, digits, '.', '-', '_', ':', '%', the "
                                  "wildcards '*' and '?', or [HOST]:PORT"),
    (f"|1|abc|def {ED25519}\n", 1, "bad hashed host name '|1|abc|def': expected |1|SALT|HASH with a base64 SALT "
                                   "and HASH of 20 bytes each, as ssh-keygen -H writes them"),
    # a hashed name stands alone; a long token is cut at 60 characters in the message
    (f"{hashed('a')},gpu01 {ED25519}\n", 1, "bad hashed host name '|1|MDEyMzQ1Njc4OWFiY2RlZmdoaWo=|b2UR6KmG2j7e"
                                            "kYz9WnHWBpZ+b...': expected |1|SALT|HASH with a base64 SALT and HASH "
                                            "of 20 bytes each, as ssh-keygen -H writes them"),
    ("gpu01 ssh-ed25519 AAAA%%%\n", 1, "the key of type 'ssh-ed25519' is not valid base64"),
    (f"gpu01 ssh-rsa {ED_BLOB}\n", 1, "the key is of type 'ssh-ed25519' but the line says 'ssh-rsa'"),
    ("gpu01 ssh-ed25519 AAAA\n", 1, "the key is too short to be an SSH public key"),
    ("gpu01 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAAQA=\n", 1, "bad ssh-ed25519 key: The key must be exactly 32 bytes "
                                                            "long"),
    ("gpu01 ssh-ed25519 AAAA/2FiYw==\n", 1, "the key is cut short: not an SSH public key"),
])
def test_a_malformed_line_is_named_with_file_and_line(tmp_path, text, line, message):
    path = written(tmp_path, text)
    with pytest.raises(KnownHostsError) as caught:
        read_known_hosts(path)
    assert caught.value.exit_code == 2
    assert caught.value.message == f"{path}:{line}: known_hosts: {message}"
    assert caught.value.hint == HINT


@pytest.mark.parametrize(("content", "message"), [
    # a PNG header: the NUL byte is on the file's fourth line
    (b"gpu01 " + ED25519.encode() + b"\n\x89PNG\r\n\x1a\n\x00\x00", "4: known_hosts: binary data (a NUL byte): "
                                                                   "not a known_hosts file"),
    (b"gpu01 " + ED25519.encode() + b"\n\n\xff\xfe gpu02\n", "3: known_hosts: not UTF-8 text: not a known_hosts "
                                                           "file"),
])
def test_a_binary_file_is_not_a_known_hosts_file(tmp_path, content, message):
    path = written(tmp_path, content)
    with pytest.raises(KnownHostsError) as caught:
        read_known_hosts(path)
    assert caught.value.message == f"{path}:{message}"


def test_a_folder_is_not_a_known_hosts_file(tmp_path):
    with pytest.raises(KnownHostsError) as caught:
        read_known_hosts(tmp_path)
    assert caught.value.message == f"{tmp_path}: known_hosts: a folder, not a file"
    assert caught.value.hint == ("point gpuprov.known_hosts (invoke.yaml) or the inventory's known_hosts at a "
                                 "known_hosts file")


def test_a_fifo_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(KnownHostsError) as caught:
        read_known_hosts(tmp_path / "fifo")  # reading it would block
    assert caught.value.message == f"{tmp_path / 'fifo'}: known_hosts: not a regular file"


def test_an_unreadable_file_says_so(tmp_path, monkeypatch):
    path = written(tmp_path, f"gpu01 {ED25519}\n")

    real_open = os.open

    def denied(name, *args, **kwargs):  # as root every file is readable: the system's answer is "no" here
        if str(name) == str(path):
            raise PermissionError(13, "Permission denied", str(name))
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(KnownHostsError) as caught:
        read_known_hosts(path)
    assert caught.value.message == f"{path}: known_hosts: cannot read: Permission denied"
    assert caught.value.hint.startswith("give this user read access to it, or point gpuprov.known_hosts")


def test_every_bad_line_is_listed_up_to_ten(tmp_path):
    path = written(tmp_path, "".join(f"bad{n}\n" for n in range(12)))
    with pytest.raises(KnownHostsError) as caught:
        read_known_hosts(path)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{path}: 11 errors:"
    assert lines[1] == f"  {path}:1: known_hosts: expected HOSTS KEYTYPE KEY [COMMENT], found 1 field 'bad0'"
    assert lines[10] == f"  {path}:10: known_hosts: expected HOSTS KEYTYPE KEY [COMMENT], found 1 field 'bad9'"
    assert lines[11] == "  ... and 2 more"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from([ED25519, "[h]:22 " + ED25519, "@revoked",
                                                                  "|1|", "*", "!x"])), max_size=6))
def test_any_text_reads_or_is_a_located_error(tmp_path, lines):
    path = written(tmp_path, "\n".join(lines))
    try:
        read_known_hosts(path)
    except KnownHostsError as exc:
        text = str(exc)
        first = text.splitlines()[0]
        assert first.startswith(f"{path}:") or first.startswith(f"{path}: ")
        assert all(line.isprintable() for line in text.splitlines())


# ------------------------------------------------------------------------- before any host is contacted

@pytest.fixture
def ctx(tmp_path) -> Context:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    return Context(Config(overrides={"gpuprov": {
        "inventory": str(inventory), "locks": str(tmp_path / "locks"), "reports": str(tmp_path / "reports"),
        "known_hosts": str(tmp_path / "known_hosts"), "connect_timeout": 1, "connect_retries": 0}}))


@pytest.fixture
def contacted(monkeypatch) -> list[str]:
    """The hosts a task tried to connect to."""
    calls: list[str] = []

    def connect(host, *args, **kwargs):
        calls.append(host.name)
        raise AssertionError("a host was contacted")

    monkeypatch.setattr("gpuprov.core.executor.connect", connect)
    return calls


TASKS = {
    "facts": (facts_tasks.facts, {}),
    "preflight": (provision_tasks.preflight, {}),
    "provision": (provision_tasks.provision, {}),
    "stack.check": (stack_tasks.check, {}),
    "stack.lock": (stack_tasks.lock, {}),
}


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("trust_new_hosts", [False, True])
def test_a_corrupt_known_hosts_is_exit_2_before_any_host(ctx, tmp_path, capsys, contacted, name, trust_new_hosts):
    path = written(tmp_path, f"gpu01 {ED25519}\n[gpu02]:2222 {ED25519[:30]}")
    before = path.read_bytes()
    task, kwargs = TASKS[name]
    code, err = exit_code(task, ctx, capsys, host=["gpu01"], trust_new_hosts=trust_new_hosts, **kwargs)
    assert code == 2
    assert err.splitlines()[0] == (f"error: {path}:2: known_hosts: the key of type 'ssh-ed25519' is not valid "
                                   "base64")
    assert contacted == []
    assert path.read_bytes() == before
    assert not (tmp_path / "reports").exists() and not (tmp_path / "locks").exists()


def test_a_known_hosts_folder_is_exit_2_before_any_host(ctx, tmp_path, capsys, contacted):
    (tmp_path / "known_hosts").mkdir()
    code, err = exit_code(facts_tasks.facts, ctx, capsys, host=["gpu01"])
    assert code == 2 and err.splitlines()[0] == f"error: {tmp_path / 'known_hosts'}: known_hosts: a folder, not a file"
    assert contacted == []


# --------------------------------------------------------------------------- a real SSH handshake

class _NoLogin(paramiko.ServerInterface):
    """An SSH server that shows its host key and lets nobody in."""

    def get_allowed_auths(self, username):
        return "publickey"


@contextmanager
def ssh_server(host_key):
    """A local SSH server (paramiko's) with `host_key`; yields its port."""
    with serve_ssh(host_key, _NoLogin()) as (port, _transports):
        yield port


@pytest.fixture(scope="module")
def server_key():
    return paramiko.ECDSAKey.generate()


@pytest.fixture
def identity(tmp_path) -> str:
    """An ed25519 identity in OpenSSH's format (the server refuses it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = tmp_path / "id_ed25519"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    return str(path)


def handshake(known_hosts: Path, port: int, identity: str, trust_new: bool = False) -> Exception:
    """Connect to the local server; the error that stopped the connection (authentication always fails)."""
    host = Host(name="gpu01", address="127.0.0.1", port=port, identity_file=identity)
    conn = HostConnection(host, known_hosts=read_known_hosts(known_hosts), trust_new=trust_new, connect_timeout=5,
                          retries=0)
    with pytest.raises((ConnectError, HostKeyError)) as caught:
        conn.open()
    conn.close()
    return caught.value


def server_line(key) -> str:
    return f"{key.get_name()} {key.get_base64()}"


@pytest.mark.parametrize("form", ["ported", "hashed"])
def test_a_host_on_another_port_is_known_by_its_ported_entry(tmp_path, server_key, identity, form):
    with ssh_server(server_key) as port:
        name = f"[127.0.0.1]:{port}"
        path = written(tmp_path, f"127.0.0.1 {OTHER_ED25519}\n{name if form == 'ported' else hashed(name)} "
                                 f"{server_line(server_key)}\n")
        error = handshake(path, port, identity)
    assert isinstance(error, ConnectError)  # past the host key check: only the login failed
    assert error.message == "authentication failed as root: Authentication failed."


def test_the_port_22_entry_does_not_vouch_for_another_port(tmp_path, server_key, identity):
    with ssh_server(server_key) as port:
        path = written(tmp_path, f"127.0.0.1 {server_line(server_key)}\n")
        error = handshake(path, port, identity)
    assert isinstance(error, HostKeyError)
    expected = fingerprint(server_line(server_key))
    assert error.message == f"unknown host key ecdsa-sha2-nistp256 {expected} for [127.0.0.1]:{port}"


def test_a_changed_key_is_refused(tmp_path, server_key, identity):
    other = paramiko.ECDSAKey.generate()
    with ssh_server(server_key) as port:
        path = written(tmp_path, f"[127.0.0.1]:{port} {server_line(other)}\n")
        error = handshake(path, port, identity, trust_new=True)
    assert isinstance(error, HostKeyError)
    assert error.message == (f"host key for [127.0.0.1]:{port} CHANGED: got ecdsa-sha2-nistp256 "
                             f"{fingerprint(server_line(server_key))}, expected {fingerprint(server_line(other))}")


def test_a_revoked_key_is_refused_and_not_recorded(tmp_path, server_key, identity):
    with ssh_server(server_key) as port:
        path = written(tmp_path, f"@revoked * {server_line(server_key)}\n")
        before = path.read_bytes()
        error = handshake(path, port, identity, trust_new=True)
    assert isinstance(error, HostKeyError)
    assert error.message == (f"the host key ecdsa-sha2-nistp256 {fingerprint(server_line(server_key))} of "
                             f"[127.0.0.1]:{port} is revoked (@revoked at {path}:1)")
    assert path.read_bytes() == before


def test_trust_on_first_use_appends_one_ported_line(tmp_path, server_key, identity):
    with ssh_server(server_key) as port:
        path = written(tmp_path, f"gpu09 {ED25519}")  # no line break after the last line
        error = handshake(path, port, identity, trust_new=True)
        assert isinstance(error, ConnectError)
        assert path.read_text() == f"gpu09 {ED25519}\n[127.0.0.1]:{port} {server_line(server_key)}\n"
        assert isinstance(handshake(path, port, identity), ConnectError)  # known now, without the flag


def test_known_hosts_errors_are_input_errors():
    assert issubclass(KnownHostsError, InputError)


def test_a_key_is_recorded_once(tmp_path):
    key = paramiko.ECDSAKey.generate()
    known = read_known_hosts(tmp_path / "state" / "known_hosts")
    for _ in range(3):  # three hosts behind one new jump host
        known.record("[127.0.0.1]:2200", key)
    assert (tmp_path / "state" / "known_hosts").read_text() == f"[127.0.0.1]:2200 {server_line(key)}\n"
    assert read_known_hosts(tmp_path / "state" / "known_hosts").keys_for("[127.0.0.1]:2200")[0] == key


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def through_jump(known_hosts: Path, jump_port: int, identity: str) -> Exception:
    bastion = Host(name="bastion", address="127.0.0.1", port=jump_port, identity_file=identity)
    target = Host(name="gpu01", address="10.0.0.7", port=22, identity_file=identity)
    conn = HostConnection(target, known_hosts=read_known_hosts(known_hosts), connect_timeout=5, retries=0,
                          jump=bastion)
    with pytest.raises((ConnectError, HostKeyError)) as caught:
        conn.open()
    conn.close()
    return caught.value


def test_an_unreachable_jump_host_is_the_hop_named(tmp_path, identity):
    port = closed_port()
    error = through_jump(written(tmp_path, ""), port, identity)
    assert isinstance(error, ConnectError) and error.host == "gpu01"
    assert error.message.startswith(f"jump host bastion: cannot reach 127.0.0.1:{port} after 1 attempts: ")
    assert error.hint == "check that bastion is up, its address and port"


def test_a_jump_host_with_an_unknown_key_is_the_hop_named(tmp_path, server_key, identity):
    with ssh_server(server_key) as port:
        error = through_jump(written(tmp_path, ""), port, identity)
    assert isinstance(error, HostKeyError)
    assert error.message == (f"unknown host key ecdsa-sha2-nistp256 {fingerprint(server_line(server_key))} "
                             f"for [127.0.0.1]:{port}")
    assert error.host == "bastion"


def test_a_jump_host_that_refuses_the_login_is_the_hop_named(tmp_path, server_key, identity):
    with ssh_server(server_key) as port:
        error = through_jump(written(tmp_path, f"[127.0.0.1]:{port} {server_line(server_key)}\n"), port, identity)
    assert isinstance(error, ConnectError)
    assert error.message == "jump host bastion: authentication failed as root: Authentication failed."
    assert error.hint == "check the inventory's user and identity_file of bastion, and that the key is authorised"
