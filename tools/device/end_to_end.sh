#!/usr/bin/env bash
# The lead's end-to-end device call: full CUDA build, every test (CPU, golden on CPU and
# CUDA, CUDA parity), then the engine's `forward` on the GPU at real H3 width (2 blocks,
# synthetic weights) under several plans, byte-compared with cmp, and the block
# benchmark with the alternative attention kernels. Logs under $OUT; table last.
# Usage (GPU machine, carry [".deps"]): tools/device/end_to_end.sh
set -uo pipefail
OUT=${OUT:-/tmp/ls-final}; mkdir -p "$OUT"
B=build-gpu; t0=$(date +%s)
tools/device/build.sh $B >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
ctest --test-dir $B -j8 --timeout 400 --output-on-failure >"$OUT/ctest.log" 2>&1
tail -25 "$OUT/ctest.log"
LS=$B/layerstream
# Real width (D 5376, 56 heads x 128, F 14336), 2 blocks; S = 64 + 2*37 + 7*32*32 = 7306.
common="--preset h3 --blocks 2 --frames 22 --width 1024 --height 1024 --text-tokens 64 --sigma 0.8 --seed 1 --device cuda"
run() { local name=$1; shift; /usr/bin/time -f "%e s wall" $LS forward $common "$@" -o "$OUT/f_$name.st" 2>&1 | tail -3 | sed "s/^/[$name] /"; }
run stock
run s8192 --attn-chunk 8192 --mlp-chunk 8192 --final-chunk 8192
run s4096 --attn-chunk 4096 --mlp-chunk 4096 --final-chunk 4096
run s97 --attn-chunk 97 --mlp-chunk 97 --final-chunk 97
run s1 --attn-chunk 1 --mlp-chunk 1 --final-chunk 1
run budget --budget 1G
for f in s8192 s4096 s97 s1 budget; do
  if cmp -s "$OUT/f_stock.st" "$OUT/f_$f.st"; then echo "plan $f: byte-identical to stock"; else echo "plan $f: DIFFERS from stock"; fi
done
rm -f "$OUT"/f_*.st
for v in 4x2; do
  LAYERSTREAM_ATTN_VARIANT=$v timeout 200 $B/bench/bench_cuda_block --S 32768,111274 --iters 2 --warmup 1 \
    --json "$OUT/bench_$v.json" 2>&1 | sed "s/^/[variant $v] /" | tail -4
done
LAYERSTREAM_ATTENTION=cudnn timeout 200 $B/bench/bench_cuda_block --S 32768,111274 --iters 2 --warmup 1 \
  --json "$OUT/bench_cudnn.json" 2>&1 | sed "s/^/[cudnn] /" | tail -4
grep -E "tests passed|tests failed" "$OUT/ctest.log"
echo "total: $(($(date +%s) - t0)) s"
