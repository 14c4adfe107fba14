#!/usr/bin/env bash
# Session 18, device call 1 (carry [".deps"]): (1) ncu on main's Hopper int8 kernel at S = 16,384
# with the warp-state and per-SASS source counters, summarised on the device into text (the
# run tool returns at most 8 files); (2) X = expsrc (main + the portable kernel's one-exp2e patch
# + LS_H8_VARIANT=1: Q K^T of block j issued before P V of block j - 1, the softmax head under
# P V): its CUDA int8 tests (bytes = the CPU reference, both kernels) and rates beside main's,
# alternating, S = 111,274.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest"; }
( cfg expsrc build-x >"$OUT/cfgx.log" 2>&1 && cmake --build build-x -j8 --target bench_int8_kernels test_attention_int8_cuda >"$OUT/buildx.log" 2>&1 ) &
px=$!
cfg . build-m >"$OUT/cfg.log" 2>&1 && cmake --build build-m -j8 --target bench_int8_kernels >"$OUT/build.log" 2>&1
rc=$?; echo "build main rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; }
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
if [ -n "$NCU" ] && [ $rc -eq 0 ]; then
  timeout 200 "$NCU" -k regex:int8_attention_kernel -c 1 --import-source no \
    --section WarpStateStats --section SourceCounters --section SchedulerStats \
    -o /tmp/prof build-m/bench/bench_int8_kernels --s 16384 --reps 1 --no-bf16 --no-portable >"$OUT/ncu.log" 2>&1
  echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -3 "$OUT/ncu.log"
  "$NCU" -i /tmp/prof.ncu-rep --page details >"$OUT/ncu_details.txt" 2>&1
  "$NCU" -i /tmp/prof.ncu-rep --page source --csv --print-source sass >/tmp/ncu_sass.csv 2>"$OUT/ncu_src.err"
  gzip -c /tmp/ncu_sass.csv >"$OUT/ncu_sass.csv.gz"
  python3 bench/results/issue26/run16/stalls.py /tmp/ncu_sass.csv >"$OUT/stalls.txt" 2>&1
  echo "stalls.py rc $?"; head -40 "$OUT/stalls.txt"
  grep -E "Issue Slots|Eligible|Cycles Per Issued|Stall|stall" "$OUT/ncu_details.txt" | head -30
fi
wait $px; echo "build x rc $? ($(( $(date +%s) - t0 )) s)"
LS_H8_VARIANT=1 timeout 150 build-x/tests/test_attention_int8_cuda >"$OUT/test_x1.log" 2>&1 || \
  LS_H8_VARIANT=1 timeout 150 $(find build-x -name test_attention_int8_cuda -type f | head -1) >"$OUT/test_x1.log" 2>&1
echo "x1 tests rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^\[  (FAILED|PASSED)|Failure|differ" "$OUT/test_x1.log" | head -8
for i in 1 2; do
  for v in m x0 x1; do
    if [ $v = m ]; then bin=build-m/bench/bench_int8_kernels; xv=0; else bin=build-x/bench/bench_int8_kernels; xv=${v#x}; fi
    LS_H8_VARIANT=$xv timeout 60 $bin --s 111274 --reps 3 --no-bf16 --out "$OUT/bench_${v}_$i.json" >/tmp/bench_${v}_$i.log 2>&1
    echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|portable) ' /tmp/bench_${v}_$i.log | awk '{printf "%s %s TOP/s; ", $1, $8}') $(grep -c differ /tmp/bench_${v}_$i.log) differ-lines"
  done
done
grep -h differ /tmp/bench_x1_1.log /tmp/bench_m_1.log | head -4
echo "total $(( $(date +%s) - t0 )) s"
