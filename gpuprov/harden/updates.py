"""Unattended security upgrades on (Debian and Ubuntu), with every NVIDIA package provisioning holds kept out of them:
the blacklist is provisioning's own file (gpuprov.ops.pins), written the same way by both tasks."""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.ops import pins
from gpuprov.ops.base import Change, unified_diff, write_file
from gpuprov.ops.pkg import for_family

PACKAGE = "unattended-upgrades"
AUTO_UPGRADES = "/etc/apt/apt.conf.d/21gpuprov-auto-upgrades"   # after Debian's 20auto-upgrades, so it wins
TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")
FILES = (AUTO_UPGRADES, pins.UNATTENDED)
# the security archive of each distribution, in the form unattended-upgrades matches it
SECURITY_ORIGINS = {
    "debian": ("Origins-Pattern", "origin=Debian,codename=${distro_codename}-security,label=Debian-Security"),
    "ubuntu": ("Allowed-Origins", "${distro_id}:${distro_codename}-security"),
}


def auto_upgrades(os_id: str) -> str:
    """The periodic settings that turn unattended upgrades on, and the security archive they take."""
    key, origin = SECURITY_ORIGINS[os_id]
    return ("// Managed by gpuprov (invoke harden): security upgrades every day, unattended; the NVIDIA stack is\n"
            f"// kept out of them by {pins.UNATTENDED}.\n"
            'APT::Periodic::Update-Package-Lists "1";\nAPT::Periodic::Unattended-Upgrade "1";\n'
            f'Unattended-Upgrade::{key} {{\n    "{origin}";\n}};\n')


def supported(facts: dict) -> bool:
    return (facts.get("os") or {}).get("id") in SECURITY_ORIGINS


def _file(facts: dict, path: str, content: str, what: str) -> Change | None:
    current = (facts.get("files") or {}).get(path)
    if current == content:
        return None
    verb = "update" if current is not None else "create"
    return Change("updates", f"{verb} {path} ({what})", (write_file(path, content),),
                  diff=unified_diff(path, current, content))


def changes(facts: dict) -> Iterator[Change]:
    """Install unattended-upgrades, write its settings and provisioning's blacklist, enable the apt timers."""
    if not supported(facts):
        return
    if PACKAGE not in (facts.get("packages") or {}):
        pm = for_family("debian")
        yield Change("updates", f"install {PACKAGE}", (pm.update(), pm.install_names([PACKAGE])))
    planned = [_file(facts, AUTO_UPGRADES, auto_upgrades(facts["os"]["id"]), "daily unattended security upgrades"),
               _file(facts, pins.UNATTENDED, pins.unattended(), "NVIDIA packages blacklisted, as provision holds them")]
    yield from (change for change in planned if change is not None)
    units = facts.get("units") or {}
    off = [timer for timer in TIMERS if units.get(timer) != "enabled"]
    if off and facts.get("systemd"):
        yield Change("updates", f"enable {', '.join(off)} (they start apt's daily runs)",
                     (f"systemctl unmask {' '.join(off)}", f"systemctl enable --now {' '.join(off)}"))
