#!/usr/bin/env bash
# Session 13, device call 5 (cold, the session's last ~340 s of device time; carry [".deps"]):
# the H3-width drift row that session 12's LIMIT cut: attention int8 against bf16 at sigma 0.1
# (tools/device/drift_table.sh with SIGMAS=0.1), bench_drift built alone.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_drift >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head; exit 1; }
mkdir -p build-bin && cp "$B"/bench/bench_drift build-bin/
SIGMAS=0.1 VARIANTS=int8 LIMIT=$(( ${TOTAL:-265} - ($(date +%s) - t0) )) BIN=build-bin tools/device/drift_table.sh
echo "total $(( $(date +%s) - t0 )) s"
