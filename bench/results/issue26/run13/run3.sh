#!/usr/bin/env bash
# Session 15, device call 3 (carry [".deps"]; v2src/ = `git archive b933bed`, untracked, staged by
# the lead): the kernels' rates side by side, contract v2 (b933bed) against v3 (this tree),
# alternating v3, v2, v3, v2 in one call: does the rescale at block starts cost? (call 1: Hopper
# 587.5 TOP/s, portable 246.5; run 12 call 5, v2: 590.3, 253.3).
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest"; }
cfg . build-gpu >"$OUT/cfg3.log" 2>&1 && cmake --build build-gpu -j16 --target bench_int8_kernels >"$OUT/build3.log" 2>&1
cfg v2src build-v2 >"$OUT/cfg2.log" 2>&1 && cmake --build build-v2 -j16 --target bench_int8_kernels >"$OUT/build2.log" 2>&1
rc=$?; echo "builds rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT"/build*.log | head; exit 1; }
for i in 1 2; do
  for v in v3:build-gpu v2:build-v2; do
    name=${v%%:*}; dir=${v#*:}
    timeout 100 "$dir"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --out "$OUT/bench_${name}_$i.json" \
      >"$OUT/bench_${name}_$i.log" 2>&1
    echo "$name round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|hopper_grid|portable) ' "$OUT/bench_${name}_$i.log" | awk '{printf "%s %s TOP/s; ", $1, $8}')"
  done
done
echo "total $(( $(date +%s) - t0 )) s"
