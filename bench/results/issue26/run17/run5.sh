#!/usr/bin/env bash
# Session 19, last device call (carry [".deps"]): main's working tree with the Q-descriptor change
# (run4: 727.0 vs 725.1 TOP/s, 29/29 + 5/5 tests): Hopper vs portable and persistent vs grid
# outputs (bench_int8_kernels), and the 50-block forward with int8 attention, unlimited budget
# (the hash must stay 4c5a58341ace6dc7). At most 8 files in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s); B=build-n
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/tmp/cfg.log 2>&1
cmake --build "$B" -j16 --target bench_int8_kernels bench_budget >/tmp/build.log 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep error /tmp/build.log | head; exit 1; }
timeout 60 "$B"/bench/bench_int8_kernels --s 111274 --reps 2 --no-bf16 --out "$OUT/bench_int8.json" >/tmp/bench_int8.log 2>&1
echo "bench_int8_kernels rc $? ($(( $(date +%s) - t0 )) s)"; grep -E "^int8_|differ" /tmp/bench_int8.log | cut -c1-120
timeout $(( ${LIMIT:-300} - ($(date +%s) - t0) )) "$B"/bench/bench_budget --attention int8 --frames 362 --width 1024 --height 1024 \
  --text-tokens 500 --budgets unlimited --json "$OUT/budget_int8.json" >/tmp/budget_int8.log 2>&1
echo "budget int8 (unlimited) rc $? ($(( $(date +%s) - t0 )) s)"; sed -n '/^budget |/,$p' /tmp/budget_int8.log
echo "total $(( $(date +%s) - t0 )) s"
