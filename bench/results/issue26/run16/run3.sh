#!/usr/bin/env bash
# Session 18, device call 3 (carry [".deps"]): main with the landed kernel changes (Hopper:
# exp2e_nb in the per-row head and P packed in the p8 loop's block; portable: one exp2e_nb per
# row; no change of bytes intended). Bytes: test_attention_int8_cuda (CUDA = CPU reference,
# both kernels, both p8 paths), test_exec_streaming_cuda; rates (Hopper, grid launch, portable,
# the table path); the H3 block with int8 attention; the 50-block forward unlimited (hash must
# stay 4c5a58341ace6dc7) and 3G when time is left. At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-r16; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
left() { echo $(( ${LIMIT:-590} - ($(date +%s) - t0) )); }
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/tmp/cfg.log 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda test_exec_streaming_cuda test_attention_int8 bench_int8_kernels bench_cuda_block bench_budget >/tmp/build.log 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; grep -c warning /tmp/build.log; [ $rc -ne 0 ] && { grep -E "error" /tmp/build.log | head -30; exit 1; }
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
timeout 150 "$TI" >/tmp/test_int8.log 2>&1; trc=$?
echo "test_attention_int8_cuda rc $trc ($(( $(date +%s) - t0 )) s)"; grep -E "^\[  (FAILED|PASSED)|Failure|differ" /tmp/test_int8.log | head -12
[ $trc -ne 0 ] && exit 1
timeout 100 "$TS" >/tmp/test_streaming.log 2>&1
echo "test_exec_streaming_cuda rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^\[  (FAILED|PASSED)|Failure" /tmp/test_streaming.log | head -8
timeout 90 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --table --out "$OUT/bench_int8.json" >/tmp/bench_int8.log 2>&1
echo "bench_int8_kernels rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^int8_|differ" /tmp/bench_int8.log | cut -c1-120
timeout 100 "$B"/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >/tmp/block_int8.log 2>&1
echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" /tmp/block_int8.log
BUD=unlimited; [ "$(left)" -gt 330 ] && BUD=unlimited,3G
timeout $(( $(left) - 5 )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "$BUD" --json "$OUT/budget_int8.json" >/tmp/budget_int8.log 2>&1
echo "budget int8 ($BUD) rc $? ($(( $(date +%s) - t0 )) s)"; sed -n '/^budget |/,$p' /tmp/budget_int8.log
echo "total $(( $(date +%s) - t0 )) s"
