#!/usr/bin/env bash
# Session 19, device call (carry [".deps"]): main's working tree = HEAD + the Q descriptors formed
# at every issue (no byte change intended) against expsrc = HEAD as it was (stage: rm -rf expsrc
# && mkdir expsrc && git archive HEAD | tar -x -C expsrc). Bytes: test_attention_int8_cuda (CUDA =
# CPU reference, both kernels, both p8 paths) and test_exec_streaming_cuda of the new build; the
# Hopper rates side by side, two rounds; then, only if the new kernel is faster by more than
# 0.5 %, the landing checks: bench_int8_kernels (grid launch, portable, 0 differ), the H3 block
# with int8 attention, the 50-block forward unlimited and 3G (hash must stay 4c5a58341ace6dc7);
# last, the new kernel's local-memory accesses (sass.sh). At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
left() { echo $(( ${LIMIT:-590} - ($(date +%s) - t0) )); }
[ -d expsrc ] || { echo "stage expsrc first (see the header)"; exit 2; }
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-o && cmake --build build-o -j6 --target bench_int8_kernels >/tmp/build_o.log 2>&1 ) &
po=$!
cfg . build-n && cmake --build build-n -j10 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels bench_cuda_block bench_budget >/tmp/build.log 2>&1
rc=$?; wait $po; rco=$?; echo "build new rc $rc ($(grep -c warning /tmp/build.log) warnings), old rc $rco after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] || [ $rco -ne 0 ] && { grep -h error /tmp/build.log /tmp/build_o.log | head; exit 1; }
for t in test_attention_int8_cuda test_exec_streaming_cuda; do
  timeout 150 $(find build-n -name $t -type f | head -1) >/tmp/$t.log 2>&1; trc=$?
  echo "new $t rc $trc ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/$t.log | tr '\n' ' ')"
  [ $trc -ne 0 ] && { grep -E "Failure|differ" /tmp/$t.log | head; exit 1; }
done
declare -A R
for i in 1 2; do for v in o n; do
  timeout 60 build-$v/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out /tmp/bench_$v$i.json >/tmp/bench_$v$i.log 2>&1
  r=$(grep -E '^int8_hopper ' /tmp/bench_$v$i.log | awk '{print $8}'); R[$v$i]=$r
  echo "$v round $i ($(( $(date +%s) - t0 )) s): int8_hopper $r TOP/s $(grep -h 'persistent vs grid' /tmp/bench_$v$i.log)"
done; done
cp /tmp/bench_o2.json /tmp/bench_n2.json "$OUT/"
win=$(python3 -c "print(int((${R[n1]}+${R[n2]}) > 1.005*(${R[o1]}+${R[o2]})))")
echo "new faster by more than 0.5 %: $win"
if [ "$win" = 1 ]; then
  B=build-n
  timeout 90 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --out "$OUT/bench_int8.json" >/tmp/bench_int8.log 2>&1
  echo "bench_int8_kernels rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^int8_|differ" /tmp/bench_int8.log | cut -c1-120
  timeout 100 "$B"/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >/tmp/block_int8.log 2>&1
  echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" /tmp/block_int8.log
  BUD=unlimited; [ "$(left)" -gt 240 ] && BUD=unlimited,3G
  timeout $(( $(left) - 20 )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
    --text-tokens 500 --budgets "$BUD" --json "$OUT/budget_int8.json" >/tmp/budget_int8.log 2>&1
  echo "budget int8 ($BUD) rc $? ($(( $(date +%s) - t0 )) s)"; sed -n '/^budget |/,$p' /tmp/budget_int8.log
fi
OUT=$OUT bash bench/results/issue26/run17/sass.sh 2>&1 | tail -2
echo "total $(( $(date +%s) - t0 )) s"
