# gpuprov harden facts: what `invoke harden` plans and audits from, in one round trip. POSIX sh, read-only, run
# as root. Sections start with `@@gpuprov:NAME` (parsed by gpuprov/harden/facts.py); a missing tool prints nothing.
# Arguments: the inventory's user, then the files harden manages (their contents come back base64-encoded).
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
s() { printf '\n@@gpuprov:%s\n' "$1"; }
have() { command -v "$1" >/dev/null 2>&1; }
user=$1; shift

s os-release; cat /etc/os-release 2>/dev/null
s systemd; [ -d /run/systemd/system ] && echo yes
s ssh-connection
# the address the host sees gpuprov connect from: SSH_CONNECTION of the nearest process that has it (sudo resets
# the environment, so it is read from the login shell's)
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  v=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^SSH_CONNECTION=//p' | head -n 1)
  if [ -n "$v" ]; then echo "$v"; break; fi
  p=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null)
done
s user-groups; id -Gn -- "$user" 2>/dev/null
s sshd-T; if have sshd; then mkdir -p /run/sshd; sshd -T 2>&1; echo "@@rc=$?"; fi
s ssh-Q
if have ssh; then for q in kex cipher mac key-sig; do echo "$q $(ssh -Q "$q" 2>/dev/null | tr '\n' ' ')"; done; fi
s host-key-types
if have sshd; then
  sshd -T 2>/dev/null | awk '$1 == "hostkey" { print $2 }' | while read -r f; do
    [ -r "$f.pub" ] && cut -d' ' -f1 "$f.pub"
  done
fi
s sshd-dropins; ls -1 /etc/ssh/sshd_config.d 2>/dev/null
s nft-version; have nft && nft --version 2>/dev/null
s nft-table; if have nft; then nft list table inet gpuprov 2>/dev/null; echo "@@rc=$?"; fi
s units
if have systemctl; then
  for u in gpuprov-firewall.service apt-daily.timer apt-daily-upgrade.timer; do
    echo "$u $(systemctl is-enabled "$u" 2>/dev/null || true)"
  done
fi
s packages
have dpkg-query && dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' unattended-upgrades nftables \
  openssh-server 2>/dev/null | grep '^[hi]i'
s apt-config; have apt-config && apt-config dump 2>/dev/null | grep -E '^(APT::Periodic|Unattended-Upgrade)::'
s sysctl
for k in net/ipv4/ip_forward kernel/yama/ptrace_scope kernel/modules_disabled; do
  printf '%s %s\n' "$(echo "$k" | tr / .)" "$(cat "/proc/sys/$k" 2>/dev/null)"
done
s tmp-mount; awk '$2 == "/tmp" { print $4 }' /proc/mounts 2>/dev/null | tail -n 1
s docker; have dockerd && echo yes
s guards; ls -1 /run/gpuprov/harden 2>/dev/null
for f in "$@"; do
  s "file $f"
  if [ -r "$f" ]; then echo present; base64 < "$f"; elif [ -e "$f" ]; then echo unreadable; fi
done
s end
