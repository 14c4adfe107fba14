#!/usr/bin/env bash
# Session 20, device call 5 (carry [".deps"]): the portable int8 kernel skipping fl32(acc * alpha)
# where every alpha of the warp is 1 (as the Hopper kernel) on top of call 4's ldmatrix and
# PRMT packing (the working tree), against HEAD (expsrc = git archive HEAD = call 4's kernel).
# Bytes: test_attention_int8_cuda (CUDA = CPU reference, both kernels, both p8 paths, grouped
# and per-key tiles, masked tiles) and test_exec_streaming_cuda of the new build; then
# bench_int8_kernels of both builds alternating twice (portable and Hopper rates; the new
# build's outputs Hopper vs portable compared). At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-b && cmake --build build-b -j6 --target bench_int8_kernels >/tmp/buildb.log 2>&1 ) &
pb=$!
cfg . build-n && cmake --build build-n -j10 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels >/tmp/build.log 2>&1
rc=$?; wait $pb; rcb=$?; echo "build rc $rc / base $rcb after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] && { grep -E "error" /tmp/build.log | head; exit 1; }
for t in test_attention_int8_cuda test_exec_streaming_cuda; do
  timeout 150 $(find build-n -name $t -type f | head -1) >/tmp/$t.log 2>&1
  echo "$t rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]|p8 check" /tmp/$t.log | head -8
done
cp /tmp/test_attention_int8_cuda.log "$OUT/" 2>/dev/null
for i in 1 2; do for v in b n; do
  [ -x build-$v/bench/bench_int8_kernels ] || continue
  timeout 90 build-$v/bench/bench_int8_kernels --s 111274 --reps 2 --no-bf16 --out /tmp/bench_$v$i.json >/tmp/bench_$v$i.log 2>&1
  echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|portable) ' /tmp/bench_$v$i.log | awk '{printf "%s %s TOP/s; ", $1, $8}')"
done; done
grep -E "differ" /tmp/bench_n2.log | cut -c1-140
cp /tmp/bench_n2.json "$OUT/bench_new.json" 2>/dev/null; cp /tmp/bench_b2.json "$OUT/bench_base.json" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
