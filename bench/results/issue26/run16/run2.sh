#!/usr/bin/env bash
# Session 18, device call 2 (carry [".deps"]): X = expsrc (main + variants, LS_H8_VARIANT picks
# the Hopper int8 kernel's fast-path variant in that experiment build only): 0 = main's code,
# 1 = exp2e without its branch (i8a::exp2e_nb, the same bits: every fp32 t in [-130, -0] on the
# CPU), 2 = P packed (PRMT, dp4a) at the end of the p8 loop instead of before the next issue,
# 3 = 1 + 2. Per variant the CUDA int8 tests (bytes = the CPU reference), then rates at
# S = 111,274 alternating, two rounds; ncu source counters of variant 3 summarised to text.
# Writes at most 8 files to $OUT (the run tool returns 8).
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
cmake -S expsrc -B build-x -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/tmp/cfgx.log 2>&1
cmake --build build-x -j16 --target bench_int8_kernels test_attention_int8_cuda >/tmp/buildx.log 2>&1
rc=$?; echo "build x rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" /tmp/buildx.log | head -30; exit 1; }
TX=$(find build-x -name test_attention_int8_cuda -type f | head -1)
for xv in 1 2 3; do
  LS_H8_VARIANT=$xv timeout 150 "$TX" >/tmp/test_x$xv.log 2>&1
  echo "x$xv tests rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/test_x$xv.log | tr '\n' ' ')"
  grep -E "Failure|differ" /tmp/test_x$xv.log | head -4
done
for i in 1 2; do
  for xv in 0 1 2 3; do
    LS_H8_VARIANT=$xv timeout 60 build-x/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out /tmp/bench_x${xv}_$i.json >/tmp/bench_x${xv}_$i.log 2>&1
    echo "x$xv round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' /tmp/bench_x${xv}_$i.log | awk '{printf "%s %s TOP/s (best %s)", $1, $8, $11}') $(grep -h 'persistent vs grid' /tmp/bench_x${xv}_$i.log)"
  done
done
cp /tmp/bench_x3_2.json "$OUT/bench_x3_2.json"; cp /tmp/bench_x0_2.json "$OUT/bench_x0_2.json"
if [ "${NCU_X:-3}" != none ]; then
  timeout 200 ncu -k regex:int8_attention_kernel -c 1 --import-source no --section WarpStateStats --section SourceCounters \
    -o /tmp/profx env LS_H8_VARIANT=${NCU_X:-3} build-x/bench/bench_int8_kernels --s 16384 --reps 1 --no-bf16 --no-portable >/tmp/ncux.log 2>&1
  echo "ncu x${NCU_X:-3} rc $? ($(( $(date +%s) - t0 )) s)"
  ncu -i /tmp/profx.ncu-rep --page source --csv --print-source sass >/tmp/ncux_sass.csv 2>/dev/null
  gzip -c /tmp/ncux_sass.csv >"$OUT/ncux_sass.csv.gz"
  python3 bench/results/issue26/run16/stalls.py /tmp/ncux_sass.csv >"$OUT/stallsx.txt" 2>&1
  sed -n '/stall reasons/,/opcodes/p' "$OUT/stallsx.txt" | head -14
fi
echo "total $(( $(date +%s) - t0 )) s"
