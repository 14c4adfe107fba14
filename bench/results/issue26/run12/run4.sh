#!/usr/bin/env bash
# Session 14, device call 4 (after call 3's division-free quantiser; trace2.patch adds "state": the state loads issued): where the Hopper int8 kernel's ~15 us per item of a streamed key
# chunk goes. Call 1 showed the persistent launch (the ring and the ping-pong running on
# across items) does not lower the cost per call (0.43 vs 0.42 ms at 16,384-key chunks), so it
# is not the CTA launch or the pipeline's fill. trace2.patch (applied to this copy only, in its
# own build directory) stamps clock64() per item in consumer thread 0 of each warpgroup of
# CTAs 0 and 1 and prints: gap (previous item's end to this start), prologue (state loads
# issued + Q quantised + wg_sync), first (block 0's Q K^T, ping-pong turn, softmax), loop
# (blocks 1.. and the last P V / fold), epilogue (state or output written), in cycles
# (1.98 GHz). For Mk = 16,384 (a chunk call) and 111,274 (one call).
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-trace; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
git apply bench/results/issue26/run12/trace2.patch || { echo "patch failed"; exit 1; }
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target bench_int8_kernels >"$OUT/build.log" 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
timeout 200 "$B"/bench/bench_int8_kernels --s 111274 --reps 1 --no-portable --no-bf16 --chunked 8023 \
  --out "$OUT/bench_trace.json" >"$OUT/bench_trace.log" 2>&1
echo "bench rc $? ($(( $(date +%s) - t0 )) s)"
git apply -R bench/results/issue26/run12/trace2.patch
grep -v "^trace" "$OUT/bench_trace.log" | grep -v "^\s*$" | tail -20
# Median of each column per (Mk, kernel launch) over the printed items.
python3 - "$OUT/bench_trace.log" <<'PY'
import re, sys, statistics as st
rows = {}
for l in open(sys.argv[1]):
    m = re.match(r"trace Mk (\d+) grid (\d+) cta (\d+) cw (\d) item (\d+): gap (-?\d+) state (\d+) prologue (\d+) first (\d+) loop (\d+) epilogue (\d+)", l)
    if m:
        k = (int(m.group(1)), int(m.group(2))); v = [int(m.group(i)) for i in range(6, 12)]
        rows.setdefault(k, []).append(v)
for k, vs in sorted(rows.items()):
    cols = list(zip(*vs))
    print("Mk %6d grid %6d  n %4d  median cycles: gap %7d state %6d prologue %7d first %7d loop %9d epilogue %6d" % (k + (len(vs),) + tuple(int(st.median(c)) for c in cols)))
PY
echo "total $(( $(date +%s) - t0 )) s"
