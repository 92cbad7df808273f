"""Debian version ordering and syntax, judged by the real `dpkg --compare-versions` (the outside judge): which
versions dpkg calls bad syntax, and the order of the rest."""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest

from gpuprov.core.debversion import InvalidVersion, check, compare_versions, is_valid, nearest
from gpuprov.core.errors import InputError

# epochs, ~ (below everything, even the end), +, letters against digits, leading zeros, several hyphens and
# colons, NVIDIA's and RPM-like revisions, and versions dpkg refuses: errors (`1.0-`, `1:`) and warnings (`a1.0`)
VERSIONS = [
    "1.0", "1.0-1", "1.0-0", "0:1.0", "1:1.0", "1:0.9", "2:0", "1.0~rc1", "1.0~rc1-1", "1.0~~", "1.0~~a", "1.0~",
    "1.0a", "1.0+dfsg", "1.0+dfsg-1~bpo12+1", "1.0-1+b1", "1.0-1~", "1.0+", "1.0.0", "1.00", "1.2.3-4-5",
    "1:2:3", "1:1.0:1-2", "009", "9", "570.86.15-1ubuntu1", "570.148.08-1ubuntu1", "3:570.133.20-1.el9",
    "10.0", "2.0~beta+git20240101-0ubuntu1", "0-pre", "0-pree", "9.9.9-z", "4294967295",
    "1.0-", "a1.0", "1:", ":1.0", "x:1.0", "1.0:1", "1:-1", "1.0-a:b", "1.0_1", "1.0^1", "1.0-a_b", "~1", "+1",
    ".1", "1:a", "1 0", "99999999999:1", "1.0-1.el9_3", "1.0é",
]

pytestmark = pytest.mark.tool


@pytest.fixture(scope="module")
def dpkg():
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg is not installed")

    def run(a: str, op: str, b: str) -> subprocess.CompletedProcess:
        return subprocess.run(["dpkg", "--compare-versions", "--", a, op, b], capture_output=True, text=True)
    return run


def test_invalid_exactly_where_dpkg_says_bad_syntax(dpkg):
    for version in VERSIONS:
        judged = dpkg(version, "eq", version)
        assert is_valid(version) == ("bad syntax" not in judged.stderr), (version, judged.stderr)


def test_valid_versions_sort_as_dpkg_orders_them(dpkg):
    valid = [v for v in VERSIONS if is_valid(v)]
    assert len(valid) > 30
    ordered = sorted(valid, key=functools.cmp_to_key(compare_versions))
    # dpkg's order is transitive: each neighbour pair judged by dpkg settles every pair
    for lower, higher in zip(ordered, ordered[1:], strict=False):
        same = compare_versions(lower, higher) == 0
        assert dpkg(lower, "eq" if same else "lt", higher).returncode == 0, (lower, higher, same)
        assert compare_versions(higher, lower) == (0 if same else 1)


@pytest.mark.parametrize(("version", "reason"), [
    ("1.0-", "revision number is empty"), ("a1.0", "version number does not start with digit"),
    ("1:", "nothing after colon in version number"), ("1.0:1", "epoch in version is not number"),
    ("1.0_1", "invalid character in version number"), ("1 0", "version string has embedded spaces"),
    ("99999999999:1", "epoch in version is too big"), ("", "version string is empty"),
])
def test_invalid_versions_are_input_errors_with_dpkgs_reason(dpkg, version, reason):
    if version:
        assert f"has bad syntax: {reason}" in dpkg(version, "eq", version).stderr
    with pytest.raises(InvalidVersion) as caught:
        check(version)
    assert isinstance(caught.value, InputError) and caught.value.exit_code == 2
    assert caught.value.reason == reason and "Debian Policy" in caught.value.hint
    with pytest.raises(InvalidVersion):
        compare_versions("1.0", version)
    with pytest.raises(InvalidVersion):
        nearest(version, ["1.0"])


def test_the_message_shows_a_control_character_escaped():
    with pytest.raises(InvalidVersion) as caught:
        check("1.0\x1b[31m")
    assert "\x1b" not in str(caught.value) and "\\x1b" in str(caught.value)


def test_nearest_leaves_out_what_a_repository_lists_but_dpkg_refuses():
    assert nearest("1.0-2", ["1.0-1", "1.0-", "a1.0", "1.0-3"]) == ["1.0-1", "1.0-3"]
