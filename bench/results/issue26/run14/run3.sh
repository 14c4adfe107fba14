#!/usr/bin/env bash
# Session 16, device call 3 (right after call 2, the machine warm: build-v4 kept; D = the v4
# tree): contract v4's drift row (S = 6,970, two statistics blocks; the bf16 reference hashes
# must equal run 2's d78774a68211b0ff / ecb2614550609afd / 8c80b4399140779f), then the H3
# block at S = 111,274 with int8 beside PyTorch's (the default block left out for device time) (run 13 call 5,
# v3: 765.3 / 711.2 / 797.8 ms).
set -uo pipefail
OUT=${OUT:-/tmp/out}; D=${D:-.}; B=build-v4; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
left() { echo $(( 590 - ($(date +%s) - t0) )); }
cmake -S "$D" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_drift bench_cuda_block >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
mkdir -p build-bin && cp "$B"/bench/bench_drift build-bin/
OUT="$OUT/drift" LIMIT=${LIMIT:-230} VARIANTS=int8 bash "$D"/tools/device/drift_table.sh
echo "drift done ($(( $(date +%s) - t0 )) s)"
timeout $(( $(left) - 70 )) "$B"/bench/bench_cuda_block --attention int8 --S 111274 --json "$OUT/block_int8.json" >"$OUT/block_int8.log" 2>&1
echo "block int8 rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^S=" "$OUT/block_int8.log"
PYTHONUNBUFFERED=1 timeout $(( $(left) - 2 )) python3 "$D"/bench/pytorch_block.py --S 111274 --json "$OUT/pytorch_block.json" >"$OUT/pytorch_block.log" 2>&1
echo "pytorch_block rc $? ($(( $(date +%s) - t0 )) s)"; tail -2 "$OUT/pytorch_block.log"
echo "total $(( $(date +%s) - t0 )) s"
