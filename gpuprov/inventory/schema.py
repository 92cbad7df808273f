"""The validated variables: hardware, stack, mirror, firewall, container_engine, the hardening variables
(gpuprov.inventory.hardening) and the monitoring variables (gpuprov.inventory.monitoring); any other variable is
data.

Stack pins and the GPU model are checked by gpuprov.stack.inputs (stack_pin, gpu_model), the one place that
owns those rules, so the inventory accepts exactly what the resolver accepts, and keeps the normalized form.
A number is passed as it was written: `cuda: 12.10` is "12.10", not 12.1.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprov.inventory.checks import NotRegular, private_key_problem, read_regular, url_problem
from gpuprov.inventory.checks import network as checked_network
from gpuprov.inventory.diagnostics import show, suggest, type_name
from gpuprov.inventory.hardening import HardeningVariables
from gpuprov.inventory.levels import INVALID, as_mapping, known_keys
from gpuprov.inventory.located import Located
from gpuprov.inventory.monitoring import MonitoringVariables
from gpuprov.inventory.settings import local_path, port_number
from gpuprov.stack.inputs import PinError, gpu_model, stack_pin

CONTAINER_ENGINES = ("docker",)
MAX_PUBLIC_BYTES = 1024 * 1024  # a CA bundle or an armored public key is far smaller
_HEX40 = re.compile(r"[0-9A-Fa-f]{40}")

Check = Callable[[Any, tuple], Any]


class VariableSchema(HardeningVariables, MonitoringVariables):
    """Checks a level's variables where they are written; a refused one is left out (its error recorded)."""

    def __init__(self, doc: Located, base: Path):
        self.doc = doc
        self.base = base

    def check(self, key: str, value: Any, path: tuple) -> Any:
        """The checked (normalized) value of variable `key`, or INVALID."""
        checker = {"hardware": self.hardware, "stack": self.stack, "mirror": self.mirror,
                   "firewall": self.firewall, "container_engine": self.container_engine}.get(key)
        checker = checker or self.hardening_checker(key) or self.monitoring_checker(key)
        return checker(value, path) if checker else value

    def struct(self, value: Any, path: tuple, what: str, fields: dict[str, Check], required: tuple = ()) -> Any:
        body = as_mapping(self.doc, value, path, what)
        if body is None:
            return INVALID
        known_keys(self.doc, body, path, tuple(fields), what)
        out, ok = {}, True
        for key in required:
            if key not in body:
                self.doc.error(path, f"{what} needs {key}")
                ok = False
        for key, item in body.items():
            if key in fields:
                checked = fields[key](item, (*path, key))
                ok = ok and checked is not INVALID
                out[key] = checked
        return out if ok else INVALID

    # ---------- the variables ----------

    def hardware(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "hardware", {
            "gpu": self.gpu, "count": self.positive_int, "nvswitch": self.boolean})

    def stack(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "stack", {
            "cuda": self.pin("cuda"), "driver": self.pin("driver"), "pytorch": self.pin("pytorch"),
            "ngc": self.pin("ngc"), "nccl": self.pin("nccl"), "forward_compat": self.boolean,
        })

    def mirror(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "mirror", {
            "url": self.url, "proxy": self.url, "fingerprint": self.fingerprint,
            "key_file": self.public_file("key_file", must_exist=False),
            "ca_file": self.public_file("ca_file", must_exist=True),
            "label": self.release_label,
        }, required=("url",))

    def firewall(self, value: Any, path: tuple) -> Any:
        return self.struct(value, path, "firewall", {"allow": self.allow_list}, required=("allow",))

    def container_engine(self, value: Any, path: tuple) -> Any:
        if isinstance(value, str) and value in CONTAINER_ENGINES:
            return value
        self.doc.error(path, f"bad container_engine {show(value)}: give {' or '.join(CONTAINER_ENGINES)}"
                             f"{suggest(value, CONTAINER_ENGINES)}")
        return INVALID

    # ---------- parts ----------

    def gpu(self, value: Any, path: tuple) -> Any:
        try:
            return gpu_model(value)
        except PinError as exc:
            self.doc.error(path, str(exc))
            return INVALID

    def pin(self, key: str) -> Check:
        def check(value: Any, path: tuple) -> Any:
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = self.doc.raw.get(path, str(value))
            try:
                return stack_pin(key, value)
            except PinError as exc:
                self.doc.error(path, str(exc))
                return INVALID
        return check

    def public_file(self, what: str, must_exist: bool) -> Check:
        """A local file gpuprov copies to hosts (the mirror's CA certificates, its signing key): a regular file
        of at most MAX_PUBLIC_BYTES, with no private key in it."""
        def check(value: Any, path: tuple) -> Any:
            resolved = local_path(self.doc, value, path, what, self.base, must_exist=must_exist)
            if resolved is None:
                return INVALID
            try:
                problem = private_key_problem(read_regular(resolved, MAX_PUBLIC_BYTES))
            except FileNotFoundError:
                problem = None  # key_file may be written later (must_exist found a missing ca_file already)
            except NotRegular as exc:
                problem = exc.reason
            except OSError as exc:
                problem = f"cannot be read: {exc.strerror}"
            if problem:
                self.doc.error(path, f"{what} {resolved} {problem}")
                return INVALID
            return resolved
        return check

    def release_label(self, value: Any, path: tuple) -> Any:
        """The mirror's Release `Label:` (apt pins the repository by it)."""
        from gpuprov.ops.repo import RELEASE_LABEL

        if isinstance(value, str) and RELEASE_LABEL.fullmatch(value):
            return value
        self.doc.error(path, f"bad label {show(value)}: the Label: line of the mirror's Release file, letters, "
                             "digits, spaces and ._+:~/- only (NVIDIA's is \"NVIDIA CUDA\")")
        return INVALID

    def allow_list(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, list):
            self.doc.error(path, f"allow must be a list of rules ({{port, proto, sources}}), not {type_name(value)}")
            return INVALID
        rules = []
        for i, item in enumerate(value):
            rule = self.struct(item, (*path, i), "firewall rule", {
                "port": lambda v, p: port_number(self.doc, v, p), "proto": self.proto, "sources": self.cidrs},
                required=("port", "sources"))
            if rule is not INVALID:
                rules.append({"port": rule["port"], "proto": rule.get("proto", "tcp"), "sources": rule["sources"]})
        return rules if len(rules) == len(value) else INVALID

    def positive_int(self, value: Any, path: tuple) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        self.doc.error(path, f"expected an integer >= 1, not {show(value)}")
        return INVALID

    def boolean(self, value: Any, path: tuple) -> Any:
        if isinstance(value, bool):
            return value
        self.doc.error(path, f"expected true or false, not {show(value)}")
        return INVALID

    def proto(self, value: Any, path: tuple) -> Any:
        if value in ("tcp", "udp"):
            return value
        self.doc.error(path, f"bad proto {show(value)}: give tcp or udp{suggest(value, ('tcp', 'udp'))}")
        return INVALID

    def url(self, value: Any, path: tuple) -> Any:
        if url_problem(value) is None:
            return value
        self.doc.error(path, f"bad URL {show(value)}: give an http:// or https:// URL with a host name")
        return INVALID

    def fingerprint(self, value: Any, path: tuple) -> Any:
        text = value.replace(" ", "") if isinstance(value, str) else None
        if text and _HEX40.fullmatch(text):
            return text.upper()
        self.doc.error(path, f"bad fingerprint {show(value)}: give the key's 40 hex digits")
        return INVALID

    def cidrs(self, value: Any, path: tuple) -> Any:
        if not isinstance(value, list) or not value:
            self.doc.error(path, f"sources must be a non-empty list of CIDRs like 10.0.0.0/8, not {show(value)}")
            return INVALID
        out, ok = [], True
        for i, item in enumerate(value):
            network, hint = checked_network(item)
            if network is not None:
                out.append(network)
                continue
            self.doc.error((*path, i), f"bad CIDR {show(item)}{hint}")
            ok = False
        return out if ok else INVALID

