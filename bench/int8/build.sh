#!/usr/bin/env bash
# Builds bench/int8/hopper_int8_check (nvcc, sm_90a) into $1 (default .dev/hopper8-bin),
# linking the core library of build dir $CORE_BUILD (liblayerstream_core.a, a CPU build of
# this tree). With WITH_BF16=1 it also links the bf16 Hopper kernel (attention_hopper.cu)
# for the side-by-side timing. Where helper int8's src/backend/int8_attention_math.h is in
# the tree, configuration 7 (the contract's arithmetic) is built and checked too.
set -euo pipefail
OUTDIR=${1:-.dev/hopper8-bin}
mkdir -p "$OUTDIR"
NVCC=${NVCC:-nvcc}
FLAGS=(-std=c++20 -O3 --expt-relaxed-constexpr -fmad=false -gencode=arch=compute_90a,code=sm_90a
       -Isrc -Iinclude -Xcompiler=-Wall,-ffp-contract=off,-fopenmp)
"$NVCC" "${FLAGS[@]}" -DLAYERSTREAM_HOPPER_ATTENTION=1 -c src/backend/cuda/attention_hopper_int8.cu -o "$OUTDIR/int8.o"
if [[ "${WITH_BF16:-0}" == 1 ]]; then
  "$NVCC" "${FLAGS[@]}" -DLAYERSTREAM_HOPPER_ATTENTION=1 -c src/backend/cuda/attention_hopper.cu -o "$OUTDIR/bf16.o"
  "$NVCC" "${FLAGS[@]}" -DLAYERSTREAM_HOPPER_ATTENTION=1 -DHOPPER8_WITH_BF16=1 -c bench/int8/hopper_int8_check.cu \
    -o "$OUTDIR/check.o"
  "$NVCC" "${FLAGS[@]}" -DLAYERSTREAM_HOPPER_ATTENTION=1 -c bench/int8/bf16_glue.cu -o "$OUTDIR/glue.o"
  "$NVCC" -gencode=arch=compute_90a,code=sm_90a -Xcompiler=-fopenmp "$OUTDIR/check.o" "$OUTDIR/int8.o" \
    "$OUTDIR/bf16.o" "$OUTDIR/glue.o" "${CORE_BUILD:-build}/liblayerstream_core.a" -o "$OUTDIR/hopper_int8_check"
else
  "$NVCC" "${FLAGS[@]}" -DLAYERSTREAM_HOPPER_ATTENTION=1 -c bench/int8/hopper_int8_check.cu -o "$OUTDIR/check.o"
  "$NVCC" "${FLAGS[@]}" -c bench/int8/bf16_glue.cu -o "$OUTDIR/glue.o"
  "$NVCC" -gencode=arch=compute_90a,code=sm_90a -Xcompiler=-fopenmp "$OUTDIR/check.o" "$OUTDIR/int8.o" \
    "$OUTDIR/glue.o" "${CORE_BUILD:-build}/liblayerstream_core.a" -o "$OUTDIR/hopper_int8_check"
fi
