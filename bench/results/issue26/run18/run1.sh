#!/usr/bin/env bash
# Session 20, device call 1 (carry [".deps"]). expsrc = main + run18/f16_rate.patch (rate only:
# p8 by fp16 pairs, cvt.rn.f16x2.f32 + ex2.approx.f16x2 + one HFMA2 per two keys, one PRMT
# per P word; NOT the contract's bytes, no tests run on it).
# 1. f16_ex2_probe.cu: ex2.approx.f16x2 on all 65,536 fp16 inputs against the correctly
#    rounded 2^h, the p8 byte of the HFMA2 trick, and the SASS (one MUFU per pair or two?).
# 2. main's CUDA int8 tests (the p8 check now covers x up to kP8Top: session 20's kTopBits fix);
#    main's and expsrc's Hopper int8 rate alternating twice (S = 111,274, 56 x 128).
# 3. main's H3 block with int8 attention beside PyTorch's default bf16 block.
# At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
R=bench/results/issue26/run18
nvcc -arch=sm_90a -O3 -o /tmp/probe $R/f16_ex2_probe.cu && TABLE=$OUT/f16_p8_table.txt /tmp/probe
cuobjdump -sass /tmp/probe | grep -E 'MUFU|HFMA2|F2FP' | sed 's/^ *//' | head -8
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-x && cmake --build build-x -j8 --target bench_int8_kernels >/tmp/buildx.log 2>&1 ) &
px=$!
cfg . build-m && cmake --build build-m -j8 --target bench_int8_kernels bench_cuda_block test_attention_int8_cuda >/tmp/build.log 2>&1
rc=$?; wait $px; rcx=$?; echo "build rc $rc / f16 $rcx after $(( $(date +%s) - t0 )) s"
[ $rc -ne 0 ] && { grep error /tmp/build.log | head; exit 1; }
[ $rcx -ne 0 ] && grep error /tmp/buildx.log | head
cuobjdump -sass $(find build-x -name 'attention_hopper_int8.cu.o' | head -1) 2>/dev/null | grep -cE 'MUFU.EX2' | sed 's/^/expsrc MUFU.EX2 lines: /'
cuobjdump -sass $(find build-m -name 'attention_hopper_int8.cu.o' | head -1) 2>/dev/null | grep -cE 'MUFU.EX2' | sed 's/^/main MUFU.EX2 lines: /'
timeout 150 $(find build-m -name test_attention_int8_cuda -type f | head -1) >/tmp/t.log 2>&1
echo "main tests rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/t.log | tr '\n' ' ')"; grep -E "Failure|differ|p8 check|patterns" /tmp/t.log | head -6
for i in 1 2; do for v in m x; do
  [ -x build-$v/bench/bench_int8_kernels ] || continue
  timeout 60 build-$v/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out /tmp/bench_$v$i.json >/tmp/bench_$v$i.log 2>&1
  echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' /tmp/bench_$v$i.log | awk '{printf "%s %s TOP/s (best %s)", $1, $8, $11}')"
done; done
cp /tmp/bench_m2.json "$OUT/bench_m2.json" 2>/dev/null; cp /tmp/bench_x2.json "$OUT/bench_x2.json" 2>/dev/null
timeout 100 build-m/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >/tmp/block.log 2>&1
echo "block int8 (main) rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" /tmp/block.log
left=$(( 420 - ($(date +%s) - t0) )); [ $left -lt 60 ] && { echo "no time left for PyTorch's block"; exit 0; }
PYTHONUNBUFFERED=1 timeout $left python3 bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >/tmp/pt.log 2>&1
echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -3 /tmp/pt.log
echo "total $(( $(date +%s) - t0 )) s"
