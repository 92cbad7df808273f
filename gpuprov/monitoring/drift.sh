#!/bin/sh
# gpuprov drift: what changed on this host since gpuprov set it up, as Prometheus textfile metrics, so that an
# unattended upgrade that breaks NVML is an alert before a job fails. Run by gpuprov-drift.timer as root.
# Settings: /etc/gpuprov/monitoring.env (written by `invoke monitoring.deploy`):
#   GPUPROV_HOST (the inventory name), GPUPROV_TEXTFILE_DIR, GPUPROV_GPU_COUNT (the inventory's hardware.count),
#   GPUPROV_COST_PER_HOUR and GPUPROV_CURRENCY (optional)
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
set -u
. "${GPUPROV_MONITORING_ENV:-/etc/gpuprov/monitoring.env}"
have() { command -v "$1" >/dev/null 2>&1; }
# a label value as the exposition format writes it: backslash, double quote and newline escaped
label() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | awk 'NR > 1 { printf "\\n" } { printf "%s", $0 }'; }
# the upstream version of an installed package (Debian: before the last '-'; RPM: %{VERSION}), else nothing
pkg_version() {
  if have dpkg-query; then
    dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null | awk '$1 ~ /^[ih]i/ { print $2; exit }' |
      sed -e 's/^[0-9]*://' -e 's/-[^-]*$//'
  elif have rpm; then
    rpm -q --qf '%{VERSION}\n' "$1" 2>/dev/null | grep -v 'not installed' | head -n 1
  fi
}
first_installed() { for p in "$@"; do v=$(pkg_version "$p"); [ -n "$v" ] && { echo "$v"; return; }; done; }

# NVML answers only when the loaded kernel module matches the user-space library
mismatch=0
driver=""
if have nvidia-smi; then
  out=$(timeout 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1)
  rc=$?
  case "$out" in
    *"Driver/library version mismatch"*) mismatch=1 ;;
    *) [ "$rc" -eq 0 ] && driver=$(printf '%s\n' "$out" | head -n 1 | tr -d ' ') ;;
  esac
fi
# the loaded module's version: the first X.Y[.Z] word of the NVRM line ("NVIDIA UNIX x86_64 Kernel Module  570.148.08"
# or "NVIDIA UNIX Open Kernel Module for x86_64  570.148.08"); GPUPROV_NVRM_FILE stands in for /proc in tests
module=$(sed -n '1s/^NVRM version://p' "${GPUPROV_NVRM_FILE:-/proc/driver/nvidia/version}" 2>/dev/null |
  tr ' ' '\n' | grep -E '^[0-9]+\.[0-9]+(\.[0-9]+)?$' | head -n 1)
library=$(ls /usr/lib/*/libnvidia-ml.so.*.* /usr/lib64/libnvidia-ml.so.*.* 2>/dev/null | head -n 1 |
  sed -n 's/.*libnvidia-ml\.so\.\([0-9][0-9.]*\)$/\1/p')
[ -n "$module" ] && [ -n "$library" ] && [ "$module" != "$library" ] && mismatch=1
[ -z "$driver" ] && driver=$module

cuda=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'cuda-toolkit-[0-9]*' 2>/dev/null |
  awk '$1 ~ /^[ih]i/ && $2 ~ /^cuda-toolkit-[0-9]+-[0-9]+$/ { print $2 }' | sort -V | tail -n 1)
cuda=${cuda:+$(pkg_version "$cuda")}
nccl=$(first_installed libnccl2 libnccl)
toolkit=$(first_installed nvidia-container-toolkit)
reboot=0
{ [ -e /var/run/reboot-required ] || [ -e /run/gpuprov/reboot-pending ]; } && reboot=1

host=$(label "$GPUPROV_HOST")
dir=$GPUPROV_TEXTFILE_DIR
tmp=$(mktemp "$dir/.gpuprov-drift.XXXXXX") || exit 1
{
  echo "# HELP gpuprov_driver_library_mismatch 1 when NVML fails with a driver/library version mismatch"
  echo "# TYPE gpuprov_driver_library_mismatch gauge"
  echo "gpuprov_driver_library_mismatch{host=\"$host\"} $mismatch"
  echo "# HELP gpuprov_stack_info The NVIDIA stack installed on the host (value 1)"
  echo "# TYPE gpuprov_stack_info gauge"
  echo "gpuprov_stack_info{host=\"$host\",driver=\"$(label "$driver")\",cuda=\"$(label "$cuda")\",nccl=\"$(label "$nccl")\",toolkit=\"$(label "$toolkit")\"} 1"
  echo "# HELP gpuprov_gpus_expected The GPUs the inventory gives the host (hardware.count)"
  echo "# TYPE gpuprov_gpus_expected gauge"
  echo "gpuprov_gpus_expected{host=\"$host\"} ${GPUPROV_GPU_COUNT:-0}"
  echo "# HELP gpuprov_reboot_required 1 when the OS or gpuprov waits for a reboot"
  echo "# TYPE gpuprov_reboot_required gauge"
  echo "gpuprov_reboot_required{host=\"$host\"} $reboot"
  if [ -n "${GPUPROV_COST_PER_HOUR:-}" ]; then
    echo "# HELP gpuprov_cost_per_hour What the host costs per hour (the inventory's cost.per_hour)"
    echo "# TYPE gpuprov_cost_per_hour gauge"
    echo "gpuprov_cost_per_hour{host=\"$host\",currency=\"$(label "${GPUPROV_CURRENCY:-USD}")\"} $GPUPROV_COST_PER_HOUR"
  fi
  echo "# HELP gpuprov_drift_timestamp_seconds When the drift check last ran (Unix time)"
  echo "# TYPE gpuprov_drift_timestamp_seconds gauge"
  echo "gpuprov_drift_timestamp_seconds{host=\"$host\"} $(date +%s)"
} > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$dir/gpuprov-drift.prom" || { rm -f "$tmp"; exit 1; }
