"""The checks of the declared variables (gpuprov.inventory.variables): each level's variables, where they are
written, by their Spec; a variable no capability declares is data, kept as it is.

Each kind of value has one checker (KINDS, kind -> method): the generic kinds ask gpuprov.inventory.checks (one
checker per kind of value: address, CIDR, port, integer, number, percent, duration, URL, host path, registry) and
record a refused value at its place; a few kinds are particular to one variable (a stack pin, a GPU model, a
public file). Stack pins and the GPU model are checked by gpuprov.stack.inputs (stack_pin, gpu_model), the one
place that owns those rules, so the inventory accepts exactly what the resolver accepts, and keeps the normalized
form. A number is passed as it was written: `cuda: 12.10` is "12.10", not 12.1.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import Any

from gpuprov.catalog import choose
from gpuprov.core.errors import InputError
from gpuprov.core.secrets import register_url
from gpuprov.inventory import checks
from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.levels import INVALID, as_mapping, known_keys
from gpuprov.inventory.located import Located
from gpuprov.inventory.model import is_valid_address
from gpuprov.inventory.settings import local_path, port_number
from gpuprov.inventory.variables import ANY, NO_DEFAULT, Spec, children, registry
from gpuprov.stack.data import branch_of
from gpuprov.stack.inputs import PinError, gpu_model, stack_pin
from gpuprov.stack.resolve import driver_eol_warning

MAX_PUBLIC_BYTES = 1024 * 1024  # a CA bundle or an armored public key is far smaller
_HEX40 = re.compile(r"[0-9A-Fa-f]{40}")
_ULIMIT = re.compile(r"[a-z]+")
_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class VariableSchema:
    """Checks a level's variables where they are written; a refused one is left out (its error recorded)."""

    def __init__(self, doc: Located, base: Path):
        self.doc = doc
        self.base = base
        self.specs = registry()

    def check(self, key: str, value: Any, path: tuple) -> Any:
        """The checked (normalized) value of top-level variable `key`, or INVALID; an undeclared one as it is."""
        declared = self.specs.get(key)
        if declared is None or (value is None and declared.null):
            return value
        return self.value(declared, value, path)

    def value(self, item: Spec, value: Any, path: tuple) -> Any:
        """The checked value of `item` at `path`, or INVALID (the error recorded)."""
        return getattr(self, KINDS[item.kind])(item, value, path)

    def refuse(self, item: Spec, value: Any, path: tuple, problem: str = "") -> Any:
        """Record the refusal of `value` (the spec's message, else `problem`) and return INVALID."""
        message = item.message.format(value=show(value), type=type_name(value), problem=problem) or problem
        self.doc.error(path, message)
        return INVALID

    # ---------- containers ----------

    def mapping(self, item: Spec, value: Any, path: tuple) -> Any:
        """A mapping of the declared keys (or of any key, where `NAME.*` is declared): each checked by its spec,
        the required ones present, the defaults filled in."""
        body = as_mapping(self.doc, value, path, item.what)
        if body is None:
            return INVALID
        fields = {part.key: part for part in children(item.name)}
        free = fields.pop(ANY, None)
        if free is None:
            known_keys(self.doc, body, path, tuple(fields), item.what)
        out, ok = {}, True
        for key, part in fields.items():
            if part.required and key not in body:
                self.doc.error(path, f"{item.what} needs {key}")
                ok = False
            elif part.default is not NO_DEFAULT and key not in body:
                out[key] = part.default
        for key, element in body.items():
            part = fields.get(key, free)
            if part is None:
                continue
            checked = None if element is None and part.null else self.value(part, element, (*path, key))
            ok = ok and checked is not INVALID
            out[key] = checked
        return out if ok else INVALID

    def sequence(self, item: Spec, value: Any, path: tuple) -> Any:
        """A list, each item checked by `NAME.*`."""
        if not isinstance(value, list):
            return self.refuse(item, value, path, f"{item.what} must be a list, not {type_name(value)}")
        (part,) = children(item.name)
        out = [self.value(part, element, (*path, i)) for i, element in enumerate(value)]
        return INVALID if any(element is INVALID for element in out) else out

    def names(self, item: Spec, value: Any, path: tuple) -> Any:
        """A non-empty list of names, each matching the spec's pattern (AllowUsers, algorithms)."""
        if not isinstance(value, list) or not value:
            self.doc.error(path, f"expected a non-empty list of {item.what} names, not {show(value)}")
            return INVALID
        bad = [(i, name) for i, name in enumerate(value) if not (isinstance(name, str)
                                                                 and item.pattern.fullmatch(name))]
        for i, name in bad:
            self.refuse(item, name, (*path, i))
        return INVALID if bad else list(value)

    def commands(self, item: Spec, value: Any, path: tuple) -> Any:
        """A command, or a non-empty list of commands run in order, each matching the spec's pattern (hooks)."""
        if isinstance(value, str):
            return value if item.pattern.fullmatch(value) else self.refuse(item, value, path,
                                                                           f"bad {item.what} {show(value)}")
        if not isinstance(value, list) or not value:
            self.doc.error(path, f"expected a {item.what} or a non-empty list of them, not {show(value)}")
            return INVALID
        bad = [(i, text) for i, text in enumerate(value)
               if not (isinstance(text, str) and item.pattern.fullmatch(text))]
        for i, text in bad:
            self.refuse(item, text, (*path, i), f"bad {item.what} {show(text)}")
        return INVALID if bad else list(value)

    def cidrs(self, item: Spec, value: Any, path: tuple) -> Any:
        """A non-empty list of networks (checks.network), each in its normal form."""
        if not isinstance(value, list) or not value:
            self.doc.error(path, f"sources must be a non-empty list of CIDRs like 10.0.0.0/8, not {show(value)}")
            return INVALID
        out, ok = [], True
        for i, element in enumerate(value):
            network, hint = checks.network(element)
            if network is not None:
                out.append(network)
                continue
            self.doc.error((*path, i), f"bad CIDR {show(element)}{hint}")
            ok = False
        return out if ok else INVALID

    # ---------- the kinds of value ----------

    def boolean(self, item: Spec, value: Any, path: tuple) -> Any:
        if isinstance(value, bool):
            return value
        return self.refuse(item, value, path, f"expected true or false, not {show(value)}")

    def integer(self, item: Spec, value: Any, path: tuple) -> Any:
        """A whole number from the spec's low (1 unless given) to its high, if any."""
        problem = checks.integer_problem(value, int(item.low if item.low is not None else 1),
                                         None if item.high is None else int(item.high))
        return value if problem is None else self.refuse(item, value, path, problem)

    def number(self, item: Spec, value: Any, path: tuple) -> Any:
        problem = checks.number_problem(value, item.low, item.high, above=item.above)
        return float(value) if problem is None else self.refuse(item, value, path, problem)

    def percent(self, item: Spec, value: Any, path: tuple) -> Any:
        problem = checks.percent_problem(value)
        return float(value) if problem is None else self.refuse(item, value, path, problem)

    def duration(self, item: Spec, value: Any, path: tuple) -> Any:
        low = 1 if item.low is None else item.low
        problem = checks.duration_problem(value, low, item.high or checks.MAX_SECONDS)
        return float(value) if problem is None else self.refuse(item, value, path, problem)

    def port(self, item: Spec, value: Any, path: tuple) -> Any:
        low = int(item.low or 1)
        if low == 1:
            return port_number(self.doc, value, path)
        problem = checks.port_problem(value, low)
        return value if problem is None else self.refuse(item, value, path, problem)

    def choice(self, item: Spec, value: Any, path: tuple) -> Any:
        """One of the spec's choices (a value of the same type: true is not 1), with a did-you-mean."""
        if any(type(value) is type(choice) and value == choice for choice in item.choices):
            return value
        default = f"must be one of {', '.join(map(str, item.choices))}, not {show(value)}"
        message = item.message.format(value=show(value), type=type_name(value), problem=default) or default
        self.doc.error(path, message + (suggest(value, item.choices) if isinstance(value, str) else ""))
        return INVALID

    def pattern(self, item: Spec, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and item.pattern.fullmatch(value):
            return value
        return self.refuse(item, value, path, f"bad {item.what} {show(value)}")

    def address(self, item: Spec, value: Any, path: tuple) -> Any:
        """A host name or an IP address other hosts reach: no IPv6 zone."""
        if isinstance(value, str) and is_valid_address(value, zone=False):
            return value
        return self.refuse(item, value, path, f"bad {item.what} {show(value)}")

    def url(self, item: Spec, value: Any, path: tuple) -> Any:
        """An http(s) URL (checks.url_problem), or one of the spec's choices (""); a login in it is masked in every
        later output."""
        if isinstance(value, str) and (value in item.choices or checks.url_problem(value) is None):
            register_url(value)
            return value
        return self.refuse(item, value, path, f"bad URL {show(value)}: give an http:// or https:// URL with a "
                                              "host name")

    def host_path(self, item: Spec, value: Any, path: tuple) -> Any:
        """An absolute path on the host (checks.host_path_problem), its trailing / dropped."""
        problem = checks.host_path_problem(value, root=True)
        return value.rstrip("/") or "/" if problem is None else self.refuse(item, value, path, problem)

    def folder(self, item: Spec, value: Any, path: tuple) -> Any:
        """An absolute path on the host other than / (mounted, or written into)."""
        problem = checks.host_path_problem(value, root=False)
        return value.rstrip("/") if problem is None else self.refuse(item, value, path, problem)

    def root_folder(self, item: Spec, value: Any, path: tuple) -> Any:
        """A host folder root writes into and another program trusts: not under a folder every user may write."""
        folder = self.host_path(item, value, path)
        if folder is INVALID:
            return INVALID
        problem = checks.shared_folder_problem(folder)
        return folder if problem is None else self.refuse(item, value, path, problem)

    def registry_address(self, item: Spec, value: Any, path: tuple) -> Any:
        problem = checks.registry_problem(value)
        return value if problem is None else self.refuse(item, value, path, problem)

    # ---------- kinds of one variable ----------

    def gpu(self, item: Spec, value: Any, path: tuple) -> Any:
        try:
            key = gpu_model(value)
        except PinError as exc:
            return self.refuse(item, value, path, str(exc))
        warning = choose(value).warning()
        if warning:
            self.doc.warn(path, warning)
        return key

    def pin(self, item: Spec, value: Any, path: tuple) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = self.doc.raw.get(path, str(value))
        try:
            pinned = stack_pin(item.key, value)
        except PinError as exc:
            return self.refuse(item, value, path, str(exc))
        if item.key == "driver" and (warning := driver_eol_warning(branch_of(pinned), date.today())):
            self.doc.warn(path, warning)
        return pinned

    def release(self, item: Spec, value: Any, path: tuple) -> Any:
        """A release as written (`2.10` stays "2.10"), matching the spec's pattern, or one of its choices."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = self.doc.raw.get(path, str(value))
        if isinstance(value, str) and (value in item.choices or item.pattern.fullmatch(value)):
            return value
        return self.refuse(item, value, path, f"bad {item.what} {show(value)}")

    def fingerprint(self, item: Spec, value: Any, path: tuple) -> Any:
        text = value.replace(" ", "") if isinstance(value, str) else None
        if text and _HEX40.fullmatch(text):
            return text.upper()
        return self.refuse(item, value, path, f"bad fingerprint {show(value)}: give the key's 40 hex digits")

    def release_label(self, item: Spec, value: Any, path: tuple) -> Any:
        """The mirror's Release `Label:` (apt pins the repository by it)."""
        from gpuprov.inventory.checks import RELEASE_LABEL

        if isinstance(value, str) and RELEASE_LABEL.fullmatch(value):
            return value
        return self.refuse(item, value, path, f"bad {item.what} {show(value)}")

    def existing_public_file(self, item: Spec, value: Any, path: tuple) -> Any:
        """A public file that must exist now (the mirror's CA certificates)."""
        return self.public_file(item, value, path, must_exist=True)

    def public_file(self, item: Spec, value: Any, path: tuple, must_exist: bool = False) -> Any:
        """A local file gpuprov copies to hosts (the mirror's CA certificates, its signing key): a regular file
        of at most MAX_PUBLIC_BYTES, with no private key in it (one that is missing may be written later)."""
        resolved = local_path(self.doc, value, path, item.key, self.base, must_exist=must_exist)
        if resolved is None:
            return INVALID
        try:
            problem = checks.private_key_problem(checks.read_regular(resolved, MAX_PUBLIC_BYTES))
        except FileNotFoundError:
            problem = None  # key_file may be written later (must_exist found a missing ca_file already)
        except checks.NotRegular as exc:
            problem = exc.reason
        except OSError as exc:
            problem = f"cannot be read: {exc.strerror}"
        if problem:
            self.doc.error(path, f"{item.key} {resolved} {problem}")
            return INVALID
        return resolved

    def service_sources(self, item: Spec, value: Any, path: tuple) -> Any:
        """A list of CIDRs, or the name of a network variable (`monitoring`, `cluster`: its choices)."""
        if isinstance(value, str):
            if value in item.choices:
                return value
            self.doc.error(path, f"bad sources {show(value)}: give a list of CIDRs, or monitoring or cluster"
                                 f"{suggest(value, item.choices)}")
            return INVALID
        return self.cidrs(item, value, path)

    def image_digests(self, item: Spec, value: Any, path: tuple) -> Any:
        """A mapping of image tag (the spec's pattern) to its sha256 digest."""
        if not isinstance(value, dict):
            return self.refuse(item, value, path)
        ok = True
        for tag, digest in value.items():
            if not (isinstance(tag, str) and item.pattern.fullmatch(tag)):
                self.doc.error((*path, tag), f"bad image tag {show(tag)}: give the dcgm-exporter tag the plan names, "
                                             "like 4.4.1-4.6.0-ubuntu22.04")
                ok = False
            elif not (isinstance(digest, str) and _IMAGE_DIGEST.fullmatch(digest)):
                self.doc.error((*path, tag), f"bad image digest {show(digest)}: give sha256: and 64 lower-case hex "
                                             "digits (docker buildx imagetools inspect IMAGE:TAG shows it)")
                ok = False
        return dict(value) if ok else INVALID

    def percent_by_gpu(self, item: Spec, value: Any, path: tuple) -> Any:
        """A percent, or a mapping of GPU model (gpuprov.catalog's names) or `default` to a percent."""
        if not isinstance(value, dict):
            return self.percent(item, value, path)
        from gpuprov.catalog import lookup

        out, ok = {}, True
        for name, pct in value.items():
            if name != "default":
                try:
                    lookup(name)
                except InputError as exc:
                    self.doc.error((*path, name), exc.message)
                    ok = False
                    continue
            out[name] = self.percent(item, pct, (*path, name))
            ok = ok and out[name] is not INVALID
        return out if ok else INVALID

    def ulimits(self, item: Spec, value: Any, path: tuple) -> Any:
        """ulimit name (memlock, stack, nofile) -> a whole number (-1: unlimited) or null (the engine's default)."""
        if not isinstance(value, dict) or not all(isinstance(key, str) and _ULIMIT.fullmatch(key) for key in value):
            return self.refuse(item, value, path, "must be a mapping of ulimit names (memlock, stack, nofile) to "
                                                  "numbers")
        bad = [name for name, limit in value.items() if limit is not None and checks.integer_problem(limit, -1,
                                                                                                       2**63 - 1)]
        for name in bad:
            self.doc.error((*path, name), f"must be a whole number (-1: unlimited) or null (the engine's default), "
                                          f"not {show(value[name])}")
        return INVALID if bad else dict(value)

    def memlock(self, item: Spec, value: Any, path: tuple) -> Any:
        """A number of bytes, or -1 for unlimited."""
        if isinstance(value, int) and not isinstance(value, bool) and (value == -1 or 0 < value < 2**63):
            return value
        return self.refuse(item, value, path, f"bad {item.what} {show(value)}")


# kind -> the VariableSchema method that checks it
KINDS = {
    "mapping": "mapping", "list": "sequence", "names": "names", "commands": "commands", "cidrs": "cidrs",
    "bool": "boolean",
    "integer": "integer", "number": "number", "percent": "percent", "duration": "duration", "port": "port",
    "choice": "choice", "pattern": "pattern", "address": "address", "url": "url", "path": "host_path",
    "folder": "folder", "root_folder": "root_folder", "registry": "registry_address", "gpu": "gpu", "pin": "pin",
    "release": "release", "fingerprint": "fingerprint", "release_label": "release_label",
    "public_file": "public_file", "existing_public_file": "existing_public_file",
    "service_sources": "service_sources", "image_digests": "image_digests", "percent_by_gpu": "percent_by_gpu",
    "ulimits": "ulimits", "memlock": "memlock",
}
