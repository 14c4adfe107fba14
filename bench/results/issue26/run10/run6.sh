#!/usr/bin/env bash
# Session 12, device call 6 (cold, the session's last ~180 s; carry [".deps"]): is the 3G
# int8 loss the cost per call of streamed key chunks? bench_int8_kernels --chunked 8089 (the
# 3G plan's query slice against all 111,274 keys: one call, then 4,096 / 8,192 / 16,384 /
# 32,768-key chunks carrying the state, each compared byte for byte with the one call).
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_int8_kernels >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep error "$OUT/build.log" | head; exit 1; }
"$B"/bench/bench_int8_kernels --s 111274 --reps 3 --no-portable --no-bf16 --chunked 8089 \
  --out "$OUT/bench_chunked.json" 2>&1 | tee "$OUT/bench_chunked.log"
echo "total $(( $(date +%s) - t0 )) s"
