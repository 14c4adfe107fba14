#!/usr/bin/env bash
# Session 20, device call 5 (carry [".deps"]): the portable int8 kernel skipping fl32(acc * alpha)
# where every alpha of the warp is 1 (as the Hopper kernel) on top of call 4's ldmatrix and
# PRMT packing (the working tree), against HEAD (expsrc = git archive HEAD = call 4's kernel).
# The same steps as call 4 (run4.sh: the new build's CUDA int8 and streaming tests, then both
# builds' bench_int8_kernels alternating twice), on a different working tree and expsrc.
exec bash "$(dirname "$0")/run4.sh"
