"""Every secret gpuprov knows, and the one function that masks secrets in what gpuprov writes.

Two nets, both applied by `mask` (errors, reports, JSON, command lines shown in logs all go through it):

- by value: each secret registered here (sudo passwords, the registry password, the passwords of mirror, proxy
  and torch index URLs, and what `register_named` finds under secret names in data read in) in every form that
  output may carry it: as it is, JSON-escaped, percent-encoded, shell-quoted and as
  `gpuprov.core.errors.literal` shows it;
- by pattern, for secrets gpuprov was never told about: the user:password part of URLs (every user part of an
  http(s) URL, where a token may be the user), `password=` / `PASSWORD=` / `token=` settings (Ansible's
  `ansible_become_pass=` too), `password:`, JSON and Python `"password": "..."`, `Authorization: Bearer|Basic ...`
  and apt auth.conf entries. The user of a
  URL without a password in other schemes (`ssh://git@host`) is a login name, not a secret, and stays.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

MASK = "***"

_values: set[str] = set()
_lock = threading.Lock()
_pattern: re.Pattern | None = None

# up to the last @ before the host, as URL parsers split it: a password may hold an unescaped @ ("p@ss")
_URL_LOGIN = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://([^/\s\"'<>]+)@")
# A secret value: quoted (its quotes kept), or up to whitespace, a quote or an escaped line break; other
# backslash escapes (JSON `\"`, `\\`) count as one character, so masking JSON text keeps it valid.
_QUOTED = r"(\"(?:\\.|[^\"\\\n])*\"|'[^'\n]*')"
_VALUE = r"(\"(?:\\.|[^\"\\\n])*\"|'[^'\n]*'|(?:\\[^nrt]|[^\s\"'\\])+)"
# a key starts where a run of key characters starts: scanning a long run is then linear, not quadratic
# (`_pass`, `-passwd`: Ansible's ansible_become_pass and ansible_ssh_pass; a bare `pass` is a word, not a key)
# (after a `/`, `passwd` is the file /etc/passwd, as in `/etc/passwd:1:1:`, not a key)
_KEY = re.compile(r"(?:(?<![\w./-])|(?<=/)(?!passwd\b))[\w.-]*(?:password|(?<=[_.-])pass(?:wd)?|passwd|token|secret)",
                  re.IGNORECASE)
# `password=x`, `PASSWORD: x`, `token = 'x'`; a quoted key takes a quoted value only (`"password": "x"`)
_SETTING = re.compile(r"((" + _KEY.pattern + r")[ \t]*([=:])[ \t]*)" + _VALUE, re.IGNORECASE)
_QUOTED_SETTING = re.compile(r"(([\"'])" + _KEY.pattern + r"\2[ \t]*[=:][ \t]*)" + _QUOTED, re.IGNORECASE)
_AUTHORIZATION = re.compile(r"(authorization[\"']?[ \t]*[:=][ \t]*[\"']?(?:bearer|basic|token|digest)[ \t]+)"
                            + _VALUE, re.IGNORECASE)
# apt_auth.conf(5) entries: `machine HOST login USER password SECRET`
_AUTH_CONF = re.compile(r"(\bmachine\s+\S+\s+login\s+\S+\s+password\s+)" + _VALUE)


# casefold() brings every character that re.IGNORECASE matches to an ASCII letter onto that letter (K -> k,
# ſ -> s) but two: dotless ı, and İ, which folds to i + a combining dot. Mapped here, so a substring test on the
# folded text never misses what the patterns would find (it may find more: the pattern then decides).
_ASCII_FOLD = {0x131: "i", 0x307: None}


def register(*values: str | None) -> None:
    """Remember secret values, so that `mask` replaces them wherever they appear (empty ones and ones made
    of `*` alone, which cannot be told from the mask, are skipped)."""
    global _pattern
    forms = _forms(values)
    with _lock:
        if forms - _values:
            _values.update(forms)
            _pattern = None


def register_url(url: str | None) -> None:
    """Remember the password a URL carries (its user too, for http(s), where a token may be the user)."""
    if not url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    if "@" not in parts.netloc:
        return
    user, _, password = parts.netloc.rpartition("@")[0].partition(":")
    secret = password or (user if parts.scheme.lower() in ("http", "https") else "")
    register(secret, unquote(secret))


MIN_NAMED_SECRET = 6   # register_named: shorter values are not registered


def register_named(data: Any) -> None:
    """Register the text value of every secret-named key (`password`, `*_token`, `ansible_become_pass`...) in
    `data` at any depth: what a reader took in (an inventory's host variables, a listing from ansible-inventory with
    vault values decrypted) is then masked wherever it shows, even under another name."""
    if isinstance(data, dict):
        for key, item in data.items():
            if isinstance(key, str) and isinstance(item, str) and _KEY.fullmatch(key):
                # a value this short (`admin`, `root`) would mask every such word in every report: it is no
                # secret worth that, and a lab default rather than a fleet's password
                register(item if len(item) >= MIN_NAMED_SECRET else None)
            else:
                register_named(item)
    elif isinstance(data, list | tuple):
        for item in data:
            register_named(item)


def mask(text: str, extra: Iterable[str] = ()) -> str:
    """`text` with every secret replaced by ***: the registered values and `extra` ones, and what the patterns
    find. The one masking function of gpuprov (`mask_data` applies it to structured data)."""
    extra_forms = _forms(extra)
    text = _by_value(text, extra_forms)
    # each pattern runs only where the words it needs are present (a substring test is far cheaper than the
    # pattern, and most strings of a report hold none of them); the result is the same
    before, folded = text, text.casefold().translate(_ASCII_FOLD)
    if "://" in text and "@" in text:
        text = _URL_LOGIN.sub(_url_login, text)
    if "machine" in text:
        text = _AUTH_CONF.sub(r"\g<1>" + MASK, text)
    if "authorization" in folded:
        text = _AUTHORIZATION.sub(_keep_quotes, text)
    if "pass" in folded or "token" in folded or "secret" in folded:
        text = _QUOTED_SETTING.sub(_keep_quotes, text)
        text = _SETTING.sub(_setting, text)
    return text if text == before else _by_value(text, extra_forms)


def mask_data(value: Any) -> Any:
    """`value` (what becomes a JSON document) with `mask` applied to every string, keys included, and the text
    value of a secret-named key (`password`, `token`, `*_secret`...) replaced by ***. Masking the strings
    rather than the JSON text keeps the document valid, whatever characters a secret has."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {mask(key) if isinstance(key, str) else key:
                MASK if isinstance(key, str) and isinstance(item, str) and _KEY.fullmatch(key) else mask_data(item)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mask_data(item) for item in value]
    return value


def _forms(values: Iterable[str | None]) -> set[str]:
    """The texts secrets can appear as in gpuprov's output (those made of `*` alone left out)."""
    from gpuprov.core.errors import literal

    forms = set()
    for value in filter(None, values):
        forms |= {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1],
                  literal(value), quote(value, safe=""), quote(value), shlex.quote(value)}
    return {form for form in forms if form.strip("*")}


def _by_value(text: str, extra: set[str]) -> str:
    """Replace registered and extra values until none is left (a replacement can join text into another)."""
    global _pattern
    with _lock:
        if _pattern is None and _values:
            _pattern = _alternation(_values)
        pattern = _alternation(_values | extra) if extra else _pattern
    if pattern is None:
        return text
    while True:
        masked = pattern.sub(MASK, text)
        if masked == text:
            return text
        text = masked


def _alternation(values: set[str]) -> re.Pattern:
    return re.compile("|".join(re.escape(value) for value in sorted(values, key=lambda v: (-len(v), v))))


def _url_login(match: re.Match) -> str:
    scheme, login = match.group(1), match.group(2)
    if ":" in login or scheme.lower() in ("http", "https"):
        return f"{scheme}://{MASK}@"
    return match.group(0)


def _keep_quotes(match: re.Match) -> str:
    value = match.group(match.lastindex)
    quote_char = value[0] if value[0] in "\"'" and len(value) > 1 and value[-1] == value[0] else ""
    return match.group(1) + quote_char + MASK + quote_char


def _setting(match: re.Match) -> str:
    """A `key=value` or `key: value` setting with its value masked; a located error's dotted key path
    (`hosts.h1.sudo.password: message`) is a name, not a setting, and stays."""
    if match.group(3) == ":" and "." in match.group(2):
        return match.group(0)
    return _keep_quotes(match)
