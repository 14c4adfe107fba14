#!/usr/bin/env bash
# Session 12, device call 5 (cold machine; carry [".deps"]): where the 3G int8 forward's
# extra time goes. H3 at full width, 5 blocks (the per-block costs of the 50-block forward),
# S = 111,274, attention int8: --profile 1 (synchronises at phase boundaries: seconds per
# phase) at unlimited and 3G with the default 4,096-key chunks, and 3G with 8,192- and
# 16,384-key chunks (a memory knob: the hash must not move); then the same without --profile.
# (As run, the --kv-chunk runs planned 4,096-key chunks all the same: a total-budget plan takes
# only kv_tile from the caller. The flag is gone again; so are those runs from this script.)
# Last, if time is left, the H3 block int8 / default / PyTorch's (tools/device/int8_attention.sh's BLOCK part).
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_budget bench_cuda_block >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep error "$OUT/build.log" | head; exit 1; }
BB="$B/bench/bench_budget --attention int8 --blocks 5 --frames 362 --width 1024 --height 1024 --text-tokens 500"
run() {  # name, args
  local n=$1; shift
  timeout 120 $BB "$@" --json "$OUT/$n.json" >"$OUT/$n.log" 2>&1
  echo "== $n ($*) rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "\] forward|\]   attention|\]   mlp|\] budget" "$OUT/$n.log" | sed 's/; LayerStream device peak.*hash/ hash/' | cut -c1-330
}
run prof_c4096 --budgets unlimited,3G --profile 1
run time_c --budgets unlimited,3G
left=$(( 560 - ($(date +%s) - t0) ))
if [ $left -gt 150 ]; then
  LAYERSTREAM_ATTENTION=int8 timeout 100 "$B"/bench/bench_cuda_block --S 111274 --json "$OUT/block_int8.json" >"$OUT/block_int8.log" 2>&1
  echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_int8.log"
  timeout 100 "$B"/bench/bench_cuda_block --S 111274 --json "$OUT/block_default.json" >"$OUT/block_default.log" 2>&1
  echo "block default rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_default.log"
  left=$(( 580 - ($(date +%s) - t0) ))
  PYTHONUNBUFFERED=1 timeout $left python3 bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >"$OUT/pytorch_block.log" 2>&1
  echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -4 "$OUT/pytorch_block.log"
fi
echo "total $(( $(date +%s) - t0 )) s"
