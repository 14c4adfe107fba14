#!/usr/bin/env bash
# Session 18, device call 5 (carry [".deps"]): main = a505c8f + exp2e_nb of the per-row head moved
# into the p8 loop's basic block (the fold alone needs alpha, beta); expsrc = a505c8f as it is.
# main's CUDA int8 tests (bytes = the CPU reference), both rates alternating twice, then the H3
# block with int8 attention (expsrc's build: the landed kernel) beside PyTorch's default bf16
# block in the same call. At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cfg() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/dev/null 2>&1; }
( cfg expsrc build-b && cmake --build build-b -j8 --target bench_int8_kernels bench_cuda_block >/tmp/buildb.log 2>&1 ) &
pb=$!
cfg . build-m && cmake --build build-m -j8 --target bench_int8_kernels test_attention_int8_cuda >/tmp/build.log 2>&1
rc=$?; wait $pb; rcb=$?; echo "build rc $rc / base $rcb after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep error /tmp/build.log | head; exit 1; }
timeout 150 $(find build-m -name test_attention_int8_cuda -type f | head -1) >/tmp/t.log 2>&1
echo "main tests rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (FAILED|PASSED)' /tmp/t.log | tr '\n' ' ')"; grep -E "Failure|differ" /tmp/t.log | head -4
for i in 1 2; do for v in b m; do
  timeout 60 build-$v/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out /tmp/bench_$v$i.json >/tmp/bench_$v$i.log 2>&1
  echo "$v round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' /tmp/bench_$v$i.log | awk '{printf "%s %s TOP/s (best %s)", $1, $8, $11}')"
done; done
cp /tmp/bench_m2.json "$OUT/bench_m2.json"; cp /tmp/bench_b2.json "$OUT/bench_b2.json"
timeout 100 build-b/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >/tmp/block.log 2>&1
echo "block int8 (a505c8f) rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" /tmp/block.log
left=$(( 280 - ($(date +%s) - t0) )); [ $left -lt 60 ] && { echo "no time left for PyTorch's block"; exit 0; }
PYTHONUNBUFFERED=1 timeout $left python3 bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >/tmp/pt.log 2>&1
echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -3 /tmp/pt.log
echo "total $(( $(date +%s) - t0 )) s"
