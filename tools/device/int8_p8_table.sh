#!/usr/bin/env bash
# The P8 threshold table of attention int8 (docs/int8-attention.md §4.3): scans every fp32
# pattern with the GPU's ex2.approx.ftz.f32 (tools/device/int8_p8_table.cu), checks the
# step function is monotone, prints the 255 thresholds. Needs nvcc and one GPU; no carry
# (it uses the kernels' own fast byte, src/backend/cuda/int8_p8_check.cuh).
# Usage (device): tools/device/int8_p8_table.sh   (logs and the table under $OUT)
set -euo pipefail
OUT=${OUT:-/tmp/p8table}; mkdir -p "$OUT"
nvcc -O2 -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I src -o "$OUT/int8_p8_table" tools/device/int8_p8_table.cu
"$OUT/int8_p8_table" > "$OUT/p8_table.txt"
tail -1 "$OUT/p8_table.txt"
