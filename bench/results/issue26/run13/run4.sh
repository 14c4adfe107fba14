#!/usr/bin/env bash
# Session 15, device call 4 (carry [".deps"]; v2src/ = `git archive b933bed`, untracked, staged by
# the lead): the portable kernel's rescale moved out of the tile loop (an outer loop over the
# statistics blocks, the tile loop v2's body). Bytes: test_attention_int8_cuda. Rates: v3 (this
# tree) against v2 (b933bed), alternating, as call 3 (v3 with the test inside the tile loop:
# portable 246.6 against v2's 253.2).
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest"; }
cfg . build-gpu >"$OUT/cfg3.log" 2>&1 && cmake --build build-gpu -j16 --target bench_int8_kernels test_attention_int8_cuda \
  test_exec_streaming_cuda >"$OUT/build3.log" 2>&1
cfg v2src build-v2 >"$OUT/cfg2.log" 2>&1 && cmake --build build-v2 -j16 --target bench_int8_kernels >"$OUT/build2.log" 2>&1
rc=$?; echo "builds rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT"/build*.log | head; exit 1; }
TI=$(find build-gpu -name test_attention_int8_cuda -type f | head -1)
TS=$(find build-gpu -name test_exec_streaming_cuda -type f | head -1)
timeout 200 "$TI" >"$OUT/test_int8.log" 2>&1; trc=$?
echo "test_attention_int8_cuda rc $trc ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure|Which is|differ" "$OUT/test_int8.log" | head -20
[ $trc -ne 0 ] && exit 1
timeout 200 "$TS" --gtest_filter='*Int8*' >"$OUT/test_streaming.log" 2>&1
echo "test_exec_streaming_cuda (Int8) rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/test_streaming.log" | head -20
for i in 1 2; do
  for v in v3:build-gpu v2:build-v2; do
    name=${v%%:*}; dir=${v#*:}
    timeout 100 "$dir"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --out "$OUT/bench_${name}_$i.json" \
      >"$OUT/bench_${name}_$i.log" 2>&1
    echo "$name round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|hopper_grid|portable) ' "$OUT/bench_${name}_$i.log" | awk '{printf "%s %s TOP/s; ", $1, $8}')"
  done
done
grep -E "differ" "$OUT"/bench_v3_1.log
echo "total $(( $(date +%s) - t0 )) s"
