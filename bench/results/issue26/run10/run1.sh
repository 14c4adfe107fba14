#!/usr/bin/env bash
# Session 12, device call 1 (nvidia-h200, carry [".deps"]): build the int8 tests and the
# benchmarks once (build-gpu, tools/device/build.sh's configure line), the int8 CUDA = CPU
# byte tests, then the 50-block H3 forward with attention int8 at S = 111,274, unlimited and
# 3G (bench_budget --attention int8): the 3G plan chosen with v2's rates (586 / 225 TOP/s).
# Call 2 (run2.sh) reuses build-gpu on the warm machine.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git log --oneline -1 2>/dev/null || true
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels \
  bench_budget bench_drift bench_cuda_block layerstream >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1); TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
"$TI" >"$OUT/test_int8.log" 2>&1; echo "test_attention_int8_cuda rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|\[ info \]" "$OUT/test_int8.log" | head
timeout 120 "$TS" --gtest_filter='*Int8*' >"$OUT/test_streaming.log" 2>&1
echo "streaming *Int8* rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^\[  (FAILED|PASSED)" "$OUT/test_streaming.log"
timeout "${BUDGET_LIMIT:-420}" "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets unlimited,3G --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[3G\] budget|^budget \||^[a-z0-9]+ \|" "$OUT/budget_int8.log" | tail -4
echo "total $(( $(date +%s) - t0 )) s"
