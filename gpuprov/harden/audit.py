"""The audit: each control of the profile judged on a host's harden facts, as pass, fail, waived or skip, with the
value observed. `invoke harden --check` reports it; a harden run judges its result with it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuprov.harden import nft, updates
from gpuprov.harden.policy import HardenPolicy
from gpuprov.harden.profile import Control, controls

LIST_KEYWORDS = ("kexalgorithms", "ciphers", "macs", "hostkeyalgorithms")
MULTI_KEYWORDS = ("allowusers", "allowgroups", "denyusers", "denygroups", "port", "hostkey", "listenaddress")
MATCHES = "matches the inventory"


@dataclass(frozen=True)
class Result:
    """One control judged on one host."""

    control: Control
    status: str              # pass | fail | waived | skip
    observed: Any
    expected: Any
    detail: str = ""

    def to_dict(self) -> dict:
        data = {"id": self.control.id, "area": self.control.area, "description": self.control.description,
                "status": self.status, "observed": self.observed, "expected": self.expected}
        if self.control.waiver:
            data["waiver"] = self.control.waiver
        if self.detail:
            data["detail"] = self.detail
        return data


def _sshd(facts: dict, keyword: str) -> Any:
    config = facts.get("sshd")
    if config is None:
        return None
    values = config.get(keyword)
    if values is None:
        return [] if keyword in MULTI_KEYWORDS else None
    if keyword in LIST_KEYWORDS:
        return [name for value in values for name in value.split(",") if name]
    if keyword in MULTI_KEYWORDS:
        return [word for value in values for word in value.split()]
    value = values[0]
    return "prohibit-password" if keyword == "permitrootlogin" and value == "without-password" else value


def _chain_policy(table: str | None, hook: str) -> str:
    match = re.search(rf"hook {hook} priority [^;]+; policy (\w+);", table or "")
    return match.group(1) if match else "accept (no gpuprov chain)"


def _others(facts: dict) -> str | list[str]:
    """The firewalls and rulesets besides gpuprov's table and Docker's rules ("none" when there are none)."""
    found = [f"{name} {state}" for name, state in (facts.get("other_firewalls") or {}).items()]
    return [*found, *(facts.get("other_rulesets") or [])] or "none"


def _firewall(facts: dict, aspect: str, ruleset: str) -> str | list[str]:
    table = facts.get("nft_table")
    if aspect == "others":
        return _others(facts)
    if aspect in ("live", "persisted"):
        differs = nft.state(facts, ruleset)
        keys = ("ruleset", "live") if aspect == "live" else ("ruleset", "boot")
        found = [differs[key] for key in keys if key in differs]
        if aspect == "persisted" and not facts.get("systemd"):
            found.append("nothing loads it at boot (no systemd)")
        return "; ".join(found) if found else MATCHES
    if aspect == "published_guard":
        guard = re.search(r"hook forward priority filter - \d+;", table or "") and "ct status dnat jump" in table
        return "present" if guard else "absent"
    return _chain_policy(table, "input" if aspect == "input_policy" else "output")


def observe(control: Control, facts: dict, ruleset: str) -> Any:
    """The value the control looks at, from the facts (None: the host could not tell)."""
    probe, arg = control.probe, control.argument
    if probe == "sshd":
        return _sshd(facts, arg)
    if probe == "firewall":
        return _firewall(facts, arg, ruleset)
    if probe == "apt_config":
        return (facts.get("apt_config") or {}).get(arg, [])
    if probe == "package":
        return "installed" if arg in (facts.get("packages") or {}) else "not installed"
    if probe == "unit":
        return (facts.get("units") or {}).get(arg) or "not installed"
    if probe == "sysctl":
        return (facts.get("sysctl") or {}).get(arg) or None
    if probe == "mount_options":
        return facts.get("tmp_options") or "not a separate mount"
    origins = [o for key in ("Unattended-Upgrade::Origins-Pattern", "Unattended-Upgrade::Allowed-Origins")
               for o in (facts.get("apt_config") or {}).get(key, [])]
    return "present" if any("security" in origin.lower() for origin in origins) else "absent"


def _holds(operator: str, observed: Any, expected: Any) -> bool:
    if observed is None:
        return False
    as_list = observed if isinstance(observed, list) else [observed]
    if operator == "equals":
        return [str(v) for v in as_list] == [str(v) for v in expected] if isinstance(expected, list) else (
            str(observed) == str(expected))
    if operator == "one_of":
        return str(observed) in [str(v) for v in expected]
    if operator == "subset_of":
        return bool(as_list) and set(as_list) <= set(expected)
    if operator == "contains_all":
        return set(expected) <= set(as_list)
    return str(expected) in as_list


def judge(control: Control, facts: dict, policy: HardenPolicy, ruleset: str) -> Result:
    """One control on one host."""
    operand = control.operand
    expected = policy.value(operand["policy"]) if isinstance(operand, dict) else operand
    observed = observe(control, facts, ruleset)
    if control.waiver:
        return Result(control, "waived", observed, expected, "waived: " + control.waiver)
    if control.when and not policy.value(control.when):
        return Result(control, "skip", observed, expected, f"the inventory sets no {control.when}")
    if control.area == "updates" and not updates.supported(facts):
        return Result(control, "skip", observed, expected, "unattended upgrades are managed on Debian and Ubuntu")
    if control.probe == "sshd" and facts.get("sshd") is None:
        return Result(control, "fail", None, expected, facts.get("sshd_error") or "sshd -T gave nothing")
    return Result(control, "pass" if _holds(control.operator, observed, expected) else "fail", observed, expected)


def audit(facts: dict, policy: HardenPolicy, ruleset: str, areas: Iterable[str]) -> list[Result]:
    """Every control of the selected areas (and the system waivers), judged on the host."""
    wanted = set(areas) | {"system"}
    return [judge(c, facts, policy, ruleset) for c in controls() if c.area in wanted]
