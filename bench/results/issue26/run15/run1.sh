#!/usr/bin/env bash
# Session 17, device call 1 (carry [".deps"]): main at contract v4, unchanged. (1) ncu on the
# Hopper int8 kernel at S = 16,384 (pipes, scheduler, warp states, per-SASS source counters:
# where the consumers stall); (2) the H3 block at S = 111,274 with int8 attention beside
# PyTorch's default bf16 block, side by side (session 16 left PyTorch out); (3) the 50-block
# forward at unlimited and 8G (session 16 ran unlimited and 3G only). X = a variant tree (here
# expsrc: main + variants.patch; LS_H8_VARIANT = 1: the fold of block j - 1 inside block j's
# p8 loop, 2: no ping-pong barriers, 3: both, 5: 1 and one exp2e per row and block), optional: its CUDA int8 tests per variant (bytes
# = the CPU reference) and the variants' rates beside main's, alternating.
set -uo pipefail
OUT=${OUT:-/tmp/out}; D=${D:-.}; B=build-r15; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
left() { echo $(( 590 - ($(date +%s) - t0) )); }
cmake -S "$D" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cfgx() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest"; }
if [ -n "${X:-}" ]; then
  ( cfgx "$X" build-x >"$OUT/cfgx.log" 2>&1 && cmake --build build-x -j8 --target bench_int8_kernels test_attention_int8_cuda >"$OUT/buildx.log" 2>&1 ) &
  px=$!
fi
cmake --build "$B" -j16 --target bench_int8_kernels bench_cuda_block bench_budget >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
if [ -n "${X:-}" ]; then
  wait $px; echo "build x rc $? ($(( $(date +%s) - t0 )) s)"
  TX=$(find build-x -name test_attention_int8_cuda -type f | head -1)
  for xv in 1 2 3 5; do
    LS_H8_VARIANT=$xv timeout 120 "$TX" >"$OUT/test_int8_x$xv.log" 2>&1; echo "x$xv: test_attention_int8_cuda rc $? ($(( $(date +%s) - t0 )) s)"
    grep -E "^\[  (FAILED|PASSED)|Failure|differ" "$OUT/test_int8_x$xv.log" | head -8
  done
  for i in 1 2; do
    for v in r15 x1 x2 x3 x5; do
      if [ $v = r15 ]; then bin=build-r15/bench/bench_int8_kernels; xv=0; extra=""; else bin=build-x/bench/bench_int8_kernels; xv=${v#x}; extra=--no-portable; fi
      LS_H8_VARIANT=$xv timeout 60 $bin --s 111274 --reps 3 --no-bf16 $extra --out "$OUT/bench_${v}_$i.json" >"$OUT/bench_${v}_$i.log" 2>&1
      echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|portable) ' "$OUT/bench_${v}_$i.log" | awk '{printf "%s %s TOP/s; ", $1, $8}')"
    done
  done
  grep -E "differ" "$OUT/bench_x1_1.log" "$OUT/bench_x3_1.log"
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
if [ -n "$NCU" ]; then
  timeout 150 "$NCU" -k regex:int8_attention_kernel -c 1 --import-source no \
    --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section SourceCounters \
    --section InstructionStats --section SpeedOfLight \
    --metrics smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_uniform.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active,smsp__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active \
    -o "$OUT/prof" "$B"/bench/bench_int8_kernels --s 16384 --reps 1 --no-bf16 --no-portable >"$OUT/ncu.log" 2>&1
  echo "ncu rc $? ($(( $(date +%s) - t0 )) s)"; tail -5 "$OUT/ncu.log"
  "$NCU" -i "$OUT/prof.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
  "$NCU" -i "$OUT/prof.ncu-rep" --page raw --csv >"$OUT/ncu_raw.csv" 2>&1
  "$NCU" -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_sass.csv" 2>&1
  ls -la "$OUT"/ncu_* ; grep -E "Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|pipe_.*pct" "$OUT/ncu_details.txt" | head
fi
timeout 100 "$B"/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >"$OUT/block_int8.log" 2>&1
echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_int8.log"
PYTHONUNBUFFERED=1 timeout 150 python3 "$D"/bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >"$OUT/pytorch_block.log" 2>&1
echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -3 "$OUT/pytorch_block.log"
[ "$(left)" -gt 200 ] && timeout $(( $(left) - 5 )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "${BUDGETS:-unlimited,8G}" --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
sed -n '/^budget |/,$p' "$OUT/budget_int8.log"
echo "total $(( $(date +%s) - t0 )) s"
