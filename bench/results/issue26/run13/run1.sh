#!/usr/bin/env bash
# Session 15, device call 1 (carry [".deps"]): contract v3 (statistics per absolute block of
# 4,096 keys; K/V offload in two walks, K and V computed once). Bytes: test_attention_int8_cuda
# (CUDA = CPU reference, now with multi-block shapes: statistics, prepare, the rescale at block
# starts, streamed chunks across block boundaries), the whole CUDA streaming test. Speed: both
# kernels at full S (the rescale must not cost: run 12 call 5 had Hopper 590.3 TOP/s); the
# 50-block forward unlimited, 8G and 3G (hashes equal across budgets; v3 changes the hash).
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
left() { echo $(( 585 - ($(date +%s) - t0) )); }
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels bench_budget \
  bench_drift >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
timeout 200 "$TI" >"$OUT/test_int8.log" 2>&1; trc=$?
echo "test_attention_int8_cuda rc $trc ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure|Which is|differ" "$OUT/test_int8.log" | head -20
[ $trc -ne 0 ] && exit 1
timeout 200 "$TS" >"$OUT/test_streaming.log" 2>&1
echo "test_exec_streaming_cuda (all) rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/test_streaming.log" | head -20
timeout 120 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 \
  --out "$OUT/bench_int8.json" >"$OUT/bench_int8.log" 2>&1
echo "bench_int8_kernels rc $? ($(( $(date +%s) - t0 )) s)"; grep -v "^\s*$" "$OUT/bench_int8.log" | grep -v "^\[" | tail -14
timeout $(( $(left) - 5 )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "${BUDGETS:-unlimited,3G,8G}" --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
sed -n '/^budget |/,$p' "$OUT/budget_int8.log"
echo "total $(( $(date +%s) - t0 )) s"
