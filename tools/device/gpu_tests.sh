#!/usr/bin/env bash
# Every GPU test (ctest label "cuda": tests/cuda/*) of this tree on the GPU machine, built
# there (Release, CUDA sm_90, the carried Debian headers as tools/device/build.sh says), plus
# the CPU fingerprint and the CUDA CLI hash at H3 width for the record. Logs under $OUT, a
# short table last. Usage (GPU machine, carry [".deps"]): tools/device/gpu_tests.sh [build-dir]
set -uo pipefail
OUT=${OUT:-/tmp/ls-gpu-tests}; mkdir -p "$OUT"
B=${1:-build-gpu}; t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_PYTHON=OFF -DLAYERSTREAM_BENCH=OFF -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" \
  -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
targets="layerstream $(cd tests/cuda && ls test_*.cpp | sed 's/\.cpp$//' | tr '\n' ' ')"
cmake --build "$B" -j16 --target $targets >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
t1=$(date +%s)
ctest --test-dir "$B" -L cuda -j6 --timeout 240 --output-on-failure >"$OUT/ctest.log" 2>&1
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)" "$OUT/ctest.log" | head -40
echo "ctest: $(($(date +%s) - t1)) s"
"$B/layerstream" forward --preset small --frames 9 --width 64 --height 64 --text-tokens 16 --sigma 0.9 2>&1 |
  grep "output hash" | sed 's/^/cpu fingerprint: /'
for a in auto int8; do
  "$B/layerstream" forward --random-weights --preset h3 --blocks 1 --frames 9 --width 256 --height 256 --text-tokens 32 \
    --sigma 0.9 --device cuda --attention $a 2>&1 | grep -E "numerics|output hash" | sed "s/^/cuda $a: /"
done
echo "total: $(($(date +%s) - t0)) s"
