"""The repository op: pinned signing key, sources list / repo file, proxy, CA, quoting."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest
from helpers.ops import FPR, bare_facts, ctx_for, make_repo, make_stack, provisioned_facts
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.core.errors import InputError, mask_credentials
from gpuprov.provision.ops import sources


def plan(family="debian", facts=None, **repo):
    facts = facts or bare_facts(family)
    return list(sources.changes(ctx_for(facts, make_stack(family), make_repo(**repo))))


# The bare Debian host, Debian with a proxy and a CA, and the RHEL repo file are data cases:
# tests/unit/operations/sources/*.json.


def test_in_state_sources_change_nothing_and_removed_proxy_is_removed():
    facts = provisioned_facts("debian", make_stack(), make_repo())
    assert plan(facts=facts) == []
    facts["files"][sources.APT_PROXY] = "old proxy conf\n"
    changes = plan(facts=facts)
    assert changes[0].commands == (f"rm -f {sources.APT_PROXY}",)
    assert changes[-1].summary.startswith("refresh")


def test_changed_fingerprint_refetches_the_key():
    facts = provisioned_facts("debian", make_stack(), make_repo())
    other = "0" * 40
    changes = plan(facts=facts, fingerprint=other)
    assert other in changes[0].summary


@pytest.mark.parametrize("evil", ["http://m/$(touch${IFS}/tmp/x)/", "http://m/;reboot;/", "http://m/`id`'\"/"])
def test_metacharacters_in_mirror_and_proxy_stay_data(evil):
    proxy = evil.replace('"', "")
    changes = plan(url=evil, key_url=evil + "key.pub", proxy=proxy)
    key = next(c for c in changes if "signing key" in c.summary)
    words = shlex.split(key.commands[1])
    assert evil + "key.pub" in words and proxy in words
    for change in changes:
        for command in change.commands:
            for word in shlex.split(command):
                if evil in word:
                    # only ever inside a quoted data argument (file content or a URL word)
                    assert word in (evil + "key.pub", proxy) or word.startswith(("# Managed", "// Managed"))


def by_path(changes) -> dict:
    return {c.summary.split(" ")[1]: c for c in changes if c.summary.startswith(("create", "update", "remove"))}


def test_mirror_and_proxy_logins_go_to_an_apt_auth_file_readable_by_root_only():
    """apt_auth.conf(5): `machine [protocol://]hostname[:port][/path] login NAME password SECRET`; without a
    protocol an entry matches https only."""
    changes = plan(url="https://bob:s3cr%40t@mirror.internal/nvidia/debian12/x86_64/",
                   proxy="http://px:pw@proxy.internal:3128")
    files = by_path(changes)
    auth = files[sources.APT_AUTH]
    written = shlex.split(auth.commands[0])
    assert written[written.index("printf") + 2] == (
        "machine https://mirror.internal/nvidia/debian12/x86_64 login bob password s3cr@t\n"
        "machine http://proxy.internal:3128 login px password pw\n")
    assert "chmod 0600" in auth.commands[0]
    assert files[sources.APT_LIST].diff.endswith(
        f"+deb [signed-by={sources.APT_KEYRING}] https://mirror.internal/nvidia/debian12/x86_64/ /\n")
    assert 'Acquire::https::Proxy "http://proxy.internal:3128";' in files[sources.APT_PROXY].diff
    assert "chmod 0644" in files[sources.APT_PROXY].commands[0]
    for change in changes:
        shown = change.summary + (change.diff or "") + mask_credentials(" ".join(change.commands))
        assert "s3cr" not in shown and "pw" not in shown.replace("pwd", "")
    assert "+machine https://mirror.internal/nvidia/debian12/x86_64 login bob password ***\n" in auth.diff


def test_logins_removed_from_the_inventory_remove_the_auth_file():
    facts = provisioned_facts("debian", make_stack(), make_repo())
    facts["files"][sources.APT_AUTH] = "machine https://mirror.internal login bob password old\n"
    changes = plan(facts=facts)
    assert changes[0].commands == (f"rm -f {sources.APT_AUTH}",)
    assert "password ***" in changes[0].diff and "old" not in changes[0].diff


def test_rhel_repo_file_with_logins_is_root_only_and_masked():
    changes = plan("rhel", url="https://bob:s3cret@mirror.internal/rhel9/", proxy="http://px:pw@p:3128")
    repo = by_path(changes)[sources.DNF_REPO]
    for line in ("baseurl=https://mirror.internal/rhel9/", "username=bob", "password=***", "proxy=http://p:3128",
                 "proxy_username=px", "proxy_password=***"):
        assert f"+{line}\n" in repo.diff
    assert "s3cret" not in repo.diff and "chmod 0600" in repo.commands[0]
    assert "s3cret" in repo.commands[0] and "s3cret" not in mask_credentials(repo.commands[0])
    plain = by_path(plan("rhel", url="https://mirror.internal/rhel9/"))[sources.DNF_REPO]
    assert "chmod 0644" in plain.commands[0] and "username=" not in plain.diff


@pytest.mark.parametrize("url", ["https://bob@m/x/", "https://bob:@m/x/", "https://bob:a%20b@m/x/",
                                 "https://bob:it%27s@m/x/"])
def test_logins_that_auth_conf_cannot_carry_are_refused_without_showing_them(url):
    with pytest.raises(InputError, match="need a user and a password") as info:
        plan(url=url)
    assert "a b" not in str(info.value) and "it's" not in str(info.value)


def test_mask_credentials_masks_urls_auth_conf_entries_and_password_settings_and_keeps_json_valid():
    text = ("https://bob:s3cret@m/x machine m/x login bob password s3cret\npassword=s3cret\n"
            "proxy_password = s3cret\n")
    assert "s3cret" not in mask_credentials(text)
    assert mask_credentials("the sudo password is wrong") == "the sudo password is wrong"
    dumped = json.dumps({"commands": ["printf %s 'machine m login bob password s\"3\\cret\n' > f"],
                         "diff": "+password=s3cret\n+proxy=http://p\n"})
    masked = mask_credentials(dumped)
    assert "cret" not in masked and json.loads(masked)["diff"] == "+password=***\n+proxy=http://p\n"


@pytest.mark.parametrize("repo,match", [
    ({"fingerprint": None}, "not a 40-digit"),
    ({"fingerprint": "ABCD"}, "not a 40-digit"),
    ({"url": "http://m/ /\ndeb http://evil/ /"}, "without spaces"),
    ({"url": "ftp://m/"}, "http"),
    ({"proxy": 'http://p:3128";'}, "proxy"),
    ({"key_url": None}, "no signing key"),
    ({"key_url": "/local/key.asc"}, "no signing key"),
    ({"ca_pem": "not a cert"}, "PEM"),
])
def test_bad_repository_input_is_rejected_before_any_command(repo, match):
    with pytest.raises(InputError, match=match) as info:
        plan(**repo)
    assert info.value.exit_code == 2 and info.value.step == "sources"


def test_fingerprint_with_spaces_and_lower_case_is_normalized():
    spaced = " ".join(FPR[i:i + 4] for i in range(0, 40, 4)).lower()
    assert FPR in plan(fingerprint=spaced)[0].summary


@settings(max_examples=60)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1))
def test_any_url_path_is_quoted(path):
    url = "https://m/" + path
    for change in plan(url=url, key_url=url):
        for command in change.commands:
            shlex.split(command)
    key = plan(url=url, key_url=url)[0]
    assert url in shlex.split(key.commands[1])


# --- the key check, run for real with gpg --------------------------------------------------------------

def _make_key(home, uid):
    subprocess.run(["gpg", "--batch", "--homedir", str(home), "--passphrase", "", "--quick-gen-key", uid,
                    "ed25519", "sign", "never"], check=True, capture_output=True)
    listing = subprocess.run(["gpg", "--homedir", str(home), "--with-colons", "--list-keys", uid],
                             check=True, capture_output=True, text=True).stdout
    fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))
    armored = subprocess.run(["gpg", "--homedir", str(home), "--armor", "--export", fpr],
                             check=True, capture_output=True, text=True).stdout
    return fpr, armored


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    if shutil.which("gpg") is None:
        pytest.skip("gpg is not installed")
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    return _make_key(home, "gpuprov test <a@example.org>"), _make_key(home, "attacker <b@example.org>")


def _run_key(tmp_path, key_data, fpr, armored=False):
    keyring, stamp = tmp_path / "keyrings" / "k.gpg", tmp_path / "stamp"
    command = sources.key_command(None, key_data, fpr, str(keyring), armored, str(stamp))
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return result, keyring, stamp


@pytest.mark.tool
def test_key_with_the_pinned_fingerprint_is_installed(tmp_path, keys):
    (fpr, armored), _ = keys
    result, keyring, stamp = _run_key(tmp_path, armored, fpr)
    assert result.returncode == 0, result.stderr
    assert stamp.read_text() == fpr + "\n"
    shown = subprocess.run(["gpg", "--with-colons", "--show-keys", str(keyring)], capture_output=True,
                           text=True, env={"GNUPGHOME": str(tmp_path)}).stdout
    assert fpr in shown and not keyring.read_bytes().startswith(b"-----BEGIN")


@pytest.mark.tool
def test_key_with_another_fingerprint_is_refused_loudly(tmp_path, keys):
    (fpr, _), (_, attacker) = keys
    result, keyring, stamp = _run_key(tmp_path, attacker, fpr)
    assert result.returncode == 1
    assert f"expected {fpr}; not trusting it" in result.stderr
    assert not keyring.exists() and not stamp.exists()


@pytest.mark.tool
def test_key_file_smuggling_a_second_key_is_refused(tmp_path, keys):
    (fpr, armored), (_, attacker) = keys
    result, keyring, _ = _run_key(tmp_path, armored + attacker, fpr)
    assert result.returncode == 1 and not keyring.exists()


@pytest.mark.tool
def test_armored_export_for_rpm(tmp_path, keys):
    (fpr, armored), _ = keys
    result, keyring, _ = _run_key(tmp_path, armored, fpr, armored=True)
    assert result.returncode == 0, result.stderr
    assert keyring.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


@pytest.mark.tool
def test_the_key_fetch_gives_curl_its_proxy_on_stdin():
    """curl reads `proxy = "URL"` from `-K -`: the request goes to the proxy (a closed local port here), and the
    proxy's login never appears on a command line."""
    from gpuprov.provision.ops.sources import key_command

    command = key_command("http://key.invalid/key.pub", None, FPR, "/nonexistent/k.gpg", False, "/nonexistent/s",
                          "http://user:pw@127.0.0.1:9")
    fetch = command[command.index("printf 'proxy"):command.index(" && got=")].replace('"$d/key"', "/dev/null")
    assert "user:pw" not in fetch.split("|", 1)[1]
    proc = subprocess.run(["sh", "-c", fetch.replace("--retry 3", "--retry 0")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "127.0.0.1 port 9" in proc.stderr
