#!/usr/bin/env bash
# Session 16, device call 2 (carry [".deps"]; V4 = the v4 tree, D = its dir, default "."; V3 =
# contract v3's tree (main before v4) for the side-by-side rate, optional): contract v4 (K scale
# per key group, the one-FFMA score). Bytes: test_attention_int8_cuda (CUDA = CPU reference:
# both kernels, both p8 paths, prepare in pieces, huge scores), the CUDA streaming test. Speed:
# both kernels at S = 111,274 beside v3's (alternating), then the 50-block forward unlimited,
# 3G, 8G (hashes equal across budgets).
set -uo pipefail
OUT=${OUT:-/tmp/out}; D=${D:-.}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
left() { echo $(( 585 - ($(date +%s) - t0) )); }
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest"; }
( cfg "$D" build-v4 >"$OUT/cfg4.log" 2>&1 && cmake --build build-v4 -j16 --target test_attention_int8_cuda \
  test_exec_streaming_cuda bench_int8_kernels bench_budget >"$OUT/build4.log" 2>&1 ) &
p4=$!
if [ -n "${V3:-}" ]; then
  ( cfg "$V3" build-v3 >"$OUT/cfg3.log" 2>&1 && cmake --build build-v3 -j16 --target bench_int8_kernels >"$OUT/build3.log" 2>&1 ) &
  p3=$!
fi
wait $p4; rc=$?; echo "build v4 rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build4.log" | head -30; exit 1; }
[ -n "${V3:-}" ] && { wait $p3; echo "build v3 rc $? after $(( $(date +%s) - t0 )) s"; }
TI=$(find build-v4 -name test_attention_int8_cuda -type f | head -1)
TS=$(find build-v4 -name test_exec_streaming_cuda -type f | head -1)
timeout 200 "$TI" >"$OUT/test_int8.log" 2>&1; trc=$?
echo "test_attention_int8_cuda rc $trc ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure|Which is|differ" "$OUT/test_int8.log" | head -20
[ $trc -ne 0 ] && exit 1
timeout 150 "$TS" >"$OUT/test_streaming.log" 2>&1
echo "test_exec_streaming_cuda (all) rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/test_streaming.log" | head -20
for i in 1 2; do
  for v in v4 v3; do
    [ -x build-$v/bench/bench_int8_kernels ] || continue
    timeout 60 build-$v/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --out "$OUT/bench_${v}_$i.json" \
      >"$OUT/bench_${v}_$i.log" 2>&1
    echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|hopper_grid|portable) ' "$OUT/bench_${v}_$i.log" | awk '{printf "%s %s TOP/s; ", $1, $8}')"
  done
done
grep -E "differ" "$OUT/bench_v4_1.log"
timeout $(( $(left) - 5 )) build-v4/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "${BUDGETS:-unlimited,3G,8G}" --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
sed -n '/^budget |/,$p' "$OUT/budget_int8.log"
echo "total $(( $(date +%s) - t0 )) s"
