"""Unattended upgrades: the files harden writes read back by apt itself (`apt-config dump`), with every package
provisioning installs and holds kept out of them."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gpuprov.harden import updates
from gpuprov.harden.facts import parse_apt_config
from gpuprov.stack import families
from gpuprov.stack.resolve import PACKAGE_SECTIONS, resolve

needs_apt = pytest.mark.skipif(shutil.which("apt-config") is None, reason="apt-config is not installed")


def apt_dump(tmp_path, files: dict[str, str]) -> dict[str, list[str]]:
    """What apt makes of these apt.conf.d files (and nothing of this machine's), as the harden facts parse it."""
    parts = tmp_path / "apt.conf.d"
    parts.mkdir()
    for name, text in files.items():
        (parts / name).write_text(text)
    (tmp_path / "apt.conf").write_text(f'Dir::Etc::Parts "{parts}";\n')
    proc = subprocess.run(["apt-config", "dump"], capture_output=True, text=True, check=True,
                          env={"APT_CONFIG": str(tmp_path / "apt.conf"), "PATH": "/usr/bin:/bin"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("APT::Periodic::", "Unattended-Upgrade::"))]
    return parse_apt_config("\n".join(lines))


@pytest.mark.tool
@needs_apt
@pytest.mark.parametrize("os_id", ["debian", "ubuntu"])
def test_apt_reads_unattended_upgrades_on_over_a_distribution_default_off(tmp_path, os_id):
    config = apt_dump(tmp_path, {"20auto-upgrades": 'APT::Periodic::Unattended-Upgrade "0";\n',
                                 updates.AUTO_UPGRADES.rsplit("/", 1)[1]: updates.auto_upgrades(os_id),
                                 families.UNATTENDED.rsplit("/", 1)[1]: families.unattended()})
    assert config["APT::Periodic::Unattended-Upgrade"] == ["1"]
    assert config["APT::Periodic::Update-Package-Lists"] == ["1"]
    origins = config.get("Unattended-Upgrade::Origins-Pattern", []) + config.get("Unattended-Upgrade::Allowed-Origins",
                                                                                   [])
    assert len(origins) == 1 and "-security" in origins[0]


STACKS = [("H100-SXM", "ubuntu-22.04", 8, True), ("L40S", "debian-12", 4, False), ("B200", "ubuntu-24.04", 8, True),
          ("A100-PCIE-40GB", "ubuntu-22.04", 2, False)]


@pytest.mark.tool
@needs_apt
@pytest.mark.parametrize(("gpu", "os_key", "count", "nvswitch"), STACKS)
def test_every_package_provisioning_installs_is_blacklisted(tmp_path, gpu, os_key, count, nvswitch):
    """The resolver's packages for real fleets, against the blacklist as apt reads it (unattended-upgrades matches
    each entry as a regular expression at the start of a package name)."""
    stack = resolve(gpu, os_key, gpus=count, nvswitch=nvswitch).to_dict()
    names = {p["name"] for section in PACKAGE_SECTIONS for p in (stack.get(section) or {}).get("packages", [])}
    blacklist = apt_dump(tmp_path, {"51gpuprov-unattended-upgrades": families.unattended()})[
        "Unattended-Upgrade::Package-Blacklist"]
    assert names and not [n for n in names if not any(re.match(entry, n) for entry in blacklist)]


def test_no_change_when_everything_is_in_place():
    facts = {"os": {"id": "debian"}, "systemd": True, "packages": {"unattended-upgrades": "2.9.1+nmu3"},
             "units": {"apt-daily.timer": "enabled", "apt-daily-upgrade.timer": "enabled"},
             "files": {updates.AUTO_UPGRADES: updates.auto_upgrades("debian"),
                       families.UNATTENDED: families.unattended()}}
    assert list(updates.changes(facts)) == []


def test_a_bare_host_gets_the_package_the_files_and_the_timers():
    facts = {"os": {"id": "ubuntu"}, "systemd": True, "packages": {},
             "units": {"apt-daily.timer": "masked", "apt-daily-upgrade.timer": "disabled"}, "files": {}}
    summaries = [c.summary for c in updates.changes(facts)]
    assert summaries == ["install unattended-upgrades",
                         "create /etc/apt/apt.conf.d/21gpuprov-auto-upgrades (daily unattended security upgrades)",
                         "create /etc/apt/apt.conf.d/51gpuprov-unattended-upgrades (NVIDIA packages blacklisted, as "
                         "provision holds them)",
                         "enable apt-daily.timer, apt-daily-upgrade.timer (they start apt's daily runs)"]


def test_rhel_is_left_alone():
    assert list(updates.changes({"os": {"id": "rocky"}, "files": {}})) == []
