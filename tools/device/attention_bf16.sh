#!/usr/bin/env bash
# Issue 15 on the GPU machine: builds the attention targets, runs the Hopper kernel's
# tests (parity, slicing and streamed-key memcmp) and the cuDNN path's (they share the
# parity harness, tests/cuda/attention_test_util.h), and the attention benchmark at
# S = 111274, 56 x 128, non-causal: the side-by-side table of test_attention_hopper
# (hopper, cudnn, native at each one's default kv_tile; one call over all queries and
# 16384-query slices), bench_cuda_block --attention-only for each algorithm, and
# PyTorch's SDPA (default choice) on the same shapes. The log goes to stdout (tee it to
# OUT); JSON under OUT (few files: the device tool returns a handful).
# Usage (device, in the repository root, .deps/ beside it):
#   [SCHEDULES=1,0,..] tools/device/attention_bf16.sh OUT [full|quick|diag]
#   full: all of it plus the real-width plan-invariance test on attention hopper;
#   quick: no plan-invariance test; diag: the tests and the side-by-side table only.
#   SCHEDULES: the hopper kernel schedules the table times (attention_hopper.cu; unset: the
#   default configuration alone, labelled "hopper").
set -uo pipefail
OUT=${1:?OUT folder}
MODE=${2:-full}
B=build-gpu
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_PYTHON=OFF -DLAYERSTREAM_BENCH=ON -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/../.deps/include" \
  -DLAYERSTREAM_GTEST_SOURCE="$PWD/../.deps/googletest" >/tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; exit 1; }
T="test_attention_hopper test_attention_cudnn"
[ "$MODE" != diag ] && T="$T bench_cuda_block"
[ "$MODE" = full ] && T="$T test_real_width_invariance"
cmake --build $B -j16 --target $T >/tmp/build.log 2>&1 || { grep -B2 -A8 -m5 "error" /tmp/build.log; exit 1; }
tb() { find $B -name "$1" -type f -perm -u+x | head -1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 "$(tb test_attention_hopper)" --gtest_filter='-*Throughput*' 2>&1 | grep -v "^\[ *RUN\|^\[ *OK"
timeout 100 "$(tb test_attention_cudnn)" --gtest_filter='-*Throughput*' 2>&1 | grep -E "PASSED|FAILED|Failure|tests ran"
[ -n "${SCHEDULES:-}" ] && export LAYERSTREAM_HOPPER_BENCH_SCHEDULES=$SCHEDULES
LAYERSTREAM_HOPPER_BENCH_JSON="$OUT/attention_side_by_side.json" timeout 200 "$(tb test_attention_hopper)" --gtest_filter='*Throughput*' 2>&1 | grep -E "^ +[a-z]|FAIL"
[ "$MODE" = diag ] && exit 0
for a in hopper cudnn native; do
  LAYERSTREAM_ATTENTION=$a timeout 120 "$(tb bench_cuda_block)" --attention-only --S 111274 --iters 3 --warmup 1 \
    --json "$OUT/bench_attention_$a.json" 2>&1 | tail -2
done
timeout 120 python3 - <<'PY' 2>&1
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
if [ "$MODE" = full ]; then
  timeout 240 "$(tb test_real_width_invariance)" --gtest_filter='*Hopper*' 2>&1 | tail -8
fi
