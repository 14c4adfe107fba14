#!/usr/bin/env bash
# Session 13, device call 1 (cold; carry [".deps"]): session 12's untested int8 offload
# changes on the GPU, and the question they were made for.
#  1. test_attention_int8_cuda (incl. "prepare in pieces into slices = one-call prepare") and
#     test_exec_streaming_cuda *Int8* (the pieces path: bf16 scratch <= 4,096 rows, 16,384-key
#     int8 chunks), memcmp against stock.
#  2. bench_int8_kernels --chunked 8089: the 3G plan's query slice against all 111,274 keys in
#     one call, then in 4,096 / 8,192 / 16,384 / 32,768-key chunks carrying the state
#     (per-call cost of streamed chunks vs. the slice size).
#  3. the 50-block H3 forward, attention int8, S = 111,274: unlimited and 3G (16,384-key
#     chunks now), every hash compared with the unlimited run's.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels bench_budget >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
timeout 120 "$TI" >"$OUT/test_int8.log" 2>&1
echo "test_attention_int8_cuda rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure|Which is" "$OUT/test_int8.log" | head -20
timeout 150 "$TS" --gtest_filter='*Int8*' >"$OUT/test_streaming.log" 2>&1
echo "test_exec_streaming_cuda *Int8* rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED|  OK)|Failure" "$OUT/test_streaming.log" | head -20
timeout 90 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-portable --no-bf16 --chunked 8089 \
  --out "$OUT/bench_chunked.json" >"$OUT/bench_chunked.log" 2>&1
echo "bench_int8_kernels --chunked rc $? ($(( $(date +%s) - t0 )) s)"; tail -14 "$OUT/bench_chunked.log"
timeout $(( 585 - ($(date +%s) - t0) )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "${BUDGETS:-unlimited,3G}" --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "\] budget|^budget \||^[a-z0-9:-]+ \|" "$OUT/budget_int8.log" | tail -8
echo "total $(( $(date +%s) - t0 )) s"
