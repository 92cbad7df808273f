# gpuprov facts: everything gpuprov needs to know about a host, in one round trip.
# POSIX sh, read-only. Each section starts with a marker line `@@gpuprov:NAME`; the controller parses the
# sections (gpuprov/facts/parsers.py). A missing tool prints nothing: the parser turns that into null.
# Arguments: paths of the files gpuprov manages; their contents come back base64-encoded.
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
s() { printf '\n@@gpuprov:%s\n' "$1"; }
have() { command -v "$1" >/dev/null 2>&1; }
k=$(uname -r)

s os-release; cat /etc/os-release 2>/dev/null
s uname; printf '%s\n%s\n' "$k" "$(uname -m)"
s cpus; getconf _NPROCESSORS_ONLN 2>/dev/null
s meminfo; grep -E '^MemTotal:' /proc/meminfo
s lspci; have lspci && lspci -D -nn 2>/dev/null | grep -F '[10de:'
s nvidia-smi
if have nvidia-smi; then timeout 60 nvidia-smi -q 2>&1; echo "@@rc=$?"; fi
s nvrm; cat /proc/driver/nvidia/version 2>/dev/null
s modules; cut -d' ' -f1 /proc/modules 2>/dev/null | grep -E '^(nouveau|nvidia|nvidia_uvm|nvidia_drm|nvidia_modeset)$'
s nouveau-blacklist; grep -rhsE '^[[:space:]]*blacklist[[:space:]]+nouveau' /etc/modprobe.d /usr/lib/modprobe.d /lib/modprobe.d
s packages
if have dpkg-query; then
  dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Version}\n' 'nvidia*' 'libnvidia*' 'cuda*' 'libcu*' 'libnpp*' 'libnv*' \
    'gds-tools*' 'nsight-*' 'libnccl*' 'datacenter-gpu-manager*' 'libxnvctrl*' 'xserver-xorg-video-nvidia*' 'nvlsm*' 'dkms' \
    'linux-headers-*' 'linux-image-*' 'docker.io' 'docker-ce' 'unattended-upgrades' 'prometheus' \
    'prometheus-node-exporter' 2>/dev/null | grep '^[ih]i'
elif have rpm; then
  rpm -qa --qf 'ii \t%{NAME}\t%{EPOCH}:%{VERSION}-%{RELEASE}\n' 2>/dev/null |
    grep -E '	(nvidia|libnvidia|cuda|libcu|libnpp|libnv|gds-tools|nsight-|libnccl|datacenter-gpu-manager|dkms|kmod-nvidia|kernel-devel|kernel-headers|docker|moby|python3-dnf-plugin-versionlock|nvlsm|prometheus)'
fi
s secure-boot
if [ -d /sys/firmware/efi ]; then
  f=$(ls /sys/firmware/efi/efivars/SecureBoot-* 2>/dev/null | head -n 1)
  if [ -n "$f" ]; then od -An -t u1 -j 4 -N 1 "$f" 2>/dev/null; else echo unknown; fi
else
  echo bios
fi
s kernel-headers
if [ -e "/lib/modules/$k/build" ] || [ -d "/usr/src/linux-headers-$k" ] || [ -d "/usr/src/kernels/$k" ]; then echo yes; else echo no; fi
s docker; have dockerd && dockerd --version 2>/dev/null
s docker-runtimes; have docker && timeout 20 docker info --format '{{json .Runtimes}}' 2>/dev/null
s containers
if have docker; then timeout 20 docker ps --format '{{.ID}}\t{{.Names}}\t{{.Image}}' 2>/dev/null; echo "@@rc=$?"; fi
s ctk-daemon-json
# what `nvidia-ctk runtime configure` would write, made on a temporary copy (the real diff for the plan)
if have nvidia-ctk && have dockerd; then
  t=$(mktemp -d) && { [ -f /etc/docker/daemon.json ] && cp /etc/docker/daemon.json "$t/daemon.json"
    nvidia-ctk runtime configure --runtime=docker --config="$t/daemon.json" >/dev/null 2>&1 && base64 < "$t/daemon.json"
    rm -rf "$t"; }
fi
s ctk; have nvidia-ctk && nvidia-ctk --version 2>/dev/null
s services
have systemctl && systemctl show -p Id,LoadState,UnitFileState,ActiveState docker nvidia-fabricmanager \
  nvidia-dcgm nvidia-persistenced nvlsm unattended-upgrades cloud-init prometheus-node-exporter prometheus \
  nvidia-dcgm-exporter gpuprov-drift.timer gpuprov-validate-idle.timer 2>/dev/null
s fabricmanager; have nv-fabricmanager && nv-fabricmanager --version 2>/dev/null
s dcgm; have dcgmi && dcgmi --version 2>/dev/null
s reboot-required; [ -f /var/run/reboot-required ] && echo yes
s reboot-required-pkgs; cat /var/run/reboot-required.pkgs 2>/dev/null
s gpuprov-reboot-pending; cat /run/gpuprov/reboot-pending 2>/dev/null
s gpu-processes
if have nvidia-smi; then
  timeout 30 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null
  echo "@@rc=$?"
fi
s device-users
# processes holding a GPU device open: what runs even when NVML cannot answer (driver/library mismatch)
if [ -d /proc/driver/nvidia ]; then
  find /proc/[0-9]*/fd -maxdepth 1 -lname '/dev/nvidia[0-9]*' 2>/dev/null | cut -d/ -f3 | sort -un |
    while read -r p; do echo "$p $(cat "/proc/$p/comm" 2>/dev/null)"; done
fi
s slurm
if have squeue; then timeout 20 squeue -h -w "$(hostname -s)" -o '%i %u %j' 2>/dev/null; echo "@@rc=$?"; fi
s dkms; have dkms && dkms status 2>/dev/null
s kernels; ls -1 /lib/modules 2>/dev/null
s dpkg-interrupted; [ -d /var/lib/dpkg/updates ] && ls -A /var/lib/dpkg/updates 2>/dev/null | head -n 3
s package-manager-busy; have pgrep && pgrep -a -x 'apt|apt-get|dpkg|unattended-upgr|dnf|yum|packagekitd' 2>/dev/null
s cloud-init; have cloud-init && cloud-init status 2>/dev/null
s disk; df -Pk / /var 2>/dev/null
s date; date -u +%Y-%m-%dT%H:%M:%SZ
for f in "$@"; do
  s "file $f"
  if [ -r "$f" ]; then echo present; base64 < "$f"; elif [ -e "$f" ]; then echo unreadable; fi
done
s end
