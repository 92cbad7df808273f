"""Unattended security upgrades on (Debian and Ubuntu), with every NVIDIA package provisioning holds kept out of them:
the blacklist is provisioning's own file (gpuprov.provision.ops.pins), written the same way by both tasks."""

from __future__ import annotations

from collections.abc import Iterator

from gpuprov.core.operations import Change, install_change, managed_file
from gpuprov.core.packages import for_family
from gpuprov.stack import families

PACKAGE = "unattended-upgrades"
AUTO_UPGRADES = "/etc/apt/apt.conf.d/21gpuprov-auto-upgrades"   # after Debian's 20auto-upgrades, so it wins
TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")
FILES = (AUTO_UPGRADES, families.UNATTENDED)
# the security archive of each distribution, in the form unattended-upgrades matches it
SECURITY_ORIGINS = {
    "debian": ("Origins-Pattern", "origin=Debian,codename=${distro_codename}-security,label=Debian-Security"),
    "ubuntu": ("Allowed-Origins", "${distro_id}:${distro_codename}-security"),
}


def auto_upgrades(os_id: str) -> str:
    """The periodic settings that turn unattended upgrades on, and the security archive they take."""
    key, origin = SECURITY_ORIGINS[os_id]
    return ("// Managed by gpuprov (invoke harden): security upgrades every day, unattended; the NVIDIA stack is\n"
            f"// kept out of them by {families.UNATTENDED}.\n"
            'APT::Periodic::Update-Package-Lists "1";\nAPT::Periodic::Unattended-Upgrade "1";\n'
            f'Unattended-Upgrade::{key} {{\n    "{origin}";\n}};\n')


def supported(facts: dict) -> bool:
    return (facts.get("os") or {}).get("id") in SECURITY_ORIGINS


def changes(facts: dict) -> Iterator[Change]:
    """Install unattended-upgrades, write its settings and provisioning's blacklist, enable the apt timers."""
    if not supported(facts):
        return
    install = install_change("updates", for_family("debian"), [PACKAGE], facts.get("packages") or {})
    if install is not None:
        yield install
    files = facts.get("files") or {}
    planned = [managed_file("updates", path, files.get(path), content, what) for path, content, what in (
        (AUTO_UPGRADES, auto_upgrades(facts["os"]["id"]), "daily unattended security upgrades"),
        (families.UNATTENDED, families.unattended(), "NVIDIA packages blacklisted, as provision holds them"))]
    yield from (change for change in planned if change is not None)
    units = facts.get("units") or {}
    off = [timer for timer in TIMERS if units.get(timer) != "enabled"]
    if off and facts.get("systemd"):
        yield Change("updates", f"enable {', '.join(off)} (they start apt's daily runs)",
                     (f"systemctl unmask {' '.join(off)}", f"systemctl enable --now {' '.join(off)}"))
