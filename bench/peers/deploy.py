"""The steps `gpuprov provision --reboot never` takes on a lab host, written the pyinfra way.

Each host's data (exact package versions, file contents) comes from the inventory bench/provision.py writes
from gpuprov's own resolver, so both do the same work. Nothing here reboots.
"""

from io import StringIO

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files, server, systemd

files_ = host.data.bench_files

keyring = files.put(name="Repository signing key (keyring)", src=host.data.bench_keyring_file,
                    dest="/usr/share/keyrings/gpuprov-nvidia.gpg", mode="644")
files.put(name="Repository signing key (fingerprint stamp)", src=StringIO(files_["key_stamp"]),
          dest="/etc/gpuprov/repo-key.fingerprint", mode="644")
listing = files.put(name="Repository list", src=StringIO(files_["apt_list"]),
                    dest="/etc/apt/sources.list.d/gpuprov-nvidia.list", mode="644")
apt.update(name="Refresh the package index when the sources changed",
           _if=lambda: keyring.did_change() or listing.did_change())

apt.packages(name="Kernel headers and dkms", packages=host.data.bench_header_packages, no_recommends=True)
nouveau = files.put(name="Blacklist nouveau", src=StringIO(files_["nouveau"]),
                    dest="/etc/modprobe.d/gpuprov-blacklist-nouveau.conf", mode="644")
server.shell(name="Rebuild the initramfs", _if=nouveau.did_change,
             commands=["if command -v update-initramfs >/dev/null; then update-initramfs -u; fi"])

# the pins come first, as in gpuprov's driver step: the mirror carries a newer point release of the branch
files.put(name="apt pins at exact versions", src=StringIO(files_["preferences"]),
          dest="/etc/apt/preferences.d/gpuprov-nvidia", mode="644")

for component in host.data.bench_components:
    apt.packages(name=f"{component['name']} packages at exact versions", packages=component["packages"],
                 no_recommends=True, allow_downgrades=True)

files.put(name="udev rule for /dev/char symlinks", src=StringIO(files_["udev"]),
          dest="/etc/udev/rules.d/71-gpuprov-nvidia-dev-char.rules", mode="644")
for service in host.data.bench_services:
    systemd.service(name=f"{service} enabled (starts with the new driver after a reboot)", service=service,
                    running=None, enabled=True)

files.put(name="unattended-upgrades blacklist", src=StringIO(files_["unattended"]),
          dest="/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades", mode="644")

held = set((host.get_fact(Command, "apt-mark showhold") or "").split())
to_hold = [name for name in host.data.bench_holds if name not in held]
if to_hold:
    server.shell(name="Hold every stack package", commands=["apt-mark hold " + " ".join(to_hold)])
