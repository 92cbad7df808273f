"""The hardening profile: controls as data (gpuprov/data/hardening.yaml), loaded and checked once.

A control the loader refuses is a gpuprov bug (the file ships with gpuprov): GpuprovError naming the control."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuprov.core.errors import GpuprovError

AREAS = ("firewall", "ssh", "updates", "system")
OPERATORS = ("equals", "one_of", "subset_of", "contains_all", "contains")
PROBES = ("sshd", "firewall", "apt_config", "package", "unit", "sysctl", "mount_options", "security_origin")
FIREWALL_ASPECTS = ("live", "persisted", "input_policy", "output_policy", "published_guard", "others")
_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_KEYS = ("id", "area", "description", "check", "expected", "when", "waiver")


@dataclass(frozen=True)
class Control:
    """One control: where its value comes from (probe, argument) and what it must be (operator, operand)."""

    id: str
    area: str
    description: str
    probe: str
    argument: str
    operator: str
    operand: Any
    when: str | None = None
    waiver: str | None = None


def _problem(index: int, entry: Any, message: str) -> GpuprovError:
    name = entry.get("id") if isinstance(entry, dict) else None
    return GpuprovError(f"hardening profile: control {name or index}: {message}", step="profile",
                        hint="fix gpuprov/data/hardening.yaml (it ships with gpuprov: this is a gpuprov bug)")


def parse_control(index: int, entry: Any) -> Control:
    """One control from its YAML mapping; GpuprovError saying what is wrong."""
    from gpuprov.harden.policy import POLICY_VALUES

    if not isinstance(entry, dict):
        raise _problem(index, entry, "must be a mapping")
    unknown = sorted(set(entry) - set(_KEYS))
    missing = [key for key in ("id", "area", "description", "check", "expected") if key not in entry]
    if unknown or missing:
        raise _problem(index, entry, f"unknown keys {unknown}, missing keys {missing}")
    if not isinstance(entry["id"], str) or not _ID.fullmatch(entry["id"]):
        raise _problem(index, entry, "id must be kebab-case")
    if entry["area"] not in AREAS:
        raise _problem(index, entry, f"area must be one of {', '.join(AREAS)}")
    check = entry["check"]
    if not (isinstance(check, dict) and len(check) == 1 and next(iter(check)) in PROBES
            and isinstance(next(iter(check.values())), str)):
        raise _problem(index, entry, f"check must be one probe ({', '.join(PROBES)}) with a text argument")
    probe, argument = next(iter(check.items()))
    if probe == "firewall" and argument not in FIREWALL_ASPECTS:
        raise _problem(index, entry, f"firewall checks one of {', '.join(FIREWALL_ASPECTS)}")
    expected = entry["expected"]
    operator, operand = "equals", expected
    if isinstance(expected, dict):
        if len(expected) != 1 or next(iter(expected)) not in OPERATORS:
            raise _problem(index, entry, f"expected must be a value or one of {', '.join(OPERATORS)}")
        operator, operand = next(iter(expected.items()))
    if isinstance(operand, dict) and (set(operand) != {"policy"} or operand["policy"] not in POLICY_VALUES):
        raise _problem(index, entry, f"an operand mapping must be {{policy: NAME}}, NAME one of {POLICY_VALUES}")
    when = entry.get("when")
    if when is not None and when not in POLICY_VALUES:
        raise _problem(index, entry, f"when must name a policy value: {POLICY_VALUES}")
    if entry["area"] == "system" and not entry.get("waiver"):
        raise _problem(index, entry, "harden applies nothing in the system area: its controls must be waivers")
    return Control(entry["id"], entry["area"], str(entry["description"]), probe, argument, operator, operand, when,
                   entry.get("waiver"))


@cache
def controls() -> tuple[Control, ...]:
    """Every control of the profile, in file order."""
    from gpuprov.stack.data import table

    entries = table("hardening").get("controls")
    if not isinstance(entries, list) or not entries:
        raise _problem(0, None, "the profile needs a non-empty controls: list")
    parsed = tuple(parse_control(i, entry) for i, entry in enumerate(entries))
    ids = [c.id for c in parsed]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise _problem(0, None, f"duplicate ids {duplicates}")
    return parsed
