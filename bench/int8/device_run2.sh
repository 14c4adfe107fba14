#!/usr/bin/env bash
# Issue 26, second GPU call (one H200), repository root, .deps carried: builds the int8 and
# the bf16 Hopper tests and the int8 benchmark; runs the int8 CUDA = CPU byte tests (both
# kernels, every code variant of the Hopper kernel), the bf16 Hopper kernel's tests
# (test_attention_hopper's parity and same-bytes cases, AttentionDefaultCuda: the CLI's
# recorded H3-width hash) after the shared pipeline header (hopper_pipeline.cuh),
# then the Hopper int8 kernel's code variants at S = 111,274 (bench_int8_kernels --variants).
set -uo pipefail
S=${S:-111274}
OUT=${OUT:-/tmp/out}
B=build-gpu
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda bench_int8_kernels test_attention_hopper \
  test_attention_default_cuda >"$OUT/build.log" 2>&1
rc=$?
echo "build rc $rc after $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; fi
fail=0
for t in "test_attention_int8_cuda" "test_attention_hopper --gtest_filter=*Parity*:*SameBytes*" "test_attention_default_cuda"; do
  set -- $t
  timeout 120 "$B"/tests/$1 ${2:-} >"$OUT/$1.log" 2>&1; r=$?
  [ $r -ne 0 ] && fail=1
  echo "$1 rc $r ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$1.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Which is|\[ info \]" "$OUT/$1.log" | head -12
done
"$B"/bench/bench_int8_kernels --s "$S" --reps 3 --variants --no-portable --no-bf16 \
  --out "$OUT/bench_int8_variants.json" >"$OUT/bench_int8_variants.log" 2>&1
echo "bench_int8_kernels --variants rc $? ($(( $(date +%s) - t0 )) s)"
cat "$OUT/bench_int8_variants.log"
echo "total $(( $(date +%s) - t0 )) s"
exit $fail
