#!/usr/bin/env bash
# The whole validation suite on this machine's GPUs in under 5 minutes, its table printed last (bench/README.md).
#   bench/gpu_check.sh [--level quick|burn-in] [--only CHECKS] [--image IMAGE] [--strict]
# PYTHON names the Python to use (default python3): it needs torch (a CUDA build), numpy, onnx and onnxruntime-gpu
# for the suite, and gpuprov's own dependencies (pip install -e .) for the config and the reports.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check: no nvidia-smi on PATH: this machine has no NVIDIA driver" >&2
  exit 2
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "gpu_check: $PYTHON cannot import torch (install a CUDA build of torch, or set PYTHON)" >&2
  exit 2
fi
if ! "$PYTHON" -c 'import yaml, rich, junit_xml, prometheus_client, invoke' 2>/dev/null; then
  echo "gpu_check: $PYTHON lacks gpuprov's dependencies (pip install -e . in $(pwd))" >&2
  exit 2
fi
# every check has its own timeout inside the suite; this one bounds the whole run
exec timeout --kill-after=30 600 "$PYTHON" bench/gpu_check.py "$@"
