#!/usr/bin/env bash
# For the next device session (carry [".deps"]; ~150 s): producer_suspend.patch measured. Stage
# first (here): rm -rf expsrc && mkdir expsrc && git archive HEAD | tar -x -C expsrc &&
# (cd expsrc && git apply ../bench/results/issue26/run16/producer_suspend.patch). Then this
# script: builds main and expsrc side by side, the patched tree's int8 CUDA tests (bytes = the
# CPU reference) and streaming tests, and both Hopper int8 rates at S = 111,274, alternating
# twice. At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -d expsrc ] || { echo "stage expsrc first (see the header)"; exit 2; }
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-x && cmake --build build-x -j8 --target bench_int8_kernels test_attention_int8_cuda test_exec_streaming_cuda >/tmp/buildx.log 2>&1 ) &
px=$!
cfg . build-m && cmake --build build-m -j8 --target bench_int8_kernels >/tmp/build.log 2>&1
rc=$?; wait $px; rcx=$?; echo "build main rc $rc, patched rc $rcx after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] || [ $rcx -ne 0 ] && { grep -h error /tmp/build.log /tmp/buildx.log | head; exit 1; }
for t in test_attention_int8_cuda test_exec_streaming_cuda; do
  timeout 150 $(find build-x -name $t -type f | head -1) >/tmp/$t.log 2>&1
  echo "patched $t rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/$t.log | tr '\n' ' ')"
done
for i in 1 2; do for v in m x; do
  timeout 60 build-$v/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out /tmp/bench_$v$i.json >/tmp/bench_$v$i.log 2>&1
  echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' /tmp/bench_$v$i.log | awk '{printf "%s %s TOP/s (best %s)", $1, $8, $11}') $(grep -h 'persistent vs grid' /tmp/bench_$v$i.log)"
done; done
cp /tmp/bench_m2.json /tmp/bench_x2.json "$OUT/"
echo "total $(( $(date +%s) - t0 )) s"
