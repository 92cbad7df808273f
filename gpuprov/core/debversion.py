"""Debian package version ordering through python-debian, after dpkg's own syntax checks (Debian Policy 5.6.12).

python-debian orders versions as dpkg does but parses leniently (it takes `1.0-` and `a1.0`); `check` refuses
every version dpkg calls "bad syntax", with dpkg's reason, so a version Debian rejects is never ordered.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from debian.debian_support import version_compare

from gpuprov.core.errors import InputError, literal

_EPOCH_MAX = 2**31 - 1   # dpkg: "epoch in version is too big" above INT_MAX
_DIGITS = re.compile(r"[0-9]*")
_UPSTREAM = re.compile(r"[A-Za-z0-9.+~:-]*")
_REVISION = re.compile(r"[A-Za-z0-9.+~]*")


class InvalidVersion(InputError):
    """A version dpkg refuses (bad syntax); `reason` is dpkg's."""

    def __init__(self, version: str, reason: str):
        super().__init__(f"not a Debian version: '{literal(version)}' ({reason})",
                         hint="write [epoch:]upstream[-revision]: upstream starts with a digit and holds letters, "
                              "digits and . + ~ - (: after an epoch), the revision letters, digits and . + ~ "
                              "(Debian Policy 5.6.12)")
        self.version = version
        self.reason = reason


def problem(version: str) -> str | None:
    """dpkg's reason for refusing `version` (its error or warning text), or None for a valid one."""
    if not version:
        return "version string is empty"
    if any(char.isspace() for char in version):
        return "version string has embedded spaces"
    epoch, colon, rest = version.partition(":")
    if colon:
        digits = _DIGITS.match(epoch).group()
        if not digits:
            return "epoch in version is empty"
        if digits != epoch:
            return "epoch in version is not number"
        if int(epoch) > _EPOCH_MAX:
            return "epoch in version is too big"
        if not rest:
            return "nothing after colon in version number"
    else:
        rest = version
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, None
    if revision == "":
        return "revision number is empty"
    if not upstream:
        return "version number is empty"
    if not upstream[0].isascii() or not upstream[0].isdigit():
        return "version number does not start with digit"
    if not _UPSTREAM.fullmatch(upstream):
        return "invalid character in version number"
    if revision is not None and not _REVISION.fullmatch(revision):
        return "invalid character in revision number"
    return None


def is_valid(version: str) -> bool:
    """Whether dpkg takes `version` without complaint."""
    return problem(version) is None


def check(version: str) -> str:
    """`version` itself, or InvalidVersion (bad input, exit 2) with dpkg's reason."""
    reason = problem(version)
    if reason is not None:
        raise InvalidVersion(version, reason)
    return version


def compare_versions(a: str, b: str) -> int:
    """dpkg's version ordering: -1, 0 or 1 as `a` is lower than, equal to or higher than `b`. InvalidVersion
    when either is not a Debian version."""
    result = version_compare(check(a), check(b))
    return (result > 0) - (result < 0)


def nearest(version: str, available: Iterable[str]) -> list[str]:
    """The available versions just below and just above `version` in Debian ordering (one each at most).
    `version` must be valid (InvalidVersion); available ones that are not (a repository's odd entry) cannot be
    ordered and are left out."""
    check(version)
    ordered = sorted({v for v in available if is_valid(v)}, key=functools.cmp_to_key(compare_versions))
    below = [v for v in ordered if compare_versions(v, version) < 0][-1:]
    above = [v for v in ordered if compare_versions(v, version) > 0][:1]
    return below + above
