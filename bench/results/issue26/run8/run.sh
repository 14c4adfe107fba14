#!/usr/bin/env bash
# session 11 "opt", run 8: build, the CUDA = CPU byte tests under every Hopper variant, then the variants' rates.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s); V=0,1,3,5,7,11,15
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda bench_int8_kernels >"$OUT/build.log" 2>&1; rc=$?
echo "build rc $rc after $(( $(date +%s) - t0 )) s"
if [ $rc -ne 0 ]; then grep -E "error" "$OUT/build.log" | head -30; exit 1; fi
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
for v in ${V//,/ }; do
  LAYERSTREAM_HOPPER8_VARIANT=$v timeout 60 "$TI" >"$OUT/test_int8_v$v.log" 2>&1; echo "variant $v: test_attention_int8_cuda rc $? $(grep -E '^\[  PASSED|FAILED  \]' "$OUT/test_int8_v$v.log" | head -3 | tr '\n' ' ')"
done
timeout 200 "$B"/bench/bench_int8_kernels --s 111274 --reps 3 --hopper-variants $V --out "$OUT/bench_int8_kernels.json" >"$OUT/bench_int8_kernels.log" 2>&1
echo "bench rc $? ($(( $(date +%s) - t0 )) s)"
cat "$OUT/bench_int8_kernels.log"
echo "--- table (TOP/s, bf16 FLOP count, median of 3) ---"
grep -E "TOP/s" "$OUT/bench_int8_kernels.log" | awk '{printf "%-24s %s\n", $1, $(NF-3)}'
grep -E "differ" "$OUT/bench_int8_kernels.log"
echo "total $(( $(date +%s) - t0 )) s"
