"""Host patterns for --host, with the meaning of Ansible's `--limit` (ansible-core 2.19, inventory/manager.py).

A value is a list of patterns. With a comma it splits at each comma only; without one it stays whole when it reads
as one address (`gpu01`, `gpu01:2222`, `fd00::1`, `[fd00::1]:22`, `gpu[01:04]`), else it splits at colons and
spaces outside brackets. Each pattern is a host or group name, a wildcard (`gpu*`, fnmatch, case-sensitive) or a
regex (`~gpu0[1-4]$`, matched from the start of a name), optionally followed by positions `[i]`, `[i:j]` (both
included) or `[i:]` in what it selects: every host of each group it names, in Ansible's group order (the group's own
hosts, then its children's, level by level), then for a wildcard or regex the hosts it names too. A pattern starting
with `&` intersects, with `!` excludes; the plain ones are joined first, then the `&`, then the `!` ones; only `&`
and `!` ones start from every host. `all` (every host) and `ungrouped` are groups, as in Ansible.

Where Ansible warns and goes on, gpuprov stops: every pattern must select a host (an exclusion with a typo would
spare nothing), and so must the whole. Positions Ansible's documentation and code read differently are refused:
`[i-j]` (Ansible: positions; a shell reader: names), `[i:0]` with i > 0 (documentation: nothing; code: host i).
Within a group, hosts are in inventory order (Ansible: the order the group lists them), and a host both in a group
and in its child counts as the child's: positions can differ from Ansible's only there.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuprov.core.errors import literal
from gpuprov.inventory.diagnostics import suggest

_NUM_RANGE = r"\[[0-9]+:[0-9]+(?::[0-9]+)?\]"
_HEX_RANGE = r"\[[0-9a-f]+:[0-9a-f]+(?::[0-9]+)?\]"
_ALNUM_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_V4_PART = rf"(?:[01]?[0-9]{{1,2}}|2[0-4][0-9]|25[0-5]|{_NUM_RANGE})"
_V6_PART = rf"(?:[0-9a-f]{{1,4}}|{_HEX_RANGE})"
_DOTTED = rf"(?:{_V6_PART}\.){{3}}{_V6_PART}"
_V6_FORMS = [rf"(?:{_V6_PART}:){{7}}{_V6_PART}", rf"(?:{_V6_PART}:){{1,6}}:",
             *[rf"(?:{_V6_PART}:){{{n}}}(?::{_V6_PART}){{1,{7 - n}}}" for n in range(1, 7)],
             rf":(?::{_V6_PART}){{1,6}}", rf"{_V6_PART}?::",
             rf"(?:0:){{6}}{_DOTTED}", rf"::(?:ffff:)?{_DOTTED}", rf"(?:0:){{5}}ffff:{_DOTTED}"]
_LABEL = rf"(?:\w|{_ALNUM_RANGE})(?:[\w-]|{_ALNUM_RANGE})*(?<![_-])"
_HOST_FORMS = [re.compile(rf"(?:{_V4_PART}\.){{3}}{_V4_PART}", re.I), re.compile("|".join(_V6_FORMS), re.I),
               re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.I)]
_BRACKETED_PORT = re.compile(r"\[(.+)\]:[0-9]+")
_HOST_PORT = re.compile(r"((?:[^:\[\]]|\[[^\]]*\])*):[0-9]+")
_COLON_ITEM = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
_SUBSCRIPT = re.compile(r"(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]")
_WILD = (".", "?", "*", "[")
_ZERO_PADDED = re.compile(r"(?<![0-9])-?0[0-9]")   # gpu[01:04]: names written as positions


def is_address(text: str) -> bool:
    """Whether Ansible reads `text` as one host address with an optional port (parse_address with ranges)."""
    for form in (_BRACKETED_PORT, _HOST_PORT):
        port = form.fullmatch(text)
        text = port.group(1) if port else text
    return any(form.fullmatch(text) for form in _HOST_FORMS)


def split_patterns(value: str) -> list[str]:
    """One --host value as Ansible's list of patterns (split_host_pattern). ValueError for an empty part, which
    Ansible drops: `$RACK:!gpu03` with RACK unset would become `!gpu03`, every host but one."""
    if "," in value:
        items = value.split(",")
    elif is_address(value):
        items = [value]
    else:
        found = list(_COLON_ITEM.finditer(value))
        items = [match.group() for match in found]
        ends = [0, *(edge for match in found for edge in match.span()), len(value)]
        gaps = [value[ends[i]:ends[i + 1]] for i in range(0, len(ends), 2)]
        if any(gap.count(":") > (0 if i in (0, len(gaps) - 1) else 1) for i, gap in enumerate(gaps)):
            raise ValueError("has an empty part between colons: a part left out would widen the selection (an "
                             "unset shell variable?)")
    if any(not item.strip() for item in items):
        raise ValueError("has an empty part: a part left out would widen the selection (an unset shell variable?)")
    return [item.strip() for item in items]


@dataclass(frozen=True)
class Pattern:
    """One pattern: as written, its operator (`|` join, `&` intersect, `!` exclude), the expression before its
    positions and the positions, (index, None) or (first, last) with last -1 for `[i:]`."""

    text: str
    op: str
    expr: str
    positions: tuple[int, int | None] | None


def parse_pattern(text: str) -> Pattern:
    """A pattern as written; ValueError for one Ansible reads in a way its documentation does not say."""
    op = text[0] if text[0] in "&!" else "|"
    body = text[1:] if op != "|" else text
    if not body:
        raise ValueError(f"{op!r} needs a host or group pattern after it")
    if body.startswith("~") and not body[1:].strip("^$"):
        raise ValueError("an empty regular expression would select every host (an unset shell variable?)")
    match = None if body.startswith("~") else _SUBSCRIPT.fullmatch(body)
    if match is None:
        return Pattern(text, op, body, None)
    expr, index, first, sep, last = match.groups()
    if index is not None:
        return Pattern(text, op, expr, (int(index), None))
    if sep == "-":
        raise ValueError(f"Ansible reads [{first}-{last}] as positions in what {expr!r} selects, and warns that the "
                         f"form is removed: write [{first}:{last}] for positions, or a regex such as "
                         f"'~{expr}[{first}-{last}]$' for names")
    if last and int(last) == 0 and int(first) > 0:
        raise ValueError(f"[{first}:0] selects position {first} in Ansible, and nothing by its documentation: write "
                         f"[{first}] for one host")
    return Pattern(text, op, expr, (int(first), int(last) if last else -1))


class Matcher:
    """Patterns evaluated on an inventory's hosts (name -> its groups, in inventory order) and groups (name ->
    children, and every host in it via children too), with Ansible's `all` (every host) and `ungrouped` (unless the
    inventory has its own)."""

    def __init__(self, hosts: Mapping[str, Sequence[str]], groups: Mapping[str, tuple[Sequence[str], Sequence[str]]]):
        self.hosts = list(hosts)
        self.children = {name: list(kids) for name, (kids, _) in groups.items()}
        self.members = {name: list(names) for name, (_, names) in groups.items()}
        loose = [host for host, in_groups in hosts.items() if not in_groups]
        tops = [name for name in groups
                if name not in ("all", "ungrouped") and not any(name in kids for kids in self.children.values())]
        self.children.setdefault("ungrouped", [])
        self.members.setdefault("ungrouped", loose)
        self.children["all"], self.members["all"] = ["ungrouped", *tops], loose
        self.group_names = ["all", "ungrouped", *[name for name in groups if name not in ("all", "ungrouped")]]

    def group_hosts(self, name: str) -> list[str]:
        """A group's hosts in Ansible's order: its own, then its children's, level by level (Group.get_hosts)."""
        order, level = [name, *self.children[name]], list(self.children[name])
        while level:
            level = list(dict.fromkeys(kid for group in level for kid in self.children[group] if kid not in order))
            order += level
        hosts: dict[str, None] = {}
        for group in order:
            below = {host for kid in self.children[group] for host in self.members[kid]}
            hosts.update((host, None) for host in self.members[group] if host not in below)
        return list(hosts)

    def names(self, expr: str) -> list[str]:
        """What one expression selects, duplicates kept as Ansible keeps them (they count for positions)."""
        found = self._match(self.group_names, expr)
        selected = [host for group in found for host in self.group_hosts(group)]
        if not found or expr.startswith("~") or any(char in expr for char in _WILD):
            selected += self._match(self.hosts, expr)
        return selected

    @staticmethod
    def _match(items: Iterable[str], expr: str) -> list[str]:
        try:
            rule = re.compile(expr[1:] if expr.startswith("~") else fnmatch.translate(expr))
        except re.error as exc:
            raise ValueError(f"bad regular expression {expr[1:]!r}: {exc}") from None
        return [item for item in items if rule.match(item)]

    def select(self, pattern: Pattern) -> list[str]:
        """The hosts one pattern selects (no duplicates); ValueError saying why when it selects none."""
        if pattern.op == "|" and pattern.text in self.hosts:
            return [pattern.text]
        selected = self.names(pattern.expr)
        if pattern.positions is not None and selected and _ZERO_PADDED.search(pattern.text.rsplit("[", 1)[1]):
            expr = pattern.expr
            raise ValueError(f"Ansible's --limit reads [{pattern.text.rsplit('[', 1)[1]} as positions in what "
                             f"{expr!r} selects, not as names: write the positions without zeros ([1:4]), or the "
                             f"hosts by name ({expr}01,{expr}02,...) or by regex ('~{expr}0[1-4]$')")
        if pattern.positions is not None and selected:
            first, last = pattern.positions
            if last is None and not -len(selected) <= first < len(selected):
                raise ValueError(f"{pattern.expr!r} selects {len(selected)} hosts, at positions 0 to "
                                 f"{len(selected) - 1} (or -{len(selected)} to -1)")
            picked = [selected[first]] if not last else selected[first:(len(selected) if last == -1 else last + 1)]
            if not picked:
                raise ValueError(f"{pattern.expr!r} selects {len(selected)} hosts, none at positions "
                                 f"{first} to {last if last != -1 else len(selected) - 1}")
            selected = picked
        if not selected:
            raise ValueError(self._nothing(pattern))
        return list(dict.fromkeys(selected))

    def _nothing(self, pattern: Pattern) -> str:
        """Why a pattern selects no host, with the nearest name or the way to write what it likely means."""
        expr = pattern.expr
        if expr.startswith("@"):
            return ("matches no host or group; Ansible's --limit @FILE reads patterns from a file, gpuprov "
                    "does not: give them as a comma list")
        if pattern.positions is not None:
            return f"{expr!r} matches no host or group, so it has no positions{_range_hint(pattern, self.hosts)}"
        if expr.startswith("~") or any(char in expr for char in "?*["):
            return "matches no host or group"
        if ":" in expr and not is_address(expr):
            return ("matches no host or group; in a value with a comma Ansible splits at commas only, so "
                    f"this is one name: write {','.join(split_patterns(expr))}")
        if ":" in expr:
            return ("matches no host or group; Ansible reads it as one name (a host and a port, or an IPv6 "
                    "address): give hosts and groups by name, separated by commas")
        return f"unknown host {expr!r}{suggest(expr, [*self.hosts, *self.group_names])}"

    def evaluate(self, patterns: list[str], start: Sequence[str] = ()) -> tuple[set[str], list[str]]:
        """(hosts selected, problems): each pattern that selects nothing or cannot be read is a problem. `start`:
        the hosts already chosen (--group's), which `&` and `!` patterns narrow; without them and without a plain
        pattern, `&`/`!` narrow every host, as in Ansible."""
        problems, parsed = [], []
        for text in patterns:
            try:
                parsed.append(parse_pattern(text))
            except ValueError as exc:
                problems.append(f"pattern {literal(repr(text))}: {literal(str(exc))}")
        ordered = [p for op in "|&!" for p in parsed if p.op == op]
        if ordered and ordered[0].op != "|" and not start:
            ordered.insert(0, Pattern("all", "|", "all", None))
        chosen: dict[str, None] = dict.fromkeys(start)
        for pattern in ordered:
            try:
                hosts = self.select(pattern)
            except ValueError as exc:
                why = str(exc)
                if not (pattern.op == "|" and why.startswith("unknown host")):
                    why = f"pattern {pattern.text!r}{' ' if why.startswith('matches') else ': '}{why}"
                problems.append(literal(why))
                continue
            if pattern.op == "|":
                chosen.update((host, None) for host in hosts)
            else:
                keep = set(hosts) if pattern.op == "&" else set(chosen).difference(hosts)
                chosen = {host: None for host in chosen if host in keep}
        return set(chosen), problems


def _range_hint(pattern: Pattern, hosts: list[str]) -> str:
    """For `gpu[01:04]` with no host or group `gpu`, the hosts an inventory range would name, and how to give them."""
    from gpuprov.inventory.patterns import PatternError, expand_host_pattern

    written = f"[{pattern.text.rsplit('[', 1)[1]}"
    try:
        names, _ = expand_host_pattern(f"{pattern.expr}{written}", left=1000)
    except PatternError:
        return ""
    known = [name for name in names if name in hosts]
    if not known or ":" not in written:
        return ""
    listed = ",".join(known) if len(known) <= 12 else "a comma list of them, or a regex (~NAME$)"
    return (f"; as in Ansible's --limit, {written} picks positions in what {pattern.expr!r} selects, not "
            f"names: for the hosts {known[0]} to {known[-1]} write {listed}")
