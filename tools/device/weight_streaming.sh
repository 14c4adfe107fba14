#!/usr/bin/env bash
# One device call for issue 5 (weight streaming, K/V and residual offload) with binaries
# built elsewhere (carry ["build-bin"]: layerstream, bench_budget and the CUDA test
# executables, built with -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 and
# stripped) or built here when build-bin is absent (carry [".deps"]).
# Runs the streaming op tests, the executor streaming tests, the parity harness, then a
# short bench_budget at full width with few blocks. Logs under $OUT; a table last.
# Usage (device): tools/device/weight_streaming.sh [blocks for the short bench, default 3]
set -uo pipefail
OUT=${OUT:-/tmp/ls-stream-out}
mkdir -p "$OUT"
BIN=build-bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if [ ! -x $BIN/layerstream ]; then
  tools/device/build.sh build-gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  mkdir -p $BIN && cp build-gpu/layerstream build-gpu/bench/bench_budget build-gpu/tests/test_streaming_ops \
    build-gpu/tests/test_exec_streaming_cuda build-gpu/tests/test_backend_ops build-gpu/tests/test_attention_cudnn $BIN/
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/summary.txt"
for t in test_streaming_ops test_exec_streaming_cuda test_backend_ops; do
  s=$(date +%s)
  timeout 300 $BIN/$t >"$OUT/$t.log" 2>&1
  rc=$?
  printf '%-28s rc %d  %s  (%d s)\n' "$t" $rc "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')" $(($(date +%s) - s)) | tee -a "$OUT/summary.txt"
  grep -E "Failure|differs|error" "$OUT/$t.log" | head -20
done
B=${1:-3}
timeout 400 $BIN/bench_budget --blocks "$B" --budgets unlimited,8G,4G,3G,2G --json "$OUT/bench_short.json" >"$OUT/bench_short.log" 2>&1
echo "bench_budget --blocks $B rc $?" | tee -a "$OUT/summary.txt"
grep -E "^\[|^budget|\|" "$OUT/bench_short.log" | cut -c1-300 | tail -30
