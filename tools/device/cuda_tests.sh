#!/usr/bin/env bash
# One device call: every CUDA test executable of issue 4 (parity harness, cuDNN path,
# streaming ops, executor streaming, real-width plan invariance, golden ops and forward
# on the GPU), with binaries built elsewhere (carry ["build-bin"]: built with
# -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90, Release, stripped). The golden
# tests find their files under /work/main, so the tree is linked there. Logs under
# $OUT, one line per executable last.
# Usage (device): tools/device/cuda_tests.sh [executable ...]
set -uo pipefail
OUT=${OUT:-/tmp/ls-issue4-out}
mkdir -p "$OUT"
BIN=build-bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(test_backend_ops test_attention_cudnn test_streaming_ops test_golden_ops
  test_golden_forward test_exec_streaming_cuda test_real_width_invariance)
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/summary.txt"
for t in "${tests[@]}"; do
  [ -x "$BIN/$t" ] || { echo "$t: not in $BIN" | tee -a "$OUT/summary.txt"; continue; }
  s=$(date +%s)
  timeout ${T:-400} "$BIN/$t" >"$OUT/$t.log" 2>&1
  rc=$?
  printf '%-30s rc %3d  %s  (%d s)\n' "$t" $rc "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')" \
    $(($(date +%s) - s)) >>"$OUT/summary.txt"
  grep -E "Failure|differs|FAILED  \]" "$OUT/$t.log" | head -12
done
cat "$OUT/summary.txt"
