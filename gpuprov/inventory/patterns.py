"""Ansible host patterns, as Ansible expands them in its YAML and INI inventories.

A pattern is a host name with optional ranges and an optional port: `gpu[01:08]` (gpu01 .. gpu08, zero padded
as the begin is written), `gpu[1:8]`, `db-[a:f]` (letters), `www[01:50:2]` (a step), `rack[1:2]-gpu[1:4]`
(every combination), `gpu01:2222` and `[fd00::1]:2222` (a port). An empty begin is 0. Numbers are ASCII
digits only. Ranges add at most MAX_RANGE_HOSTS hosts to one inventory, counted before anything is expanded.
"""

from __future__ import annotations

import ipaddress
import itertools
import math
import string
from collections.abc import Callable, Sequence

from gpuprov.inventory.model import ascii_digits, parse_port

MAX_RANGE_HOSTS = 100_000


class PatternError(ValueError):
    """A host pattern that cannot be expanded; str() says why."""


def expand_host_pattern(pattern: str, left: int = MAX_RANGE_HOSTS) -> tuple[list[str], int | None]:
    """(host names, port or None) of a pattern; `left`: how many hosts ranges may still add (a pattern that makes
    N hosts adds N - 1 to the one line it is)."""
    name, port = _split_port(pattern)
    if "[" not in name and "]" not in name:
        return [name], port
    parts = _parts(pattern, name)
    count = math.prod(len(seq) for seq, _ in parts[1::2])
    if count - 1 > left:
        added = f"; earlier ranges added {MAX_RANGE_HOSTS - left}" if left < MAX_RANGE_HOSTS else ""
        raise PatternError(f"host range {pattern!r} makes {count} hosts; ranges add up to {MAX_RANGE_HOSTS} hosts "
                           f"to an inventory{added}")
    texts = [[text] for text in parts[0::2]]
    choices = [[fmt(item) for item in seq] for seq, fmt in parts[1::2]]
    combined = [texts[0]] + [group for pair in zip(choices, texts[1:], strict=True) for group in pair]
    return ["".join(pieces) for pieces in itertools.product(*combined)], port


def _split_port(pattern: str) -> tuple[str, int | None]:
    """`name:port` -> (name, port); `[v6]:port` -> (v6, port); several colons outside brackets: an IPv6
    address without a port."""
    if pattern.startswith("["):
        inside, _, rest = pattern[1:].partition("]")
        if _is_ipv6(inside) and (not rest or rest.startswith(":")):
            return inside, _port(pattern, rest[1:]) if rest else None
    depth, colons = 0, []
    for index, char in enumerate(pattern):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == ":" and depth == 0:
            colons.append(index)
    if len(colons) != 1:
        return pattern, None
    return pattern[:colons[0]], _port(pattern, pattern[colons[0] + 1:])


def _port(pattern: str, text: str) -> int:
    try:
        return parse_port(text)
    except ValueError as exc:
        raise PatternError(f"host pattern {pattern!r}: {exc}") from None


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def _parts(pattern: str, name: str) -> list:
    """[text, (range, format), text, (range, format), ..., text]."""
    parts: list = []
    rest = name
    while "[" in rest or "]" in rest:
        head, bracket, body_tail = rest.partition("[")
        body, close, tail = body_tail.partition("]")
        if not bracket or not close or "[" in body:
            raise PatternError(f"host pattern {pattern!r}: a range is [begin:end] or [begin:end:step], with one "
                               "[ and one ]")
        parts += [head, _range(pattern, body)]
        rest = tail
    return [*parts, rest]


def _range(pattern: str, body: str) -> tuple[Sequence, Callable]:
    """The items of one `[begin:end]` or `[begin:end:step]`, and how to write each."""
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise PatternError(f"host range {pattern!r}: write [{body}] as [begin:end] or [begin:end:step]")
    begin, end = bounds[0] or "0", bounds[1]
    step = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise PatternError(f"host range {pattern!r}: [{body}] needs an end")
    for text in (begin, end, step):
        if not text.isascii() and any(ch.isdigit() or ch.isnumeric() for ch in text):
            raise PatternError(f"host range {pattern!r}: {text!r} has digits that are not ASCII; write it with "
                               "the digits 0-9")
    if not ascii_digits(step) or int(step) < 1:
        raise PatternError(f"host range {pattern!r}: the step {step!r} must be a whole number >= 1")
    letters = string.ascii_letters
    if len(begin) == 1 and len(end) == 1 and begin in letters and end in letters:
        if letters.index(begin) > letters.index(end):
            raise PatternError(f"host range {pattern!r}: {begin!r} comes after {end!r} (a-z, then A-Z)")
        return letters[letters.index(begin):letters.index(end) + 1:int(step)], str
    if not (ascii_digits(begin) and ascii_digits(end)):
        raise PatternError(f"host range {pattern!r}: begin and end must both be numbers or both single letters, "
                           f"not {begin!r} and {end!r}")
    if int(begin) > int(end):
        raise PatternError(f"host range {pattern!r}: begin {begin} is greater than end {end}")
    width = len(begin) if begin.startswith("0") and len(begin) > 1 else 0
    if width and len(end) != width:
        raise PatternError(f"host range {pattern!r}: a zero-padded begin and its end have the same number of "
                           f"digits, like [01:08]; not [{begin}:{end}]")
    return range(int(begin), int(end) + 1, int(step)), lambda number: str(number).zfill(width)
