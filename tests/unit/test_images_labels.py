"""The OCI `source` label: the origin remote without any part of a login, query or fragment, whatever the login
holds (an unescaped `@` in a password today leaked what follows it)."""

from __future__ import annotations

import subprocess
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.images.labels import provenance, public_source


def git(root, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.mark.tool
def test_the_source_label_of_a_checkout_keeps_no_login(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "remote", "add", "origin", "https://u:p@ss@git.example.org/org/repo.git")
    assert provenance(tmp_path).source == "https://git.example.org/org/repo.git"


@pytest.mark.parametrize("remote,shown", [
    ("https://u:p@ss@host/org/r.git", "https://host/org/r.git"),
    ("https://oauth2:tok@host:8443/org/r.git?private_token=x#frag", "https://host:8443/org/r.git"),
    ("ssh://git@host:2222/org/r.git", "ssh://host:2222/org/r.git"),
    ("https://[2001:db8::1]:443/r.git", "https://[2001:db8::1]:443/r.git"),
    ("https://Git.Example.org/r.git", "https://Git.Example.org/r.git"),
    ("git@github.com:org/r.git", "github.com:org/r.git"),
    ("/srv/git/r.git", "/srv/git/r.git"),
    ("https://u:p@host:99999/r.git", None),  # a bad port: nothing rather than a guess
    ("https://u:p@/r.git", None),
])
def test_source_label_examples(remote, shown):
    assert public_source(remote) == shown


LOGIN = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"),
                              blacklist_characters="/?#[]\\"), min_size=1, max_size=16)
HOST = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,10}(\.[A-Za-z][A-Za-z0-9-]{0,10}){0,2}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(user=LOGIN, password=st.none() | LOGIN, host=HOST, port=st.none() | st.integers(1, 65535),
       scheme=st.sampled_from(["https", "http", "ssh", "git+ssh"]))
def test_no_part_of_a_login_survives(user, password, host, port, scheme):
    login = user if password is None else f"{user}:{password}"
    netloc = host + ("" if port is None else f":{port}")
    assert public_source(f"{scheme}://{login}@{netloc}/org/repo.git") == f"{scheme}://{netloc}/org/repo.git"


@settings(max_examples=300, deadline=None)
@given(user=LOGIN, password=LOGIN, host=HOST)
def test_a_percent_encoded_login_does_not_survive_either(user, password, host):
    login = urllib.parse.quote(user, safe="") + ":" + urllib.parse.quote(password, safe="")
    assert public_source(f"https://{login}@{host}/r.git") == f"https://{host}/r.git"
