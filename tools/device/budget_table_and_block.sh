#!/usr/bin/env bash
# Issue 15's two tables in one GPU call (binaries carried in build-bin: layerstream,
# bench_budget, bench_cuda_block from a Release CUDA build, see tools/device/build.sh): the 50-block
# budget table at S = 111,274 (one denoiser call per budget, the default numerics:
# attention hopper at head dim 128 on sm_90), then one block against PyTorch
# (tools/device/block_vs_pytorch.sh: ours <= 0.88x PyTorch's is the target).
# Each budget costs ~100 s on the H200 (engine with synthetic weights ~38 s, text + AdaLN
# tables + arenas ~27 s, the forward 36-44 s), the block compare ~60 s: four budgets fit
# one 600 s call (session 8's run with a 330 s limit stopped during 3G).
# Usage (device, repository root): [BUDGETS=unlimited,8G,4G,3G] OUT=... tools/device/budget_table_and_block.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/ls-issue15-out}; mkdir -p "$OUT"
T0=$SECONDS
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
timeout 460 build-bin/bench_budget --frames 362 --width 1024 --height 1024 --text-tokens 500 --budgets ${BUDGETS:-unlimited,8G,4G,3G} \
  --json $OUT/budget_s111k.json > $OUT/budget_s111k.log 2>&1; echo "bench_budget rc=$? ($((SECONDS-T0)) s)"
grep -vE "^forward:|ETA" $OUT/budget_s111k.log | tail -14 | cut -c1-400
OUT=$OUT timeout $((585 - (SECONDS-T0))) tools/device/block_vs_pytorch.sh > $OUT/block_compare.log 2>&1; echo "block compare rc=$? ($((SECONDS-T0)) s)"
grep -E "ms|ratio|error|PASS|FAIL|TFLOP" $OUT/block_compare.log | tail -20 | cut -c1-300
echo "total $((SECONDS-T0)) s"
