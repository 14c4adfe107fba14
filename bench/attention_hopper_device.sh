#!/usr/bin/env bash
# Issue 15 on the GPU machine: builds the attention targets, runs the Hopper kernel's
# tests (parity, slicing and streamed-key memcmp) and the attention benchmark at
# S = 111274, 56 x 128, non-causal: hopper, cudnn and native through bench_cuda_block
# --attention-only (each at its default kv_tile), the same in the test's side-by-side
# table (one call and 16384-query slices), and PyTorch's SDPA (default choice) on the
# same shapes. Logs and JSON under OUT.
# Usage (device, in the repository root, .deps/ beside it): bench/attention_hopper_device.sh OUT [quick]
set -uo pipefail
OUT=${1:?OUT folder}
QUICK=${2:-}
B=build-gpu
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_PYTHON=OFF -DLAYERSTREAM_BENCH=ON -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/../.deps/include" \
  -DLAYERSTREAM_GTEST_SOURCE="$PWD/../.deps/googletest" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
T="test_attention_hopper bench_cuda_block"
[ -z "$QUICK" ] && T="$T test_real_width_invariance"
cmake --build $B -j16 --target $T >"$OUT/build.log" 2>&1 || { grep -B2 -A8 -m5 "error" "$OUT/build.log"; exit 1; }
tb() { find $B -name "$1" -type f -perm -u+x | head -1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 150 "$(tb test_attention_hopper)" --gtest_filter='-*Throughput*' 2>&1 | tee "$OUT/test_attention_hopper.log" | grep -v "^\[ *RUN\|^\[ *OK" | tail -40
LAYERSTREAM_HOPPER_BENCH_JSON="$OUT/throughput_test.json" timeout 150 "$(tb test_attention_hopper)" \
  --gtest_filter='*Throughput*' 2>&1 | tee "$OUT/throughput_test.log" | grep -E "^ +[a-z]|FAIL"
for a in hopper cudnn native; do
  LAYERSTREAM_ATTENTION=$a timeout 120 "$(tb bench_cuda_block)" --attention-only --S 111274 --iters 3 --warmup 1 \
    --json "$OUT/bench_attention_$a.json" 2>&1 | tail -2 | tee -a "$OUT/bench_attention.log"
done
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/sdpa.log"
import torch, torch.nn.functional as F
S, H, D = 111274, 56, 128
q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(2): F.scaled_dot_product_attention(q, k, v)
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(3):
    e0.record(); F.scaled_dot_product_attention(q, k, v); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1))
t = sorted(ts)[1]
print("pytorch sdpa (default) S=%d: %.1f ms %.1f TFLOP/s (torch %s)" % (S, t, 4.0 * S * S * H * D / t / 1e9, torch.__version__))
PY
if [ -z "$QUICK" ]; then
  timeout 240 "$(tb test_real_width_invariance)" --gtest_filter='*Hopper*' 2>&1 | tee "$OUT/real_width_hopper.log" | tail -8
fi
