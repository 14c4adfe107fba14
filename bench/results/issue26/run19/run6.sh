#!/usr/bin/env bash
# The working tree of this call was main + run19/staggered.patch.
# Session 21, device call 6 (carry [".deps"]): the portable int8 kernel as it would be committed (the
# working tree: two warp groups half a tile apart, one code sequence, the round barrier as the
# named barrier bar.sync 1, 256) against HEAD (expsrc = git archive HEAD, all warps in step)
# and against the same tree with the barrier written as barrier.sync 0 (m: calls 2-5's form,
# "2" there). Bytes: the new build's CUDA int8 and streaming tests, the bench's Hopper vs
# portable comparison. Rates at S = 111,274, two rounds; then b and n under the 100 KB
# carveout (run18/carveout_hook.py on the device copies only).
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=bench/results/issue26/run18
rm -rf /tmp/new /tmp/m && mkdir /tmp/new && tar --exclude='./build*' --exclude=./expsrc --exclude=./.git --exclude=./bench/results -cf - . | tar -xf - -C /tmp/new
cp -r /tmp/new /tmp/m
sed -i 's|asm volatile("bar.sync 1, %0;\\n" ::"n"(kWarps \* 32) : "memory");|asm volatile("barrier.sync 0;\\n" ::: "memory");|' /tmp/m/src/backend/cuda/attention_int8.cu
grep -c 'barrier.sync 0' /tmp/m/src/backend/cuda/attention_int8.cu
python3 $R/carveout_hook.py /tmp/new && python3 $R/carveout_hook.py expsrc || exit 1
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-b && cmake --build build-b -j5 --target bench_int8_kernels >/tmp/buildb.log 2>&1 ) &
pb=$!
( cfg /tmp/m build-m && cmake --build build-m -j5 --target bench_int8_kernels >/tmp/buildm.log 2>&1 ) &
pm=$!
cfg /tmp/new build-n && cmake --build build-n -j8 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels >/tmp/build.log 2>&1
rc=$?; wait $pb; rcb=$?; wait $pm; rcm=$?; echo "build rc $rc / base $rcb / m $rcm after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] && { grep -E "error" /tmp/build.log | head; cp /tmp/build.log $OUT/; exit 1; }
for t in test_attention_int8_cuda test_exec_streaming_cuda; do
  timeout 150 $(find build-n -name $t -type f | head -1) >/tmp/$t.log 2>&1
  echo "$t rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" /tmp/$t.log | head -8
done
cp /tmp/test_attention_int8_cuda.log "$OUT/" 2>/dev/null
run() {  # build, carveout, tag
  [ $(( $(date +%s) - t0 )) -gt 300 ] && return
  if [ $2 = none ]; then unset LS_EXP_CARVEOUT; else export LS_EXP_CARVEOUT=$2; fi
  timeout 60 build-$1/bench/bench_int8_kernels --s 111274 --reps 2 --no-bf16 --out /tmp/bench_$3.json >/tmp/bench_$3.log 2>&1
  echo "$1 carveout $2 ($3) rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|portable) ' /tmp/bench_$3.log | awk '{printf "%s %s TOP/s; ", $1, $8}')"
}
for i in 1 2; do for v in b n m; do run $v none $v$i; done; done
for v in b n; do run $v 43 ${v}c; done
unset LS_EXP_CARVEOUT
for v in n1 m1; do echo "$v: $(grep -E 'hopper vs portable' /tmp/bench_$v.log | cut -c1-100)"; done
cp /tmp/bench_n2.json "$OUT/bench_new.json" 2>/dev/null; cp /tmp/bench_b2.json "$OUT/bench_base.json" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
