#!/usr/bin/env bash
# Issue 10 on the GPU machine: regenerates every golden file with the GPU's PyTorch
# (plain python3 there: torch + CUDA + safetensors), builds with CUDA, runs the golden
# tests (CPU and CUDA instances) against the regenerated files and the plan-invariance
# tests (CPU and CUDA), and writes under $OUT:
#   summary.txt           one line per step / executable
#   reference.log         h3_reference.py's output (PyTorch's errors vs float64 per case)
#   build.log             the last lines of the CUDA build
#   tests.log             every test executable's output
#   golden_issue10.tar.gz the regenerated tests/data/golden (commit it: tar -xzf into
#                         tests/data/golden, then check `git diff --stat`)
# C++ headers come from the carried .deps/ (tools/device/build.sh).
# Usage (device, carry [".deps"]):  bash tools/device/golden_regenerate.sh [gen|build|test|all]
#   all (default) does the three in order; on a warm machine the steps can be run as
#   separate calls (the build folder and $GOLD survive between calls).
set -uo pipefail
STEP=${1:-all}
OUT=${OUT:-/tmp/ls-issue10-out}
GOLD=${GOLD:-/tmp/ls-issue10-golden}
B=${B:-build-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

if [ "$STEP" = gen ] || [ "$STEP" = all ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
  mkdir -p "$GOLD"
  s=$(date +%s)
  python3 tests/reference/h3_reference.py --out "$GOLD" >"$OUT/reference.log" 2>&1
  rc=$?
  say "reference: rc $rc ($(($(date +%s) - s)) s), $(ls "$GOLD" | wc -l) files in $GOLD"
  grep -E "^forward_v1|FAILED|deterministic" "$OUT/reference.log" | tee -a "$OUT/summary.txt" | head -20 >/dev/null
  [ $rc -eq 0 ] || exit $rc
  # The tests read tests/data/golden of this (copied) tree: put the new files there.
  cp "$GOLD"/* tests/data/golden/
  tar -czf "$OUT/golden_issue10.tar.gz" -C "$GOLD" .
fi

if [ "$STEP" = build ] || [ "$STEP" = all ]; then
  s=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLAYERSTREAM_BENCH=OFF -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" \
    -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/build.log" 2>&1
  cmake --build "$B" -j16 --target layerstream test_golden_forward test_golden_ops test_exactness \
    test_exec_streaming test_h3_config_heads test_exec_streaming_cuda test_real_width_invariance >>"$OUT/build.log" 2>&1
  rc=$?
  tail -n 60 "$OUT/build.log" >"$OUT/build.tail" && mv "$OUT/build.tail" "$OUT/build.log"
  say "build: rc $rc ($(($(date +%s) - s)) s)"
  [ $rc -eq 0 ] || exit $rc
fi

if [ "$STEP" = test ] || [ "$STEP" = all ]; then
  if [ "$STEP" = test ] && [ -d "$GOLD" ]; then cp "$GOLD"/* tests/data/golden/; fi
  for t in test_golden_forward test_golden_ops test_h3_config_heads test_exactness test_exec_streaming \
    test_exec_streaming_cuda test_real_width_invariance; do
    [ -x "$B/tests/$t" ] || { say "$t: not built"; continue; }
    s=$(date +%s)
    echo "===== $t" >>"$OUT/tests.log"
    timeout "${T:-400}" "$B/tests/$t" >>"$OUT/tests.log" 2>&1
    rc=$?
    say "$(printf '%-28s rc %3d (%d s) %s' "$t" $rc $(($(date +%s) - s)) \
      "$(tac "$OUT/tests.log" | grep -m2 -E '^\[  (PASSED|FAILED) ' | tr '\n' ' ')")"
  done
  grep -E "Failure|differs|FAILED  \]" "$OUT/tests.log" | head -20 | tee -a "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
