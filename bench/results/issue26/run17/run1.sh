#!/usr/bin/env bash
# Session 19, device call 2 (carry [".deps"]): X = expsrc (main + variants.patch, LS_H8_VARIANT
# picks the Hopper int8 kernel's fast-path variant in that experiment build only): 0 = main's
# code; 1/2/3 = the first 32/64/16 accumulators' fold FFMAs (block j - 1's) in the per-row head
# of block j instead of the p8 loop; 4 = float(d) of all 64 scores in place in the head (sc
# holds its bits after the max) instead of inside the p8 loop; 5 = 4 + 1. All the same bytes
# by construction (the same operations per value, moved between basic blocks): the CUDA int8
# tests (bytes = the CPU reference) per variant, then rates at S = 111,274 alternating, two rounds.
# VARS picks the variants timed, TVARS those tested (default: VARS); run2.sh runs this script.
# Stage: rm -rf expsrc && mkdir expsrc && git archive HEAD | tar -x -C expsrc &&
# (cd expsrc && git apply ../bench/results/issue26/run17/variants.patch)
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
cmake -S expsrc -B build-x -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/tmp/cfgx.log 2>&1
cmake --build build-x -j16 --target bench_int8_kernels test_attention_int8_cuda >/tmp/buildx.log 2>&1
rc=$?; echo "build x rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" /tmp/buildx.log | head -30; exit 1; }
TX=$(find build-x -name test_attention_int8_cuda -type f | head -1)
for xv in ${TVARS:-${VARS:-1 2 3 4 5}}; do
  LS_H8_VARIANT=$xv timeout 150 "$TX" >/tmp/test_x$xv.log 2>&1
  echo "x$xv tests rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/test_x$xv.log | tr '\n' ' ')"
  grep -E "Failure|differ" /tmp/test_x$xv.log | head -4
done
for i in 1 2; do
  for xv in 0 ${VARS:-1 2 3 4 5}; do
    LS_H8_VARIANT=$xv timeout 60 build-x/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out /tmp/bench_x${xv}_$i.json >/tmp/bench_x${xv}_$i.log 2>&1
    echo "x$xv round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' /tmp/bench_x${xv}_$i.log | awk '{printf "%s %s TOP/s (best %s)", $1, $8, $11}') $(grep -h 'persistent vs grid' /tmp/bench_x${xv}_$i.log)"
  done
done
cp /tmp/bench_x0_2.json "$OUT/"; for xv in ${VARS:-1 2 3 4 5}; do cp /tmp/bench_x${xv}_2.json "$OUT/"; done
echo "total $(( $(date +%s) - t0 )) s"
