#!/usr/bin/env bash
# Session 14, device call 6 (carry [".deps"]): where the 3G int8 forward's remaining extra time
# goes after the q8 cache (call 5: 1.100x), H3 full width, 5 blocks, --profile 1 (phases
# synchronised), unlimited and 3G; as run 11 call 3 (1.138x then: prepare 0.498 s, pass 1
# 0.211, pass 2 3.237 against 3.446 s of unlimited attention).
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_budget >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
timeout 200 "$B"/bench/bench_budget --attention int8 --blocks 5 --frames 362 --width 1024 --height 1024 --text-tokens 500 \
  --budgets unlimited,3G --profile 1 --json "$OUT/prof5.json" >"$OUT/prof5.log" 2>&1
echo "== 5 blocks --profile 1 rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "\] forward|\]   |\] budget" "$OUT/prof5.log" | sed 's/; LayerStream device peak.*hash/ hash/' | cut -c1-330
sed -n '/^budget |/,$p' "$OUT/prof5.log"
echo "total $(( $(date +%s) - t0 )) s"
