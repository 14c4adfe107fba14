#!/usr/bin/env bash
# Session 14, device call 3 (carry [".deps"]): the quantiser and the output division without
# IEEE division's slow-path branch (i8a::recip_d / div_rd / quant_rd: an fp64 reciprocal and
# one multiply, the same bits; int8_quant_warp.cuh), which call 2's trace found to cost ~10 us
# per (query tile, head) item in the Hopper kernel's prologue. Bytes: test_attention_int8_cuda
# (CUDA = CPU, both kernels, both launches, both p8 paths), the whole CUDA streaming test, the
# 50-block hash (c6617ec49d3afcda in runs 11 and 12). Speed: both kernels full S and chunked
# at 8,023 rows; 50 blocks unlimited and 3G; the H3 block int8 / default / PyTorch if time is left.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
left() { echo $(( 585 - ($(date +%s) - t0) )); }
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels bench_budget \
  bench_cuda_block >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
timeout 150 "$TI" >"$OUT/test_int8.log" 2>&1; trc=$?
echo "test_attention_int8_cuda rc $trc ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure|Which is|differ" "$OUT/test_int8.log" | head -20
[ $trc -ne 0 ] && exit 1
timeout 200 "$TS" >"$OUT/test_streaming.log" 2>&1
echo "test_exec_streaming_cuda (all) rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/test_streaming.log" | head -20
timeout 150 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --chunked 8023 \
  --out "$OUT/bench_chunked.json" >"$OUT/bench_chunked.log" 2>&1
echo "bench_int8_kernels rc $? ($(( $(date +%s) - t0 )) s)"; grep -v "^\s*$" "$OUT/bench_chunked.log" | grep -v "^\[" | tail -22
timeout $(( $(left) - 90 )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets "${BUDGETS:-unlimited,3G}" --json "$OUT/budget_int8.json" >"$OUT/budget_int8.log" 2>&1
echo "budget int8 rc $? ($(( $(date +%s) - t0 )) s)"
sed -n '/^budget |/,$p' "$OUT/budget_int8.log"
timeout $(( $(left) - 5 )) "$B"/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >"$OUT/block_int8.log" 2>&1
echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_int8.log"
timeout $(( $(left) - 5 )) "$B"/bench/bench_cuda_block --S 111274 --json "$OUT/block_default.json" >"$OUT/block_default.log" 2>&1
echo "block default rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_default.log"
PYTHONUNBUFFERED=1 timeout $(( $(left) - 2 )) python3 bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >"$OUT/pytorch_block.log" 2>&1
echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -4 "$OUT/pytorch_block.log"
echo "total $(( $(date +%s) - t0 )) s"
