#!/usr/bin/env bash
# The whole validation suite on this machine's GPUs from the standalone bundle, no gpuprov install: every check's
# verdict and every figure against the GPU's expected figures; one H100/H200 in under 8 minutes (bench/README.md).
#   bench/gpu_check.sh [BUNDLE ARGS...]      e.g. --level burn-in --burn-in-seconds 600, --only perf, --strict
# PYTHON: the Python to use (default python3; 3.9 or newer, with a CUDA build of torch; onnx, onnxruntime-gpu,
# dcgmi and nccl-tests are used where present). BUNDLE: the suite as one file (default build/gpuprov-smoke.pyz,
# written on any machine with gpuprov by `invoke validate.bundle`, then copied here). The document goes to
# bench/results/gpu-check-<UTC>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUNDLE=${BUNDLE:-build/gpuprov-smoke.pyz}
LIMIT_S=480           # the quick suite on one H100/H200: 8 minutes at most
BURN_IN_S=60          # the suite's default burn-in load (perf.matmul's timeout grows by as much)
if [ ! -f "$BUNDLE" ]; then
  echo "gpu_check: no bundle at $BUNDLE: build it with 'invoke validate.bundle' where gpuprov is installed" >&2
  exit 2
fi
if ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check: no nvidia-smi on PATH: this machine has no NVIDIA driver" >&2
  exit 2
fi
if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null; then
  echo "gpu_check: $PYTHON has no torch that sees a GPU (install a CUDA build of torch, or set PYTHON)" >&2
  exit 2
fi
level=quick
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --level) level=${args[i + 1]:-} ;;
    --level=*) level=${args[i]#--level=} ;;
    --burn-in-seconds) BURN_IN_S=${args[i + 1]:-} ;;
    --burn-in-seconds=*) BURN_IN_S=${args[i]#--burn-in-seconds=} ;;
  esac
done
if [ "$level" = burn-in ]; then   # dcgmi diag -r 3 (about 15 minutes where DCGM is installed) and the load
  LIMIT_S=$((LIMIT_S + 1800 + ${BURN_IN_S%.*}))
fi
mkdir -p bench/results
document=bench/results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ).json
began=$(date +%s)
rc=0
timeout --kill-after=30 "$LIMIT_S" "$PYTHON" "$BUNDLE" --json "$document" "$@" || rc=$?
took=$(($(date +%s) - began))
echo "gpu_check: ${took} s wall ($([ "$took" -le "$LIMIT_S" ] && echo under || echo OVER) the ${LIMIT_S} s limit);" \
  "exit $rc$([ "$rc" = 124 ] && echo ': timed out'); document $document"
exit "$rc"
