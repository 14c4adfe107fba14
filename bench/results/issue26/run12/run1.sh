#!/usr/bin/env bash
# Session 14, device call 1 (carry [".deps"]): the Hopper int8 kernel made persistent (one CTA
# per SM over the (query tile, head) items; its TMA ring and the consumers' ping-pong run on
# from one item into the next), the old launch kept as "hopper-grid". Arithmetic untouched:
# test_attention_int8_cuda (CUDA = CPU bytes; now 204 items > 132 SMs, persistent = grid =
# portable, and streamed chunks) must pass; streaming Int8; then both launches at full S and
# chunked at the 3G plan's 8,023-row slice, with the bf16 kernels chunked too (session 13's
# unrun measurement); then the 50-block forward, attention int8, unlimited and 3G, hashes
# compared with run 11's c6617ec49d3afcda.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels bench_budget >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
timeout 150 "$TI" >"$OUT/test_int8.log" 2>&1; trc=$?
echo "test_attention_int8_cuda rc $trc ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure|Which is|differ" "$OUT/test_int8.log" | head -20
[ $trc -ne 0 ] && exit 1
timeout 150 "$TS" --gtest_filter='*Int8*' >"$OUT/test_streaming.log" 2>&1
echo "test_exec_streaming_cuda *Int8* rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/test_streaming.log" | head -20
timeout 200 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --chunked 8023 \
  --out "$OUT/bench_chunked.json" >"$OUT/bench_chunked.log" 2>&1
echo "bench_int8_kernels rc $? ($(( $(date +%s) - t0 )) s)"; grep -v "^\s*$" "$OUT/bench_chunked.log" | grep -v "^\[" | tail -40
timeout $(( 585 - ($(date +%s) - t0) )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "${BUDGETS:-unlimited,3G}" --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
sed -n '/^budget |/,$p' "$OUT/budget_int8.log"
echo "total $(( $(date +%s) - t0 )) s"
