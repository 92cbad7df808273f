"""The firewall's change: the rendered ruleset checked with `nft -c` on the host, loaded (gpuprov's table only) and
persisted by a boot unit; nothing when the file, the live table and the unit already are what the inventory says.

The live table is compared with the listing `nft list table` gave right after gpuprov loaded the file
(firewall.LISTING): any change to the live table since, or to the file, shows."""

from __future__ import annotations

import shlex

from gpuprov.harden.firewall import LISTING, RULESET, TABLE, UNIT, UNIT_FILE, unit_file
from gpuprov.ops.base import Change, unified_diff, write_file
from gpuprov.ops.pkg import for_family

WANTS_LINK = f"/etc/systemd/system/multi-user.target.wants/{UNIT}"
FILES = (RULESET, LISTING, UNIT_FILE)
GUARDED_FILES = (*FILES, WANTS_LINK)   # what the guard puts back
q = shlex.quote


def state(facts: dict, ruleset: str) -> dict[str, str]:
    """What differs from the inventory: {"ruleset" | "live" | "boot": how}; {} when in state."""
    files = facts.get("files") or {}
    live, stored = facts.get("nft_table"), files.get(LISTING)
    found = {}
    current = files.get(RULESET)
    if current != ruleset:
        found["ruleset"] = "absent" if current is None else "differs from the inventory"
    if live is None:
        found["live"] = "no gpuprov table loaded"
    elif stored is None or live.strip("\n") != stored.strip("\n"):
        found["live"] = "the loaded table differs from the ruleset gpuprov loaded"
    if facts.get("systemd") and (files.get(UNIT_FILE) != unit_file()
                                 or (facts.get("units") or {}).get(UNIT) != "enabled"):
        found["boot"] = f"{UNIT} is not installed and enabled"
    return found


def change(facts: dict, ruleset: str, summary: str) -> Change | None:
    """Check, load and persist the ruleset (None when in state)."""
    differs = state(facts, ruleset)
    if not differs:
        return None
    candidate = f"{RULESET}.gpuprov-new"
    commands = []
    if not facts.get("nft"):
        family = (facts.get("os") or {}).get("family") or "debian"
        pm = for_family(family)
        commands += [pm.update(), pm.install_names(["nftables"])]
    commands += [
        f"mkdir -p {q(RULESET.rsplit('/', 1)[0])} {q(LISTING.rsplit('/', 1)[0])}",
        write_file(candidate, ruleset, "0600"),
        f"if ! out=$(nft -c -f {q(candidate)} 2>&1); then echo \"nft -c rejected the ruleset: $out\" >&2; "
        f"rm -f {q(candidate)}; exit 1; fi",
        f"mv -f {q(candidate)} {q(RULESET)}",
        f"nft -f {q(RULESET)}",
        f"nft list table {TABLE} > {q(LISTING)}",
    ]
    if facts.get("systemd"):
        commands += [write_file(UNIT_FILE, unit_file()), "systemctl daemon-reload", f"systemctl enable {UNIT}"]
    current = (facts.get("files") or {}).get(RULESET)
    why = "; ".join(differs.values())
    return Change("firewall", f"{summary} ({why})", tuple(commands), diff=unified_diff(RULESET, current, ruleset))
