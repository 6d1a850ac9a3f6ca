#!/usr/bin/env bash
# The GPU-host part of docs/pitfalls.md in one go: the device suite (scripts/gpu-host.yaml) with GPU
# memory logged beside it, then the quick suite under compute-sanitizer when it is installed.
#   usage: bash scripts/gpu_host_checks.sh TARGET [DATA] [DEVICE] [OUT]
#   e.g.   bash scripts/gpu_host_checks.sh hf:/models/qwen2-vl-2b builtin:documents cuda:0
# Read the results as docs/pitfalls.md ("On a GPU host or a cluster") says; exit 1 if a gate failed.
set -uo pipefail
TARGET=${1:?usage: gpu_host_checks.sh TARGET [DATA] [DEVICE] [OUT]}
DATA=${2:-builtin:documents}
DEVICE=${3:-cuda:0}
OUT=${4:-gpu-host-report}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
status=0

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu --format=csv -lms 200 \
    >"$OUT/gpu-memory.csv" &
  smi=$!
  trap 'kill "$smi" 2>/dev/null' EXIT
  nvidia-smi topo -m >"$OUT/topology.txt" 2>&1 || true
fi

echo "== device suite on $DEVICE ($TARGET, $DATA) -> $OUT/device"
mmchaos validate --target "$TARGET" --device "$DEVICE" --data "$DATA" --suite "$HERE/gpu-host.yaml" \
  --out "$OUT/device" --store "$OUT/runs.db" || status=$?

if command -v compute-sanitizer >/dev/null; then
  echo "== quick suite under compute-sanitizer -> $OUT/sanitizer (slow: every kernel is checked)"
  compute-sanitizer --tool memcheck --target-processes all --log-file "$OUT/sanitizer.log" \
    mmchaos validate --target "$TARGET" --device "$DEVICE" --data "$DATA" --suite quick \
    --out "$OUT/sanitizer" --store "$OUT/runs.db" || status=$?
  grep -c "Invalid __global__" "$OUT/sanitizer.log" | xargs echo "invalid global accesses:"
else
  echo "compute-sanitizer not found (it ships with the CUDA toolkit): skipped the kernel memory check"
fi
echo "GPU memory over time: $OUT/gpu-memory.csv (a curve that stays up after a burst is a leak)"
exit "$status"
