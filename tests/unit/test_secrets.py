"""gpuprov.core.secrets: secrets registered by value never survive in masked output, whatever surrounds them; the
patterns mask what gpuprov was never told about; and a sudo password never reaches the command's stdin, also where
sudo does not ask for it (NOPASSWD), judged by a real shell running the wrapped command."""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.core import connection, secrets
from gpuprov.core.connection import HostConnection, SudoError
from gpuprov.core.errors import GpuprovError, InputError
from gpuprov.core.json_text import dump_json
from gpuprov.images.push import registry_auth


@contextmanager
def fresh_registry():
    """An empty registry for one hypothesis example (tests/conftest.py's own_secrets runs once per test)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(secrets, "_values", set())
        patch.setattr(secrets, "_pattern", None)
        yield


# ------------------------------------------------------------------------------------------------ by pattern

@pytest.mark.parametrize("text,hidden", [
    ("PASSWORD=s3cret make", "s3cret"),
    ("export GPUPROV_REGISTRY_PASSWORD='s3 cret'", "s3 cret"),
    ("password: s3cret", "s3cret"),
    ("db_password = s3cret", "s3cret"),
    ("curl ...?token=s3cret", "s3cret"),
    ("Authorization: Bearer eyJhbGciOi.s3cret", "eyJhbGciOi.s3cret"),
    ("authorization: basic dXNlcjpzM2NyZXQ=", "dXNlcjpzM2NyZXQ="),
    ('{"user": "bob", "password": "s3 \\"cret"}', 's3 \\"cret'),
    ("{'client_secret': 's3cret'}", "s3cret"),
    ("https://bob:s3cret@mirror/x", "s3cret"),
    ("https://bob:p@ss@mirror/x", "ss@mirror"),
    ("https://ghp_s3cret@github.com/org/repo.git", "ghp_s3cret"),
    ("machine m/x login bob password s3cret", "s3cret"),
])
def test_patterns_mask_secrets_gpuprov_was_not_told_about(text, hidden):
    masked = secrets.mask(text)
    assert hidden not in masked and "***" in masked


@pytest.mark.parametrize("text", [
    "ssh://git@host/org/repo.git", "git clone ssh://git@host:2222/x", "the sudo password is wrong",
    "hosts.h1.sudo.password: the sudo password is never stored in an inventory",
    'sudo: {"password_env": "SUDO_PW", "nopasswd": false}', "PasswordAuthentication no",
    "permit_root_login: prohibit-password",
])
def test_patterns_leave_what_is_not_a_secret(text):
    assert secrets.mask(text) == text


LOGIN = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Z"), blacklist_characters="/\"'<>\\"),
               min_size=1, max_size=16)


@settings(max_examples=300, deadline=None)
@given(user=LOGIN, password=LOGIN, scheme=st.sampled_from(["https", "http", "ssh", "socks5h", "git+ssh"]))
def test_no_part_of_a_url_login_with_a_password_survives(user, password, scheme):
    assert secrets.mask(f"fetch {scheme}://{user}:{password}@mirror.internal/d/ failed") == (
        f"fetch {scheme}://***@mirror.internal/d/ failed")


def test_json_text_stays_valid_json_when_masked_by_pattern():
    text = json.dumps({"k": 'password=s"3\\cret x', "url": "http://u:p@h/", "password": "s3cret", "n": None})
    assert json.loads(secrets.mask(text)) == {"k": "password=*** x", "url": "http://***@h/", "password": "***",
                                              "n": None}


# -------------------------------------------------------------------------------------------------- by value

SECRET = st.text(min_size=1, max_size=12).filter(lambda s: s.strip("*"))


@settings(max_examples=300, deadline=None)
@given(secret=SECRET, before=st.text(max_size=20), after=st.text(max_size=20), others=st.lists(SECRET, max_size=3))
def test_a_registered_secret_never_survives_in_masked_text(secret, before, after, others):
    with fresh_registry():
        secrets.register(secret, *others)
        for value in (secret, *others):
            for shown in (secrets.mask(before + value + after), secrets.mask(before + value + after + before)):
                assert value not in shown


@settings(max_examples=200, deadline=None)
@given(secret=SECRET, before=st.text(max_size=20), after=st.text(max_size=20))
def test_a_registered_secret_never_survives_in_json_errors_or_reports(secret, before, after):
    with fresh_registry():
        secrets.register(secret)
        text = before + secret + after
        document = dump_json({"output": text, text: [text, {"nested": text}], "figures": [1.5, None]})
        for value in _strings(json.loads(document)):
            assert secret not in value
        error = GpuprovError(text, host="gpu01", step="s", command=text, output=text, hint=text)
        assert secret not in str(error)
        assert not any(secret in value for value in error.to_dict().values() if value)


def _strings(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def test_a_secret_is_masked_in_the_forms_output_carries_it():
    secrets.register("pä'ss\tw\"rd")
    for shown in ("pä'ss\tw\"rd", json.dumps("pä'ss\tw\"rd"), "p%C3%A4%27ss%09w%22rd", "pä'ss\\tw\"rd",
                  "'pä'\"'\"'ss\tw\"rd'"):
        assert secrets.mask(f"x {shown} y") in ("x *** y", 'x "***" y')


@pytest.mark.parametrize("url,hidden", [
    ("https://bob:p%40ss@torch.internal/simple", ("p%40ss", "p@ss")),
    ("https://bob:p@ss@torch.internal/simple", ("p@ss",)),
    ("https://TOKEN123@torch.internal/simple", ("TOKEN123",)),
])
def test_url_passwords_are_registered_decoded_and_as_written(url, hidden):
    secrets.register_url(url)
    for secret in hidden:
        assert secrets.mask(f"pip said: {secret} refused") == "pip said: *** refused"


def test_a_login_name_without_password_is_not_registered():
    secrets.register_url("ssh://git@host/org/repo.git")
    assert secrets.mask("git was here") == "git was here"


def test_the_registry_password_is_masked_everywhere_once_read():
    registry_auth({"GPUPROV_REGISTRY_USER": "ci", "GPUPROV_REGISTRY_PASSWORD": "Zq9-reg"})
    assert "Zq9-reg" not in dump_json({"log": "denied for Zq9-reg"})
    assert "Zq9-reg" not in str(GpuprovError("push failed", output="auth Zq9-reg"))


# ------------------------------------------------------------------------------------------------ sudo stdin

# A stand-in for sudo on PATH: `-S -p '' -k` then the command; with FAKE_SUDO_MODE=password it reads one line
# from stdin as real sudo -S does (one byte at a time) and refuses a wrong one; with nopasswd it reads nothing;
# with one-time-code it reads a second line, as a PAM stack with a one-time code prompt would.
FAKE_SUDO = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do case $1 in -p) shift;; esac; shift; done
if [ "$FAKE_SUDO_MODE" != nopasswd ]; then
  IFS= read -r pw; [ "$pw" = "$FAKE_SUDO_PASSWORD" ] || { echo "Sorry, try again." >&2; exit 1; }
fi
if [ "$FAKE_SUDO_MODE" = one-time-code ]; then IFS= read -r code; fi

exec "$@"
"""


class LocalChannel:
    """A paramiko channel stand-in that runs the command it is sent with the local sh, fed what it was sent."""

    def __init__(self, env: dict):
        self.env, self.stdin, self.command, self.done = env, b"", None, None

    def settimeout(self, timeout):
        pass

    def exec_command(self, command: str) -> None:
        self.command = command

    def sendall(self, data: bytes) -> None:
        self.stdin += data

    def shutdown_write(self) -> None:
        self.done = subprocess.run(["sh", "-c", self.command], input=self.stdin, capture_output=True,
                                   env=self.env, timeout=60)

    def recv_exit_status(self) -> int:
        return self.done.returncode

    def close(self) -> None:
        pass


def sudo_connection(tmp_path, monkeypatch, mode: str, password: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text(FAKE_SUDO)
    (bin_dir / "sudo").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SUDO_MODE": mode, "FAKE_SUDO_PASSWORD": "right pw",
           "HOME": str(tmp_path)}
    channels = []

    def open_session(timeout):
        channels.append(LocalChannel(env))
        return channels[-1]

    monkeypatch.setattr(connection, "_drain", lambda channel: (channel.done.stdout.decode(),
                                                                channel.done.stderr.decode()))
    conn = HostConnection(SimpleNamespace(name="gpu01", user="gpuadmin"), known_hosts=None)
    conn._conn = SimpleNamespace(is_connected=True, transport=SimpleNamespace(open_session=open_session))
    conn.set_sudo_password(password)
    return conn, channels


@pytest.mark.parametrize("mode", ["nopasswd", "password"])
def test_the_sudo_password_never_reaches_the_batch_with_or_without_nopasswd(tmp_path, monkeypatch, mode):
    pwned = tmp_path / "pwned"
    password = f"touch {pwned}" if mode == "nopasswd" else "right pw"
    conn, channels = sudo_connection(tmp_path, monkeypatch, mode, password)
    result = conn.run("sh -s", sudo=True, stdin="echo first line\necho second line\n")
    assert result.rc == 0, result.stderr
    assert not pwned.exists()  # the password line was not executed as a line of the batch
    assert result.stdout == "first line\nsecond line\n"
    assert password not in channels[0].command  # never on the command line (ps, sudo's log)
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and password.encode() in path.read_bytes()]


def test_a_wrong_sudo_password_is_refused_and_runs_nothing(tmp_path, monkeypatch):
    conn, _ = sudo_connection(tmp_path, monkeypatch, "password", "wrong pw")
    with pytest.raises(SudoError, match="sudo refused") as info:
        conn.run(f"touch {tmp_path}/ran", sudo=True)
    assert not (tmp_path / "ran").exists() and "wrong pw" not in str(info.value)


def test_a_sudo_that_reads_more_than_the_password_runs_nothing(tmp_path, monkeypatch):
    conn, _ = sudo_connection(tmp_path, monkeypatch, "one-time-code", "right pw")
    result = conn.run("sh -s", sudo=True, stdin=f"touch {tmp_path}/one\ntouch {tmp_path}/two\ntouch {tmp_path}/three\n")
    assert result.rc == 126 and "nothing was run" in result.stderr
    assert not list(tmp_path.glob("one")) + list(tmp_path.glob("two")) + list(tmp_path.glob("three"))


def test_the_command_keeps_stdin_byte_for_byte_after_the_password(tmp_path, monkeypatch):
    conn, _ = sudo_connection(tmp_path, monkeypatch, "nopasswd", "pw")
    data = "line one\n\n  spaced \\ back\\slash\nno newline at the end"
    assert conn.run("cat", sudo=True, stdin=data).stdout == data
    assert conn.run("cat", sudo=True).stdout == ""


def test_a_sudo_password_with_a_line_break_is_bad_input():
    conn = HostConnection(SimpleNamespace(name="gpu01", user="gpuadmin"), known_hosts=None)
    with pytest.raises(InputError, match="line break") as info:
        conn.set_sudo_password("first\nsecond")
    assert "first" not in str(info.value) and info.value.exit_code == 2


def test_the_sudo_password_is_masked_in_every_output_once_set():
    conn = HostConnection(SimpleNamespace(name="gpu01", user="gpuadmin"), known_hosts=None)
    conn.set_sudo_password("Xk7-sudo")
    assert "Xk7-sudo" not in dump_json({"stderr": "echo Xk7-sudo"}) + str(GpuprovError("x Xk7-sudo"))


def test_mirror_and_proxy_passwords_are_registered_when_provisioning_plans_them():
    from helpers.ops import bare_facts, ctx_for, make_repo, make_stack

    from gpuprov.provision.ops import sources

    repo = make_repo(url="https://bob:Mi%40rr0r@mirror.internal/d/", proxy="http://px:Pr0xy%21@p:3128")
    list(sources.changes(ctx_for(bare_facts(), make_stack(), repo)))
    shown = secrets.mask("apt: 401 for bob with Mi@rr0r; proxy px refused Pr0xy!")
    assert shown == "apt: 401 for bob with ***; proxy px refused ***"


KEYS = ["password", "PassWord", "pa\u017f\u017fword", "token", "to\u212aen", "TOKEN", "secret", "db_secret",
        "\"password\"", "'token'"]
SCHEMES = ["Bearer", "basic", "TOKEN", "Digest"]
AUTHORIZATION = ["authorization", "Authorization", "author\u0130zat\u0131on", "AUTHORIZATION", "\"authorization\""]
VALUES = ["x", "s3cr3t", "\"q w\"", "'q'", "a\\\"b", ""]
NOISE = ["", " ", "\n", "x", "key", "url ", "=", ":", "@"]
SETTING = st.tuples(st.sampled_from(KEYS), st.sampled_from(["=", ": ", " = ", ":", "\t:\t"]),
                    st.sampled_from(VALUES)).map("".join)
HEADER = st.tuples(st.sampled_from(AUTHORIZATION), st.sampled_from([": ", "=", ":"]), st.sampled_from(SCHEMES),
                   st.just(" "), st.sampled_from(VALUES)).map("".join)
LOGIN = st.tuples(st.sampled_from(["https", "HTTP", "ssh", "git+ssh"]), st.just("://"),
                  st.sampled_from(["u:p", "tok", "u:p@ss", "git"]), st.just("@host/x")).map("".join)
AUTH_CONF = st.sampled_from(["machine h login u password ", "machine h login u password \"q\"", "Machine h"]).map(
    lambda head: head + "pw")
PIECE = st.one_of(SETTING, HEADER, LOGIN, AUTH_CONF, st.sampled_from(NOISE))


@given(st.lists(PIECE, max_size=5).map("".join))
@settings(max_examples=500, deadline=None)
def test_the_quick_word_checks_never_skip_what_the_patterns_mask(text):
    """mask() runs each pattern only where its words are present; on text made of settings, headers, URL logins and
    auth.conf entries (their words in other cases and with the Unicode letters re.IGNORECASE takes for ASCII
    ones), masking equals applying every pattern unconditionally."""
    module = secrets
    everything = module._by_value(text, set())
    for pattern, replace in ((module._URL_LOGIN, module._url_login), (module._AUTH_CONF, r"\g<1>" + module.MASK),
                             (module._AUTHORIZATION, module._keep_quotes),
                             (module._QUOTED_SETTING, module._keep_quotes), (module._SETTING, module._setting)):
        everything = pattern.sub(replace, everything)
    assert secrets.mask(text) == module._by_value(everything, set())
