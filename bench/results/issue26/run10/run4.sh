#!/usr/bin/env bash
# Session 12, device call 4 (warm after variants.sh, build-gpu reused): the restructured int8
# K/V offload (prepare walk computes K/V again and attends the first slice behind the copies
# out): the CUDA streaming int8 cases (memcmp against stock), then the 50-block H3 forward
# with attention int8 at S = 111,274: unlimited, 3G (the planner's pick) and 3G with one
# block slot (3G:no-prefetch), every hash compared with the unlimited run's.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake --build "$B" -j16 --target test_exec_streaming_cuda bench_budget >"$OUT/build4.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep error "$OUT/build4.log" | head; exit 1; }
TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
timeout 150 "$TS" --gtest_filter='*Int8*' >"$OUT/test_streaming.log" 2>&1
echo "streaming *Int8* rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/test_streaming.log" | head
timeout $(( 585 - ($(date +%s) - t0) )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "${BUDGETS:-unlimited,3G,3G:no-prefetch}" --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "\] budget|^budget \||^[a-z0-9:-]+ \|" "$OUT/budget_int8.log" | tail -8
echo "total $(( $(date +%s) - t0 )) s"
