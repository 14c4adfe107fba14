#!/usr/bin/env bash
# One device call for the CUDA backend: build the CUDA test and benchmark targets, run
# every CUDA parity test (each in its own process, so one abort cannot hide the rest),
# then the block benchmark and the PyTorch baseline side by side. Logs go to $OUT
# (test.log, bench.json, torch.json, summary.txt); a short table is printed last.
# Usage (on the GPU machine, carry [".deps"]):
#   tools/device/cuda_parity_and_block_bench.sh [S list, e.g. 32768,111274] [gtest filter] [bench iters]
# TORCH=0 skips the PyTorch baseline (its table then uses a torch.json already in $OUT).
set -uo pipefail
OUT=${OUT:-/tmp/ls-cuda-out}
mkdir -p "$OUT"
S_LIST=${1:-32768}
FILTER=${2:-*}
ITERS=${3:-3}
B=build-gpu
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cmake --build $B -j16 --target test_backend_ops bench_cuda_block >>"$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -80; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/summary.txt"

: >"$OUT/test.log"
pass=0; fail=0; failed=""
for t in $($B/tests/test_backend_ops --gtest_list_tests --gtest_filter="$FILTER" | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
  ts=$(date +%s%N)
  timeout 240 $B/tests/test_backend_ops --gtest_filter="$t" >>"$OUT/test.log" 2>&1
  rc=$?
  te=$(date +%s%N)
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); r=PASS; else fail=$((fail + 1)); failed="$failed $t"; r="FAIL($rc)"; fi
  printf '%-55s %-8s %6d ms\n' "$t" "$r" "$(((te - ts) / 1000000))" | tee -a "$OUT/summary.txt"
done
echo "tests: $pass passed, $fail failed:$failed" | tee -a "$OUT/summary.txt"
grep -E "pinned:|rel L2|Failure|error|differ|beyond|ulp" "$OUT/test.log" | head -60

if [ "$S_LIST" != "none" ]; then
  timeout 300 $B/bench/bench_cuda_block --S "$S_LIST" --iters "$ITERS" --warmup 1 --json "$OUT/bench.json" 2>&1 | tee -a "$OUT/summary.txt"
  for v in 8x1 4x2; do
    LAYERSTREAM_ATTN_VARIANT=$v timeout 120 $B/bench/bench_cuda_block --S "$S_LIST" --iters "$ITERS" --warmup 1 \
      --attention-only 2>&1 | sed "s/^/[attention variant $v] /" | tee -a "$OUT/summary.txt"
  done
  [ "${TORCH:-1}" = 1 ] && PYTHONUNBUFFERED=1 timeout 240 python3 bench/pytorch_block.py --S "$S_LIST" --iters "$ITERS" --warmup 1 \
    --json "$OUT/torch.json" 2>&1 | grep -v Warning | tee -a "$OUT/summary.txt"
  python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, os
o = sys.argv[1]
try:
    ls = {r["S"]: r for r in json.load(open(os.path.join(o, "bench.json")))["results"]}
    pt = {r["S"]: r for r in json.load(open(os.path.join(o, "torch.json")))["results"]}
except Exception as e:
    print("no side-by-side table:", e); sys.exit(0)
print(f"{'S':>8} {'ours stock ms':>14} {'sliced ms':>10} {'torch ms':>9} {'ours/torch':>10} {'attn TF/s':>10} {'sdpa TF/s':>10} {'bytes eq':>8}")
for S in sorted(ls):
    a, b = ls[S], pt.get(S, {})
    tb = b.get("block_ms", float("nan"))
    print(f"{S:>8} {a['stock_ms']:>14.1f} {a['sliced_ms']:>10.1f} {tb:>9.1f} {a['stock_ms']/tb:>10.3f} "
          f"{a['attention_tflops']:>10.0f} {b.get('sdpa_tflops', float('nan')):>10.0f} {str(a['sliced_equals_stock']):>8}")
PY
fi
echo "total: $(($(date +%s) - t0)) s"
