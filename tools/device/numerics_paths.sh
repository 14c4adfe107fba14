#!/usr/bin/env bash
# Issue 12 part 2 (numerics as explicit parameters) on the GPU machine: builds with CUDA
# (headers from the carried .deps/, as tools/device/build.sh), then runs, each binary in
# its own process so one abort cannot hide the rest:
#   tests/cuda/*            (test_backend_ops, test_streaming_ops, test_attention_cudnn,
#                            test_exec_streaming_cuda, test_real_width_invariance,
#                            test_fingerprints_cuda: both attention paths selected via
#                            Backend::set_numerics, the pinned "cuda cudnn" / "cuda native"
#                            fingerprints of tests/data/fingerprints.json)
#   test_golden_ops, test_golden_forward, test_numerics, test_fingerprints (CPU sections)
# and a `layerstream info --vram-budget` + the CLI's developer-variable mapping smoke.
# Logs under $OUT (build.log, <test>.log, summary.txt); a short summary is printed last.
# Usage (device, carry [".deps"]): tools/device/numerics_paths.sh [build-dir] [gtest filter]
set -uo pipefail
OUT=${OUT:-/tmp/ls-numerics-out}
mkdir -p "$OUT"
B=${1:-build-gpu}
FILTER=${2:-*}
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_BENCH=ON -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" \
  -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
TESTS="test_backend_ops test_streaming_ops test_attention_cudnn test_exec_streaming_cuda test_real_width_invariance
test_fingerprints_cuda test_golden_ops test_golden_forward test_numerics test_fingerprints"
# shellcheck disable=SC2086
cmake --build "$B" -j16 --target layerstream bench_cuda_block bench_gemm_pins bench_stream_ops $TESTS \
  >>"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -80; exit 1; }
echo "build: $(($(date +%s) - t0)) s" | tee "$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"

pass=0; fail=0; failed=""
for t in $TESTS; do
  ts=$(date +%s)
  timeout 500 "$B/tests/$t" --gtest_filter="$FILTER" >"$OUT/$t.log" 2>&1
  rc=$?
  n_pass=$(grep -c '^\[       OK \]' "$OUT/$t.log")
  n_skip=$(grep -c '^\[  SKIPPED \]' "$OUT/$t.log")
  n_fail=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/$t.log")
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); r=PASS; else fail=$((fail + 1)); failed="$failed $t"; r="FAIL($rc)"; fi
  printf '%-28s %-9s ok %3d skipped %2d failed %2d  %4d s\n' "$t" "$r" "$n_pass" "$n_skip" "$n_fail" \
    "$(($(date +%s) - ts))" | tee -a "$OUT/summary.txt"
  grep -E '^\[  (FAILED|SKIPPED) +\] [A-Za-z]' "$OUT/$t.log" | head -10 | sed 's/^/    /' | tee -a "$OUT/summary.txt"
done

# The CLI: resolved numerics and the developer variables mapped onto flags (stderr notice).
{
  echo "--- info --vram-budget (no device opened), --attention native"
  "$B/layerstream" info --preset h3 --frames 362 --width 1024 --height 1024 --text-tokens 500 --vram-budget 4G \
    --attention native 2>&1 | grep -E "kv_tile|assumed" | head -4
  echo "--- LAYERSTREAM_ATTENTION=native mapped"
  LAYERSTREAM_ATTENTION=native "$B/layerstream" info --preset h3 --frames 362 --width 1024 --height 1024 \
    --text-tokens 500 --vram-budget 4G 2>&1 | grep -E "developer|kv_tile 1024" | head -3
  echo "--- bench_stream_ops with LAYERSTREAM_ATTENTION=native (numerics line)"
  LAYERSTREAM_ATTENTION=native timeout 120 "$B/bench/bench_stream_ops" --S 32768 --Mq 4096 2>&1 | grep -E "numerics|error" | head -3
} >"$OUT/cli.log" 2>&1
cat "$OUT/cli.log" | tee -a "$OUT/summary.txt"
echo "numerics check: $pass binaries passed, $fail failed:$failed ($(($(date +%s) - t0)) s)" | tee -a "$OUT/summary.txt"
[ $fail -eq 0 ]
