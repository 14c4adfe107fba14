#!/usr/bin/env bash
# Session 16, device call 1 (branch exp-x, carry [".deps"]): where does the Hopper int8 kernel's
# time go? Variants of the same kernel (LS_I8X, experiment only; outputs are NOT the contract's
# except X=0): 0 = contract v3 (as on main); 2 = one K scale per 128-key tile (the integer tile
# max, x = fmaf(A, float(d), B): FMUL and FADD per score gone; a contract v4 sketch);
# 3 = 2 plus a fold without I2F; 4 = no softmax (P = low bytes of d), fold kept; 5 = 4 without
# the fold (the MMA + pipeline ceiling of this structure). Alternating, two rounds.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_int8_kernels >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
for i in 1 2; do
  for x in 0 2 3 4 5; do
    LS_I8X=$x timeout 60 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable \
      --out "$OUT/bench_x${x}_$i.json" >"$OUT/bench_x${x}_$i.log" 2>&1
    echo "X=$x round $i rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_(hopper|hopper_grid) ' "$OUT/bench_x${x}_$i.log" | awk '{printf "%s %s TOP/s; ", $1, $8}')"
  done
done
echo "total $(( $(date +%s) - t0 )) s"
