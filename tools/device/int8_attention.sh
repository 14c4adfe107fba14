#!/usr/bin/env bash
# Issue 26 on the GPU machine: builds the INT8 attention test and benchmark (Release, CUDA
# sm_90, the carried headers as tools/device/build.sh) and runs them; logs under $OUT.
# Usage (device, repository root): tools/device/int8_attention.sh [S]
set -uo pipefail
S=${1:-111274}
OUT=${OUT:-/tmp/out}
B=build-gpu
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda test_exec_streaming_cuda bench_attention_int8 >"$OUT/build.log" 2>&1
rc=$?
echo "build rc $rc after $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; fi
"$B"/tests/test_attention_int8_cuda >"$OUT/test.log" 2>&1; echo "test rc $?"
grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED)|Failure|differ|expected|Which is" "$OUT/test.log" | head -40
"$B"/tests/test_exec_streaming_cuda --gtest_filter='*Int8*' >"$OUT/streaming.log" 2>&1; echo "streaming rc $?"
grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED)|Failure|differ|Which is" "$OUT/streaming.log" | head -40
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
"$B"/bench/bench_attention_int8 --s "$S" --reps 3 --out "$OUT/bench_attention_int8.json" >"$OUT/bench.log" 2>&1
echo "bench rc $?"
cat "$OUT/bench.log" | tail -20
echo "total $(( $(date +%s) - t0 )) s"
