"""SSH connections to inventory hosts over Fabric and paramiko, with verified host keys.

One `HostConnection` per host per run. Host keys are checked against the run's known_hosts file (read
once, strictly, by gpuprov.core.known_hosts): an unknown key is refused with the command that trusts it, unless
trust on first use was asked for explicitly (`--trust-new-hosts`); a changed or revoked key is always refused.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.known_hosts import KnownHosts
from gpuprov.core.secrets import mask, register

# paramiko logs a failed handshake with its traceback; with no handler configured Python prints that on
# stderr. gpuprov reports every connection error itself (ConnectError, HostKeyError), once and plainly.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


# Run by sudo as root in front of a command when a sudo password is set: stdin starts with the password line and
# a marker line ($1). sudo reads the password line when it asks for one; when it does not (NOPASSWD, for all
# commands or for sh), `read` takes it into a variable. Either way the command's stdin starts after the marker, so the
# password is never executed by `sh -s`, read by the command or written anywhere.
_SKIP_PASSWORD = ('IFS= read -r line && { [ "$line" = "$1" ] || { IFS= read -r line && [ "$line" = "$1" ]; }; } || '
                  '{ echo "gpuprov: sudo did not take the password line as expected: nothing was run" >&2; '
                  'exit 126; }; line=; shift; exec sh -c "$1"')


class HostKeyError(GpuprovError):
    """The host's key is unknown or changed."""


class ConnectError(GpuprovError):
    """The host could not be reached or refused authentication."""


class KeyFileError(ConnectError):
    """The identity file cannot be used: unreadable, not a private key, or protected by a passphrase (`encrypted`).
    An authentication error (exit 1, as a refused key is), never retried."""

    encrypted = False


def load_private_key(path: str | Path, host_name: str):
    """The paramiko key of a private key file in a format OpenSSH writes (OpenSSH, PEM from `-m PEM`, PKCS#8),
    with its certificate `FILE-cert.pub` when there is one; KeyFileError saying what is wrong otherwise.

    Given a file name, paramiko tries each key class in turn and keeps the last error, so a refused PEM key was
    reported as `encountered EC key, expected OPENSSH key` and retried as a network error; and its readers take
    no PKCS#8. The key is read once by `cryptography` (as PKey.from_path does) and handed to its paramiko class
    in OpenSSH form."""
    import paramiko
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    path = Path(path).expanduser()

    def refuse(problem: str, hint: str) -> KeyFileError:
        return KeyFileError(f"identity file {path}: {problem}", host=host_name, step="connect", hint=hint)

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise refuse(f"cannot read it: {exc.strerror}",
                     "check identity_file (the inventory's, or IdentityFile in the ssh_config) and that this user "
                     "can read the file") from None
    try:
        try:
            loaded = serialization.load_ssh_private_key(data, password=None)
        except ValueError:
            loaded = serialization.load_pem_private_key(data, password=None)
    except TypeError:   # cryptography: the key is encrypted and no password was given
        error = refuse("the key is protected by a passphrase, which gpuprov does not ask for, and no ssh-agent "
                       "answers (SSH_AUTH_SOCK is not set)",
                       f"load it into ssh-agent (ssh-add {shlex.quote(str(path))}) and run gpuprov where "
                       "SSH_AUTH_SOCK is set: the agent's keys are then used, as ssh does; or give gpuprov a key of "
                       "its own")
        error.encrypted = True
        raise error from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise refuse(f"not a private key gpuprov can read ({reason})",
                     "give identity_file a private key file (OpenSSH, PEM or PKCS#8), not its .pub half") from None
    classes = ((rsa.RSAPrivateKey, paramiko.RSAKey), (ec.EllipticCurvePrivateKey, paramiko.ECDSAKey),
               (ed25519.Ed25519PrivateKey, paramiko.Ed25519Key))
    key_class = next((cls for kind, cls in classes if isinstance(loaded, kind)), None)
    if key_class is None:
        raise refuse(f"a {type(loaded).__name__.lstrip('_')} key, which gpuprov cannot use",
                     "use an RSA, ECDSA or Ed25519 key")
    text = loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    key = key_class.from_private_key(io.StringIO(text))
    certificate = Path(f"{path}-cert.pub")
    if certificate.exists():
        try:
            key.load_certificate(str(certificate))
        except (OSError, ValueError, paramiko.SSHException) as exc:
            raise refuse(f"its certificate {certificate} cannot be used: {exc}",
                         "renew the certificate, or move it away to log in with the key alone") from None
    return key


class SudoError(GpuprovError):
    """sudo refused: wrong or missing password, or the user may not sudo."""


@dataclass
class Result:
    """One remote command's outcome."""

    command: str
    rc: int
    stdout: str
    stderr: str
    duration: float
    masked: list[str] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def shown_command(self) -> str:
        """The command as logs and reports may show it: every secret replaced by ***."""
        return mask(self.command, self.masked)


@runtime_checkable
class Connection(Protocol):
    """What a host job asks of a host: HostConnection over SSH is the one real implementation, and the tests use a
    local one (tests/unit/helpers/local_host.py) that runs commands on this machine."""

    host: Any

    def open(self) -> Connection: ...

    def close(self) -> None: ...

    def fresh(self, *, connect_timeout: int | None = None, retries: int | None = None) -> Connection: ...

    def run(self, command: str, *, sudo: bool = False, timeout: int | None = None,
            stdin: str | None = None) -> Result: ...

    def sftp(self): ...

    def server_key_type(self) -> str | None: ...

    def open_tunnel(self, port: int, address: str = "127.0.0.1", timeout: int | None = None): ...


def known_hosts_name(address: str, port: int) -> str:
    """The name a host has in known_hosts: `addr` on port 22, `[addr]:port` elsewhere."""
    return address if port == 22 else f"[{address}]:{port}"


def _close(*connections) -> None:
    for conn in connections:
        if conn is not None:
            conn.close()


def _host_key_policy(known_hosts: KnownHosts, trust_new: bool, host_name: str):
    import paramiko

    class VerifyPolicy(paramiko.MissingHostKeyPolicy):
        """Refuse unknown and revoked keys; record an unknown one when trust on first use was asked for."""

        def missing_host_key(self, client, hostname, key):
            fingerprint = key.fingerprint
            revoked = known_hosts.revoked(hostname, key)
            if revoked is not None:
                raise HostKeyError(
                    f"the host key {key.get_name()} {fingerprint} of {hostname} is revoked "
                    f"(@revoked at {known_hosts.path}:{revoked.line})", host=host_name, step="connect",
                    hint="the host must present another key: find out why its key was revoked",
                )
            authority = known_hosts.cert_authority(hostname)
            if authority is not None:
                address, _, port = hostname.removeprefix("[").partition("]:")
                scan = f"ssh-keyscan{f' -p {port}' if port else ''} {shlex.quote(address)}"
                raise HostKeyError(
                    f"{hostname} is trusted through a host certificate authority (@cert-authority at "
                    f"{known_hosts.path}:{authority.line}), and gpuprov (paramiko) cannot verify host certificates: "
                    f"its key {key.get_name()} {fingerprint} is not listed for it", host=host_name, step="connect",
                    hint=f"add the host's own key to {known_hosts.path}: `{scan}`, check the fingerprint it prints "
                         f"against the host's (ssh-keygen -lf on the host, or its certificate), then append that line "
                         f"to the file; --trust-new-hosts does not apply to hosts a CA line covers",
                )
            if not trust_new:
                raise HostKeyError(
                    f"unknown host key {key.get_name()} {fingerprint} for {hostname}",
                    host=host_name, step="connect",
                    hint=f"check the fingerprint out of band, then rerun with --trust-new-hosts "
                         f"to record it in {known_hosts.path}",
                )
            known_hosts.record(hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)

    return VerifyPolicy()


class HostConnection:
    """A persistent SSH connection to one host; `run` sends one command and returns its Result."""

    def __init__(self, host, *, known_hosts: KnownHosts, trust_new: bool = False, connect_timeout: int = 10,
                 retries: int = 2, command_timeout: int = 1800, jump=None):
        self.host = host
        self.known_hosts = known_hosts
        self.trust_new = trust_new
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.command_timeout = command_timeout
        self.jump = jump
        self._conn = None
        self._sudo_password: str | None = None
        self._stop = threading.Event()   # set by stop_retrying (Ctrl-C), or close while opening: no retry
        self._opening = False

    # -- connecting ---------------------------------------------------------------------------
    def _fabric_connection(self, host, gateway=None):
        from fabric import Config, Connection

        connect_kwargs: dict = {"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout}
        if host.identity_file:
            try:
                connect_kwargs.update(pkey=load_private_key(host.identity_file, self.host.name),
                                      look_for_keys=False, allow_agent=False)
            except KeyFileError as exc:
                if not (exc.encrypted and os.environ.get("SSH_AUTH_SOCK")):
                    raise
                # a key with a passphrase, and an agent: ssh signs with the agent's copy of it; so does gpuprov
                connect_kwargs.update(look_for_keys=False, allow_agent=True)
        config = Config(overrides={"load_ssh_configs": False}, lazy=True)
        conn = Connection(host.address, user=host.user, port=host.port, config=config, gateway=gateway,
                          connect_timeout=self.connect_timeout, connect_kwargs=connect_kwargs)
        conn.client.set_missing_host_key_policy(_host_key_policy(self.known_hosts, self.trust_new, host.name))
        name = known_hosts_name(host.address, host.port)
        for key in self.known_hosts.keys_for(name):
            conn.client.get_host_keys().add(name, key.get_name(), key)
        return conn

    def open(self) -> HostConnection:
        """Connect (with bounded retries on network errors), through the jump host first when there is one:
        an error names the hop that failed. Host key, key file and auth errors are not retried, and nothing is
        after Ctrl-C: KeyboardInterrupt (in the pause or in an attempt) goes up at once, and stop_retrying (what
        a run calls for its worker threads' connections at the first Ctrl-C) ends it after the attempt in
        flight."""

        if self._conn is not None and self._conn.is_connected:
            return self
        self._opening = True
        try:
            return self._connect()
        finally:
            self._opening = False
            self._stop.clear()   # a stop ends this open (or the next one, when it came between two)

    def _connect(self) -> HostConnection:
        import paramiko

        last: Exception | None = None
        hop = self.host
        attempts = 0
        while attempts <= self.retries and not (attempts and self._stop.is_set()):
            attempts += 1
            gateway = conn = None
            try:
                if self.jump:
                    hop = self.jump
                    gateway = self._fabric_connection(self.jump)
                    gateway.open()
                hop = self.host
                conn = self._fabric_connection(self.host, gateway=gateway)
                conn.open()
                self._conn = conn
                return self
            except HostKeyError:
                _close(conn, gateway)
                raise
            except paramiko.BadHostKeyException as exc:
                _close(conn, gateway)
                name = known_hosts_name(hop.address, hop.port)
                raise HostKeyError(
                    f"{self._via(hop)}host key for {name} CHANGED: "
                    f"got {exc.key.get_name()} {exc.key.fingerprint}, expected {exc.expected_key.fingerprint}",
                    host=self.host.name, step="connect",
                    hint=f"if {hop.name} was reinstalled, verify the new key out of band and remove the old "
                         f"entry: ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(self.known_hosts.path))}",
                ) from None
            except KeyFileError as exc:
                _close(conn, gateway)
                exc.message = self._via(hop) + exc.message
                raise
            except paramiko.AuthenticationException as exc:
                _close(conn, gateway)
                raise ConnectError(
                    f"{self._via(hop)}authentication failed as {hop.user}: {exc}", host=self.host.name,
                    step="connect",
                    hint=f"check the inventory's user and identity_file of {hop.name}, and that the key is authorised",
                ) from None
            except (OSError, paramiko.SSHException, EOFError) as exc:
                _close(conn, gateway)
                last = exc
                if attempts <= self.retries:
                    self._stop.wait(min(2.0, 0.5 * attempts))
            except BaseException:   # KeyboardInterrupt in an attempt: not retried, and nothing left open
                _close(conn, gateway)
                raise
        stopped = " (Ctrl-C: not retried)" if attempts <= self.retries else ""
        raise ConnectError(
            f"{self._via(hop)}cannot reach {hop.address}:{hop.port} after {attempts} attempts{stopped}: "
            f"{type(last).__name__}: {last}", host=self.host.name, step="connect",
            hint=f"check that {hop.name} is up, its address and port"
                 + (", and the jump host" if self.jump and hop is self.host else ""),
        )

    def stop_retrying(self) -> None:
        """No new connect attempt: an open() in progress on another thread ends after the attempt in flight, with
        that attempt's error. A run calls it for every connection in progress at the first Ctrl-C."""
        self._stop.set()

    def fresh(self, *, connect_timeout: int | None = None, retries: int | None = None) -> HostConnection:
        """A new, unopened connection to the same host with the same settings and sudo password: its own TCP
        connection and SSH handshake (what proves that the host still lets gpuprov in)."""
        other = HostConnection(self.host, known_hosts=self.known_hosts, trust_new=self.trust_new,
                               connect_timeout=connect_timeout or self.connect_timeout,
                               retries=self.retries if retries is None else retries,
                               command_timeout=self.command_timeout, jump=self.jump)
        other._sudo_password = self._sudo_password
        return other

    def server_key_type(self) -> str | None:
        """The type of the host key this connection verified (`ssh-ed25519`, `ssh-rsa`...), None when closed."""
        transport = self._conn.transport if self._conn is not None else None
        return transport.get_remote_server_key().get_name() if transport is not None else None

    def open_tunnel(self, port: int, address: str = "127.0.0.1", timeout: int | None = None):
        """A socket-like paramiko channel to `address:port` as the host itself reaches it (SSH direct-tcpip, as
        `ssh -L` does): for a service that listens on the host's loopback or behind its firewall."""
        self.open()
        return self._conn.transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0),
                                                 timeout=timeout or self.connect_timeout)

    def sftp(self):
        """The SFTP client of this connection's session (Fabric keeps one and closes it with the connection)."""
        self.open()
        return self._conn.sftp()

    def _via(self, hop) -> str:
        """`jump host NAME: ` when the hop that failed is the jump host, else nothing."""
        return f"jump host {hop.name}: " if hop is not self.host else ""

    def close(self) -> None:
        if self._opening:   # from another thread (a second Ctrl-C): no further attempt
            self._stop.set()
        if self._conn is not None:
            self._conn.close()
            if self._conn.gateway:
                self._conn.gateway.close()
            self._conn = None

    def __enter__(self) -> HostConnection:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running --------------------------------------------------------------------------------
    @property
    def needs_sudo(self) -> bool:
        return self.host.user != "root"

    def set_sudo_password(self, password: str | None) -> None:
        """The sudo password, used on stdin and never logged: registered with gpuprov.core.secrets, so that every
        output masks it. InputError for one with a line break, which `sudo -S` cannot read."""
        if password is not None and ("\n" in password or "\r" in password):
            raise InputError("the sudo password has a line break, which sudo -S cannot read", host=self.host.name,
                             step="sudo", hint="set the password without a line break in the variable that the "
                                               "inventory's sudo.password_env names")
        register(password)
        self._sudo_password = password

    def run(self, command: str, *, sudo: bool = False, timeout: int | None = None,
            stdin: str | None = None) -> Result:
        """Run one command (through `sh -c`, as root via sudo when asked and needed)."""
        self.open()
        wrapped = command
        secrets: list[str] = []
        if sudo and self.needs_sudo:
            if self._sudo_password is not None:
                marker = os.urandom(16).hex()
                wrapped = f"sudo -S -p '' -k sh -c {shlex.quote(_SKIP_PASSWORD)} sh {marker} {shlex.quote(command)}"
                stdin = f"{self._sudo_password}\n{marker}\n" + (stdin or "")
                secrets.append(self._sudo_password)
            else:
                wrapped = f"sudo -n sh -c {shlex.quote(command)}"
        started = time.monotonic()
        channel = self._conn.transport.open_session(timeout=self.connect_timeout)
        channel.settimeout(timeout or self.command_timeout)
        try:
            channel.exec_command(wrapped)
            if stdin is not None:
                channel.sendall(stdin.encode())
            channel.shutdown_write()
            stdout, stderr = _drain(channel)
            rc = channel.recv_exit_status()
        except TimeoutError:
            channel.close()
            raise GpuprovError(
                f"command timed out after {timeout or self.command_timeout}s", host=self.host.name,
                command=mask(command, secrets), hint="raise gpuprov.command_timeout or look at the host",
            ) from None
        finally:
            channel.close()
        result = Result(command, rc, stdout, mask(stderr, secrets), time.monotonic() - started, secrets)
        if sudo and self.needs_sudo and rc != 0 and _sudo_refused(result.stderr):
            raise SudoError(
                "sudo refused: " + result.stderr.strip().splitlines()[-1], host=self.host.name, step="sudo",
                command=result.shown_command(),
                hint="set the password in the environment variable the inventory's sudo.password_env names, "
                     "or allow NOPASSWD for this user",
            )
        return result


OUTPUT_CAP = 4 << 20   # bytes kept of each stream of one command: the tail (a host printing without end)
CUT_NOTE = re.compile(r"\[gpuprov: output cut: the first (\d+) bytes were dropped, the last \d+ kept\]\n")


def _drain(channel, cap: int = OUTPUT_CAP) -> tuple[str, str]:
    """Read stdout and stderr until the command ends (select wakes on either stream or on close). Each stream
    keeps its last `cap` bytes; a cut one starts with a note of how much was dropped (output_cut reads it)."""
    import select

    streams = {"out": bytearray(), "err": bytearray()}
    dropped = {"out": 0, "err": 0}

    def keep(name: str, data: bytes) -> None:
        if time.monotonic() > deadline:   # a stream that never pauses still ends at the timeout
            raise TimeoutError
        kept = streams[name]
        kept += data
        if len(kept) > 2 * cap:   # trimmed in batches: a stream costs at most 2 x cap bytes
            dropped[name] += len(kept) - cap
            del kept[:len(kept) - cap]

    deadline = time.monotonic() + (channel.gettimeout() or 1800)
    while True:
        while channel.recv_ready():
            keep("out", channel.recv(65536))
        while channel.recv_stderr_ready():
            keep("err", channel.recv_stderr(65536))
        drained = not channel.recv_ready() and not channel.recv_stderr_ready()
        if channel.exit_status_ready() and drained and (channel.eof_received or channel.closed):
            break
        if time.monotonic() > deadline:
            raise TimeoutError
        select.select([channel], [], [], 0.2)
    out = []
    for name, kept in streams.items():
        if len(kept) > cap:
            dropped[name] += len(kept) - cap
            del kept[:len(kept) - cap]
        note = f"[gpuprov: output cut: the first {dropped[name]} bytes were dropped, the last {cap} kept]\n"
        out.append((note if dropped[name] else "") + kept.decode(errors="replace"))
    return out[0], out[1]


def output_cut(text: str) -> int:
    """How many bytes of a command's stream `_drain` dropped (0: none)."""
    found = CUT_NOTE.match(text)
    return int(found.group(1)) if found else 0


def _sudo_refused(stderr: str) -> bool:
    markers = ("incorrect password", "Sorry, try again", "a password is required", "is not in the sudoers",
               "no password was provided", "a terminal is required")
    return any(marker in stderr for marker in markers)
