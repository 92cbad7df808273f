"""The firewall's change: the rendered ruleset checked with `nft -c` on the host, loaded (gpuprov's table only) and
persisted by a boot unit; nothing when the file, the live table and the unit already are what the inventory says.

The live table is compared with the listing `nft list table` gave right after gpuprov loaded the file
(firewall.LISTING): any change to the live table since, or to the file, shows.

nftables is installed by a change of its own, before the guard is armed (apt may wait minutes for its lock; the
revert window must not). With the ruleset comes a drop-in for the boot unit: it does not load the ruleset while the
harden run that wrote it is undecided (gpuprov-harden-boot-revert.service puts the previous one back first)."""

from __future__ import annotations

import shlex

from gpuprov.core.operations import Change, install_change, managed_file, write_file
from gpuprov.core.packages import for_family
from gpuprov.harden.firewall import LISTING, RULESET, TABLE, UNIT, UNIT_FILE, unit_file
from gpuprov.harden.guard import BOOT_UNIT, GUARD_DIR

WANTS_LINK = f"/etc/systemd/system/multi-user.target.wants/{UNIT}"
FILES = (RULESET, LISTING, UNIT_FILE)
GUARD_DROPIN = f"{UNIT_FILE}.d/10-gpuprov-guard.conf"
GUARDED_FILES = (*FILES, WANTS_LINK, GUARD_DROPIN)   # what the guard puts back
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


def guard_dropin() -> str:
    """The boot unit's drop-in: no ruleset is loaded while a harden run's guard is armed (undecided)."""
    return ("# Managed by gpuprov (invoke harden): a ruleset whose harden run is undecided is not loaded at boot;\n"
            f"# {BOOT_UNIT} puts the previous one back first.\n"
            f"[Unit]\nAfter={BOOT_UNIT}\nConditionPathExistsGlob=!{GUARD_DIR}/*/armed\n"
            f"ConditionPathExists={RULESET}\n")


def install(facts: dict) -> Change | None:
    """Install nftables when the host lacks it (a plain step, before the guard is armed); None when present."""
    present = {"nftables": "nft answers"} if facts.get("nft") else {}   # facts tell the program, not the package
    return install_change("packages", for_family((facts.get("os") or {}).get("family") or "debian"), ["nftables"],
                          present, "before the guarded changes: apt may wait for its lock, the host's revert window "
                                   "does not")


def change(facts: dict, ruleset: str, summary: str) -> Change | None:
    """Stage the ruleset, check it with `nft -c` before it replaces the old file, load it, record its listing and
    persist it (the boot unit and its guard drop-in); None when in state."""
    differs = state(facts, ruleset)
    if not differs:
        return None
    then = [f"nft -f {q(RULESET)}",
            f"mkdir -p {q(LISTING.rsplit('/', 1)[0])} && nft list table {TABLE} > {q(LISTING)}"]
    if facts.get("systemd"):
        then += [write_file(UNIT_FILE, unit_file()), write_file(GUARD_DROPIN, guard_dropin()),
                 "systemctl daemon-reload", f"systemctl enable {UNIT}"]
    return managed_file("firewall", RULESET, (facts.get("files") or {}).get(RULESET), ruleset, "nftables ruleset",
                        mode="0600", validate="nft -c -f %s", rejected="nft -c rejected the ruleset",
                        then=tuple(then), always=True, summary=f"{summary} ({'; '.join(differs.values())})")
