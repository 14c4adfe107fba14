#!/usr/bin/env bash
# One H3 block at real width, LayerStream against PyTorch on the same weights and inputs,
# both measured against a float64 reference (DESIGN.md §4: error at most 2x PyTorch's).
# One GPU (kind nvidia-h200); bench_cuda_block carried in build-bin (built with
# -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90), torch with CUDA on the machine.
#   1. bench_cuda_block --dump: times our block, then writes its weights, inputs and stock
#      output to $DUMP (0.77 GB + 2.4 GB at S = 111,274: kept out of $OUT, too big to
#      bring back; removed at the end).
#   2. bench/pytorch_block.py --from $DUMP: times PyTorch's block on them, then the error
#      of ours, PyTorch default and ComfyUI priority against fp64 at 2048 sampled rows.
# Usage (device): [S=111274] [ROWS=2048] [BENCH_ARGS="--op-times"] tools/device/block_vs_pytorch.sh
#   -> $OUT/cuda_block.{json,log}, $OUT/pytorch_block.{json,log}
# Exit status: 0 pass; 1 the error rule failed; 2 a program failed.
set -uo pipefail
OUT=${OUT:-/tmp/ls-compare-out}
S=${S:-111274}
ROWS=${ROWS:-2048}
DUMP=${DUMP:-/tmp/ls-block-dump}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
rm -rf "$DUMP"
timeout 280 build-bin/bench_cuda_block --S "$S" ${BENCH_ARGS:-} --dump "$DUMP" --json "$OUT/cuda_block.json" >"$OUT/cuda_block.log" 2>&1
rc=$?
cat "$OUT/cuda_block.log"
if [ $rc -ne 0 ]; then echo "bench_cuda_block rc $rc"; rm -rf "$DUMP"; exit 2; fi
timeout 300 python3 bench/pytorch_block.py --from "$DUMP" --S "$S" --sample-rows "$ROWS" \
  --json "$OUT/pytorch_block.json" >"$OUT/pytorch_block.log" 2>&1
rc=$?
cat "$OUT/pytorch_block.log"
rm -rf "$DUMP"
# rc 1 is both a failed rule and a Python error: the verdict line tells them apart.
if grep -q '(rule: <= 2): FAIL' "$OUT/pytorch_block.log"; then exit 1; fi
if [ $rc -ne 0 ] || ! grep -q '(rule: <= 2): PASS' "$OUT/pytorch_block.log"; then echo "pytorch_block.py rc $rc"; exit 2; fi
exit 0
