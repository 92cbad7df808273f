"""Debian package version ordering (dpkg's algorithm, Debian Policy 5.6.12), in pure Python."""

from __future__ import annotations

import functools
from collections.abc import Iterable


def nearest(version: str, available: Iterable[str]) -> list[str]:
    """The available versions just below and just above `version` in Debian ordering (one each at most)."""
    ordered = sorted(set(available), key=functools.cmp_to_key(compare_versions))
    below = [v for v in ordered if compare_versions(v, version) < 0][-1:]
    above = [v for v in ordered if compare_versions(v, version) > 0][:1]
    return below + above


def compare_versions(a: str, b: str) -> int:
    """dpkg's version ordering (Debian Policy 5.6.12): -1, 0 or 1 as `a` is lower than, equal to or higher
    than `b`. `[epoch:]upstream[-revision]`; the epoch compares as a number, the rest part by part."""
    (epoch_a, up_a, rev_a), (epoch_b, up_b, rev_b) = _split_version(a), _split_version(b)
    result = (epoch_a > epoch_b) - (epoch_a < epoch_b) or _compare_part(up_a, up_b) or _compare_part(rev_a, rev_b)
    return (result > 0) - (result < 0)


def _split_version(version: str) -> tuple[int, str, str]:
    epoch, colon, rest = version.partition(":")
    if not colon:
        epoch, rest = "0", version
    upstream, dash, revision = rest.rpartition("-")
    number = int(epoch) if epoch.isascii() and epoch.isdigit() else 0
    return (number, upstream, revision) if dash else (number, rest, "")


_DIGITS = frozenset("0123456789")


def _order(char: str) -> int:
    """dpkg's weight of a non-digit: `~` below the end of the string, letters next, then everything else."""
    if char == "~":
        return -1
    if not char or char in _DIGITS:
        return 0
    return ord(char) if char.isascii() and char.isalpha() else ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (compared by weight) and digit runs (compared as numbers)."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and a[i] not in _DIGITS) or (j < len(b) and b[j] not in _DIGITS):
            ac, bc = _order(a[i] if i < len(a) else ""), _order(b[j] if j < len(b) else "")
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        start_i, start_j = i, j
        while i < len(a) and a[i] in _DIGITS:
            i += 1
        while j < len(b) and b[j] in _DIGITS:
            j += 1
        diff = int(a[start_i:i] or 0) - int(b[start_j:j] or 0)
        if diff:
            return diff
    return 0
