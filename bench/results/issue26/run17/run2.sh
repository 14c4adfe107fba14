#!/usr/bin/env bash
# Session 19, device call 3 (carry [".deps"]; `bash run17/run2.sh`): X =
# expsrc (main + run17/overlap_variants.patch; LS_H8_VARIANT picks the Hopper int8 kernel's
# variant in that experiment build only): 0 = main's code; 1 = FlashAttention-3's order inside a
# warpgroup, half of it: Q K^T of keys 0..63 of block j + 1 in flight under block j's softmax,
# block j's P V, its fold, then keys 64..127 (ptxas: 1,216 / 984 B spills, wgmma serialised for
# want of registers); 3 = the same order without the overlap (12 / 20 B); 2 = main with the V
# permute skipped (WRONG bytes: the bound of storing V pre-permuted; rate only). Tests (bytes =
# the CPU reference) for TVARS, rates at S = 111,274 alternating, two rounds.
# Stage: rm -rf expsrc && mkdir expsrc && git archive HEAD | tar -x -C expsrc &&
# (cd expsrc && git apply ../bench/results/issue26/run17/overlap_variants.patch)
exec env TVARS="${TVARS:-1 3}" VARS="${VARS:-1 2 3}" bash "$(dirname "$0")/run1.sh"
