#!/usr/bin/env bash
# One device call for the offload overlap (issue 15 item 3, session 7), with binaries
# built elsewhere (build-bin/: test_exec_streaming_cuda and bench_budget, built with
# -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLAYERSTREAM_BENCH=ON, stripped):
#   1. the CUDA streaming sweeps (memcmp against the all-resident stock run on the GPU:
#      K/V offload with pass 1 attending the first query slice behind its copies out,
#      the residual's two slice buffers on the transfer queue, every budget plan);
#   2. bench_budget at S = 111,274 with BLOCKS blocks (default 4) side by side: the
#      budgets the CPU planner maps to all resident (stock and two-pass), K/V offload
#      and K/V + residual offload (BUDGETS; see `layerstream info --blocks 4 ...`).
# Logs and the JSON under $OUT; a table last. BENCH_ARGS="--profile 1" adds the phase
# times (synchronised at phase boundaries: a diagnostic); SKIP_TESTS=1 skips step 1.
set -uo pipefail
OUT=${OUT:-/tmp/ls-overlap-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN=${BIN:-build-bin}
BLOCKS=${BLOCKS:-4}
BUDGETS=${BUDGETS:-unlimited,8G,4G,3.5G,3G}
T0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/summary.txt"
[ "${SKIP_TESTS:-0}" = 1 ] || timeout "${TEST_LIMIT:-90}" $BIN/test_exec_streaming_cuda >"$OUT/test_exec_streaming_cuda.log" 2>&1
printf 'test_exec_streaming_cuda rc %d  %s (%d s)\n' $? "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_exec_streaming_cuda.log" | tr '\n' ' ')" \
  $((SECONDS - T0)) | tee -a "$OUT/summary.txt"
grep -E "Failure|differs" "$OUT/test_exec_streaming_cuda.log" | head -10
timeout "${BENCH_LIMIT:-150}" $BIN/bench_budget --blocks "$BLOCKS" --frames 362 --width 1024 --height 1024 --text-tokens 500 \
  --budgets "$BUDGETS" ${BENCH_ARGS:-} --json "$OUT/bench_overlap.json" >"$OUT/bench_overlap.log" 2>&1
echo "bench_budget --blocks $BLOCKS rc $? ($((SECONDS - T0)) s)" | tee -a "$OUT/summary.txt"
grep -E "^\[.*\] (forward|budget|  )" "$OUT/bench_overlap.log" | cut -c1-400
sed -n '/^budget | step/,$p' "$OUT/bench_overlap.log" | tee -a "$OUT/summary.txt"
