#!/bin/sh
# gpuprov idle validation: run validate's quick suite on this host while its GPUs are idle, so a GPU that degrades
# between jobs is found before the next job lands on it. Run by gpuprov-validate-idle.timer as root. Never while a
# GPU process runs: then it only records the skip. The suite, its venv and config are the ones `invoke validate`
# left in /opt/gpuprov; the results go to node_exporter's textfile folder (gpuprov_validate.prom, as validate's).
# Settings: /etc/gpuprov/monitoring.env (GPUPROV_HOST, GPUPROV_TEXTFILE_DIR).
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
set -u
. "${GPUPROV_MONITORING_ENV:-/etc/gpuprov/monitoring.env}"
root=/opt/gpuprov
dir=$GPUPROV_TEXTFILE_DIR
say() { echo "gpuprov-validate-idle: $*"; }
skip() {
  tmp=$(mktemp "$dir/.gpuprov-validate-idle.XXXXXX") || exit 1
  host=$(printf '%s' "$GPUPROV_HOST" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')
  { echo "# HELP gpuprov_validate_idle_skipped_timestamp_seconds When the idle validation last did not run (Unix time)"
    echo "# TYPE gpuprov_validate_idle_skipped_timestamp_seconds gauge"
    echo "gpuprov_validate_idle_skipped_timestamp_seconds{host=\"$host\",reason=\"$1\"} $(date +%s)"
  } > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$dir/gpuprov-validate-idle.prom"
  say "not run: $2"
  exit 0
}
if command -v nvidia-smi >/dev/null 2>&1; then
  if ! apps=$(timeout 60 nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); then
    skip nvml "nvidia-smi does not answer"
  fi
  [ -n "$(printf '%s' "$apps" | tr -d '[:space:]')" ] && skip busy "a GPU process runs: $(echo $apps)"
fi
[ -x "$root/venv/bin/python" ] && [ -d "$root/smoke" ] && [ -f "$root/run/config.json" ] ||
  skip no-suite "the suite is not on this host: run invoke validate --host $GPUPROV_HOST once"
rm -f "$dir/gpuprov-validate-idle.prom"
cd "$root" && exec "$root/venv/bin/python" -m smoke --config "$root/run/config.json" --level quick \
  --textfile "$dir/gpuprov_validate.prom" > "$root/run/idle-result.json"
