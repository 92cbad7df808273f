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
s nft-ruleset; have nft && nft -t list ruleset 2>/dev/null | head -c 262144
s iptables-legacy
# legacy rules are visible only where the legacy tables are loaded (reading them loads nothing)
for f in ip ip6; do
  if [ -n "$(cat "/proc/net/${f}_tables_names" 2>/dev/null)" ] && have "${f}tables-legacy-save"; then
    "${f}tables-legacy-save" 2>/dev/null | sed "s/^/$f /"
  fi
done
s firewall-units
# firewalls gpuprov does not own: ufw, firewalld, and nftables.service (it flushes the whole ruleset on restart)
if have systemctl; then
  for u in firewalld.service nftables.service; do
    e=$(systemctl is-enabled "$u" 2>/dev/null | head -n 1); a=$(systemctl is-active "$u" 2>/dev/null | head -n 1)
    echo "$u ${e:-absent} ${a:-unknown}"
  done
fi
# ufw.service runs (and is enabled) on Ubuntu even while ufw is off: ufw's own status and configuration say
grep -qs '^ENABLED=yes' /etc/ufw/ufw.conf && echo "ufw enabled"
have ufw && [ "$(ufw status 2>/dev/null | sed -n 's/^Status: //p' | head -n 1)" = active ] && echo "ufw active"
s docker-bridges
# the bridges of Docker's bridge networks: `ID NAME` (NAME `<no value>`: Docker's br-ID[:12]); no @@rc: no answer
if have docker && ids=$(timeout 30 docker network ls -q --no-trunc --filter driver=bridge 2>/dev/null); then
  [ -z "$ids" ] || timeout 30 docker network inspect -f '{{.Id}} {{index .Options "com.docker.network.bridge.name"}}' \
    $ids 2>/dev/null
  echo "@@rc=0"
fi
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
