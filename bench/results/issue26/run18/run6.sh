#!/usr/bin/env bash
# Session 20, device call 6 (carry [".deps"]): the portable int8 kernel at 8 warps per CTA (the
# working tree) against 4 (expsrc = git archive HEAD), each also under a 100 KB shared-memory
# carveout (cudaFuncAttributePreferredSharedMemoryCarveout 43 % of 228 KB), which emulates the
# RTX cards' 100 KB per SM: there one 82 KiB CTA of 4 warps fits per SM, or one 91 KiB CTA of 8.
# The carveout hook (run18/carveout_hook.py: an LS_EXP_CARVEOUT read at the launch) is applied to
# copies built here only, never to the repository. Bytes: the new build's CUDA int8 and
# streaming tests (hook unset). At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=bench/results/issue26/run18
rm -rf /tmp/new && mkdir /tmp/new && tar --exclude='./build*' --exclude=./expsrc --exclude=./.git --exclude=./bench/results -cf - . | tar -xf - -C /tmp/new
python3 $R/carveout_hook.py /tmp/new && python3 $R/carveout_hook.py expsrc || exit 1
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-b && cmake --build build-b -j6 --target bench_int8_kernels >/tmp/buildb.log 2>&1 ) &
pb=$!
cfg /tmp/new build-n && cmake --build build-n -j10 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels >/tmp/build.log 2>&1
rc=$?; wait $pb; rcb=$?; echo "build rc $rc / base $rcb after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] && { grep -E "error" /tmp/build.log | head; exit 1; }
for t in test_attention_int8_cuda test_exec_streaming_cuda; do
  timeout 150 $(find build-n -name $t -type f | head -1) >/tmp/$t.log 2>&1
  echo "$t rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" /tmp/$t.log | head -8
done
for i in 1 2; do for c in none 43; do for v in b n; do
  [ $(( $(date +%s) - t0 )) -gt 230 ] && continue
  if [ $c = none ]; then unset LS_EXP_CARVEOUT; else export LS_EXP_CARVEOUT=$c; fi
  timeout 60 build-$v/bench/bench_int8_kernels --s 111274 --reps 2 --no-bf16 --out /tmp/bench_$v$c$i.json >/tmp/bench_$v$c$i.log 2>&1
  echo "$v carveout $c round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_portable ' /tmp/bench_$v$c$i.log | awk '{printf "%s %s TOP/s", $1, $8}')"
done; done; done
unset LS_EXP_CARVEOUT
grep -E "differ" /tmp/bench_nnone1.log | cut -c1-140
echo "total $(( $(date +%s) - t0 )) s"
