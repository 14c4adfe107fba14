#!/usr/bin/env bash
# The working tree of this call was main + run19/variants.patch (calls 3-5 share it).
# Session 21, device call 3 (carry [".deps"]): the portable int8 kernel with its two warp
# groups half a tile apart (the working tree: group A Q.K, softmax, P.V per tile after each
# barrier, group B the previous tile's softmax and P.V, then Q.K; V^T in three stages) against
# HEAD (expsrc = git archive HEAD: all 8 warps in step), each also under a 100 KB
# shared-memory carveout (run18/carveout_hook.py, copies on the device only) emulating the RTX
# cards. Bytes: the new build's CUDA int8 and streaming tests (hook unset); the bench's
# Hopper vs portable comparison. Call 3: variants of the new build, chosen at the launch by
# LS_EXP_VAR (the fast grouped kernel only; EXPERIMENT code in the tree): 0 the fold loop
# nested in a loop over statistics blocks (rho outside the tile loop), 1 the same with the
# aligned bar.sync (only in step: LS_EXP_NOSTAGGER), 2 call 2's loop (rho tested per tile);
# "ns" = not staggered. Carveout none only (call 2: the same rates under it at 8 warps).
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=bench/results/issue26/run18
rm -rf /tmp/new && mkdir /tmp/new && tar --exclude='./build*' --exclude=./expsrc --exclude=./.git --exclude=./bench/results -cf - . | tar -xf - -C /tmp/new
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-b && cmake --build build-b -j6 --target bench_int8_kernels >/tmp/buildb.log 2>&1 ) &
pb=$!
cfg /tmp/new build-n && cmake --build build-n -j10 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels >/tmp/build.log 2>&1
rc=$?; wait $pb; rcb=$?; echo "build rc $rc / base $rcb after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] && { grep -E "error" /tmp/build.log | head; cp /tmp/build.log $OUT/; exit 1; }
for t in test_attention_int8_cuda test_exec_streaming_cuda; do
  timeout 150 $(find build-n -name $t -type f | head -1) >/tmp/$t.log 2>&1
  echo "$t rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" /tmp/$t.log | head -8
done
cp /tmp/test_attention_int8_cuda.log "$OUT/" 2>/dev/null
for i in 1 2; do for v in b 0 0ns 1ns 2; do
  [ $(( $(date +%s) - t0 )) -gt 480 ] && continue
  bd=n; [ $v = b ] && bd=b
  export LS_EXP_VAR=${v%ns}; [ $v = b ] && unset LS_EXP_VAR
  case $v in *ns) export LS_EXP_NOSTAGGER=1;; *) unset LS_EXP_NOSTAGGER;; esac
  timeout 60 build-$bd/bench/bench_int8_kernels --s 111274 --reps 2 --no-bf16 --out /tmp/bench_$v$i.json >/tmp/bench_$v$i.log 2>&1
  echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|portable) ' /tmp/bench_$v$i.log | awk '{printf "%s %s TOP/s; ", $1, $8}')"
done; done
unset LS_EXP_CARVEOUT
for v in 0 0ns 2; do echo "$v: $(grep -E "hopper vs portable" /tmp/bench_${v}1.log | cut -c1-100)"; done
cp /tmp/bench_02.json "$OUT/bench_new.json" 2>/dev/null; cp /tmp/bench_b2.json "$OUT/bench_base.json" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
