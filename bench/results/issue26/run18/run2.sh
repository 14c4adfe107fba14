#!/usr/bin/env bash
# Session 20, device call 2 (carry [".deps"]): contract v5 (p8 by fp16 pairs; branch v5, staged
# as v5src = its tree) against main. v5's CUDA int8 tests (CUDA = its CPU reference's bytes, both
# kernels, both p8 paths) and streaming tests; the p8 check's line; the Hopper rates of main and
# v5 alternating twice; v5's full kernel bench (Hopper persistent / grid / portable, outputs
# compared); v5's H3 block with int8 attention. At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg . build-m && cmake --build build-m -j6 --target bench_int8_kernels >/tmp/buildm.log 2>&1 ) &
pm=$!
cfg v5src build-v && cmake --build build-v -j10 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels bench_cuda_block >/tmp/build.log 2>&1
rc=$?; wait $pm; rcm=$?; echo "build v5 rc $rc / main $rcm after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] && { grep error /tmp/build.log | head; exit 1; }
for t in test_attention_int8_cuda test_exec_streaming_cuda; do
  timeout 150 $(find build-v -name $t -type f | head -1) >/tmp/$t.log 2>&1
  echo "v5 $t rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/$t.log | tr '\n' ' ')"
  grep -E "Failure|differ|p8 check|FAILED  \]" /tmp/$t.log | head -8
done
for i in 1 2; do for v in m v; do
  [ -x build-$v/bench/bench_int8_kernels ] || continue
  timeout 60 build-$v/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out /tmp/bench_$v$i.json >/tmp/bench_$v$i.log 2>&1
  echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' /tmp/bench_$v$i.log | awk '{printf "%s %s TOP/s (best %s)", $1, $8, $11}')"
done; done
cp /tmp/bench_m2.json "$OUT/bench_m2.json" 2>/dev/null; cp /tmp/bench_v2.json "$OUT/bench_v2.json" 2>/dev/null
timeout 60 build-v/bench/bench_int8_kernels --s 111274 --reps 2 --no-bf16 --out "$OUT/bench_v5_all.json" >/tmp/bench_all.log 2>&1
echo "v5 bench_int8_kernels (all) rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^int8_|differ" /tmp/bench_all.log | cut -c1-120
timeout 100 build-v/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8_v5.json" >/tmp/block.log 2>&1
echo "v5 block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" /tmp/block.log
echo "total $(( $(date +%s) - t0 )) s"
