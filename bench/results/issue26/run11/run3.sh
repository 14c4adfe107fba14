#!/usr/bin/env bash
# Session 13, device call 3 (cold; carry [".deps"]): the shared warp quantiser
# (int8_quant_warp.cuh, duplicate D5: the Hopper kernel's prologue reordered, main loop
# identical SASS) must keep the CPU's bytes; both kernels at full S and chunked; where the 3G
# forward's remaining extra time goes (H3 full width, 5 blocks, --profile 1: phases synchronised);
# with BLOCK=1 the H3 block, int8 and default, beside PyTorch's default bf16 block, in one run. The
# whole CUDA streaming test: the offload paths' first-slice Q / out-projection now go through
# walk_q / walk_out (phase_attention.cpp), bf16 and int8.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
targets="test_attention_int8_cuda test_exec_streaming_cuda bench_int8_kernels bench_budget"; [ "${BLOCK:-0}" = 1 ] && targets="$targets bench_cuda_block"
cmake --build "$B" -j16 --target $targets >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
TS=$(find "$B" -name test_exec_streaming_cuda -type f | head -1)
timeout 120 "$TI" >"$OUT/test_int8.log" 2>&1; trc=$?
echo "test_attention_int8_cuda rc $trc ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure|Which is" "$OUT/test_int8.log" | head -20
[ $trc -ne 0 ] && exit 1
timeout 150 "$TS" >"$OUT/test_streaming.log" 2>&1
echo "test_exec_streaming_cuda (all 5: bf16 and int8 offload, walk_q / walk_out) rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED)|Failure" "$OUT/test_streaming.log" | head -20
timeout 120 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --chunked 8023 \
  --out "$OUT/bench_chunked.json" >"$OUT/bench_chunked.log" 2>&1
echo "bench_int8_kernels rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^int8_|chunked hopper|vs portable" "$OUT/bench_chunked.log"
timeout 150 "$B"/bench/bench_budget --attention int8 --blocks 5 --frames 362 --width 1024 --height 1024 --text-tokens 500 \
  --budgets unlimited,3G --profile 1 --json "$OUT/prof5.json" >"$OUT/prof5.log" 2>&1
echo "== 5 blocks --profile 1 rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "\] forward|\]   |\] budget" "$OUT/prof5.log" | sed 's/; LayerStream device peak.*hash/ hash/' | cut -c1-330
if [ "${BLOCK:-0}" = 1 ]; then  # (left out as run: device time was short after two refused starts)
  timeout 100 "$B"/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >"$OUT/block_int8.log" 2>&1
  echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_int8.log"
  timeout 100 "$B"/bench/bench_cuda_block --S 111274 --json "$OUT/block_default.json" >"$OUT/block_default.log" 2>&1
  echo "block default rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_default.log"
  left=$(( 585 - ($(date +%s) - t0) ))
  PYTHONUNBUFFERED=1 timeout $left python3 bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >"$OUT/pytorch_block.log" 2>&1
  echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -4 "$OUT/pytorch_block.log"
fi
echo "total $(( $(date +%s) - t0 )) s"
