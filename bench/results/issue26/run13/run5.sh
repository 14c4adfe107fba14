#!/usr/bin/env bash
# Session 15, device call 5 (carry [".deps"]): the H3 block at S = 111,274 with contract v3 (the
# one-call int8 path over 28 statistics blocks: the rescale 27 times a row), beside the default
# bf16 block and PyTorch's, for the block target (<= 0.60x PyTorch; run 12 call 3, v2:
# int8 767.2 ms, default 712.8, PyTorch 792.1 -> 0.97x).
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
left() { echo $(( 400 - ($(date +%s) - t0) )); }
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_cuda_block >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
timeout $(( $(left) - 5 )) "$B"/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >"$OUT/block_int8.log" 2>&1
echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_int8.log"
timeout $(( $(left) - 5 )) "$B"/bench/bench_cuda_block --S 111274 --json "$OUT/block_default.json" >"$OUT/block_default.log" 2>&1
echo "block default rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_default.log"
PYTHONUNBUFFERED=1 timeout $(( $(left) - 2 )) python3 bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >"$OUT/pytorch_block.log" 2>&1
echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -4 "$OUT/pytorch_block.log"
echo "total $(( $(date +%s) - t0 )) s"
