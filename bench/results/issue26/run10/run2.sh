#!/usr/bin/env bash
# Session 12, device call 2 (warm after run1.sh, build-gpu reused): the H3-width drift table
# for attention int8 v2 (tools/device/drift_table.sh, VARIANTS=int8), then every GPU test
# (ctest -L cuda) built in the same build dir.
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT/drift"
BIN=$B/bench OUT="$OUT/drift" VARIANTS=int8 LIMIT=240 bash tools/device/drift_table.sh
echo "drift done ($(( $(date +%s) - t0 )) s)"
targets="layerstream $(cd tests/cuda && ls test_*.cpp | sed 's/\.cpp$//' | tr '\n' ' ')"
cmake --build "$B" -j16 --target $targets >"$OUT/build_tests.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build_tests.log" | head -40; exit 1; }
echo "tests built ($(( $(date +%s) - t0 )) s)"
timeout $(( 590 - ($(date +%s) - t0) )) ctest --test-dir "$B" -L cuda -j6 --timeout 200 --output-on-failure >"$OUT/ctest.log" 2>&1
echo "ctest rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Total Test" "$OUT/ctest.log" | head -30
