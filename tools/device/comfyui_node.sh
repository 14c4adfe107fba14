#!/usr/bin/env bash
# The LayerStream node inside a real ComfyUI on the GPU machine (issues 25 and 26 item 4):
# ComfyUI's own node loader and prompt executor run API prompts UNETLoader -> [Model Attention
# Backend] -> [LayerStream: H3 Engine] -> KSampler against stock ComfyUI (the same prompt
# without the node) on a real-width synthetic checkpoint (make-model --preset h3 --blocks 2),
# at S = 7,730 (448x448x124, L 64) and S = 111,274 (1024x1024x362, L 500), CFG 1:
#   - comfy-sliced against stock (torch.equal) and its step time (sliced_keep_q),
#   - the engine path against stock (relative L2), its time outside the engine, opens, peaks,
#   - ComfyUI's attention choice in front of the node: "pytorch attention" keeps bf16 (the same
#     bytes as no choice), "comfy kitchen attention" runs the engine's int8 attention and the
#     status says so; stock with Kitchen's INT8 attention against stock bf16 at both sizes,
#   - stock again at the end of the process (does stock equal itself across a process?),
#   - a process with --use-ck-attention (the global flag) and one under Dynamic VRAM
#     (comfy_aimdo, ComfyUI's NVIDIA default), each where its native part was built,
#   - Kitchen's INT8 attention against PyTorch SDPA alone at S = 111,274, 56 x 128.
# tools/device/comfyui_node_bench.py does the ComfyUI part (read its docstring).
#
# Nothing third-party is in this repository. Stage it first, on a machine that can reach the
# sources, into a git-ignored folder that travels with the tree (default .stage/; the lead's
# recipe copies the tree to .dev/NAME/, so .dev/NAME/.stage/):
#   tools/device/comfyui_node_stage.sh .stage COMFY TORCHSDE KITCHEN AIMDO FUNCHOOK DISTORM
# (read its header: ComfyUI's tree, the pure-Python packages, Comfy Kitchen's CUDA objects for
# sm_90a and comfy_aimdo's native aimdo.so). On the GPU machine this script links Kitchen's _C
# (its dlpack_bindings.cpp with the machine's nanobind and Python, the staged objects and a stub
# for the one kernel file not built, flash decoding, which ComfyUI uses only for LLM text
# encoders) under a time limit; without a working _C, Kitchen INT8 attention is not offered by
# that ComfyUI and the Kitchen cases show the node's answer to that. trampoline (torchsde's
# import for Brownian intervals) and PyAV (a C extension comfy_api imports for video types) are
# replaced at import time by placeholders (the bench prints them); euler never builds a
# Brownian interval and no video is decoded. The .deps/ folder (Debian headers: CLI, nlohmann,
# pybind11, dlpack, googletest) is carried too (tools/device/build.sh).
#
# Usage (device, repository root; the run tool's $OUT collects the results):
#   [STAGE=.stage] [SIZES=small,large] [OUT=...] [PLANS="legacy ck_flag dynamic kitchen_alone"]
#   [ENGINE=0] [KITCHEN=0] [GPU_TEST=1] [HEAD_FLOOR=1] tools/device/comfyui_node.sh
# PLANS picks the ComfyUI processes (comfyui_node_bench.plan; "repeat" and "repeat_det", the
# latter with --deterministic, run stock again and again); ENGINE=0 skips the engine build (the
# node then runs without the engine; make-model comes from a carried CPU build of the CLI,
# $STAGE/layerstream-cpu); KITCHEN=0 skips Kitchen's _C.
# Writes $OUT/comfyui_node.log (this output) and $OUT/comfyui_node_<name>.json (every case,
# every comparison); prints a summary per process. 188 s on an H200 with the builds (run 3);
# each process skips the cases that would start after its time share and lists them.
# GPU_TEST=1 adds the GPU budget test, HEAD_FLOOR=1 the fp32 head GEMM's row-invariance floor
# (both measured in bench/results/issue25/run2, so off by default).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
STAGE=${STAGE:-.stage}
OUT=${OUT:-/tmp/ls-comfyui-out}; mkdir -p "$OUT"
W=${WORK:-/tmp/ls-comfyui}
T0=$SECONDS
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/comfyui_node.log") 2>&1
stamp() { echo "[$((SECONDS - T0)) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
PY=$(command -v python3)
echo "$( . /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(gcc --version 2>/dev/null | head -1), nvcc $(nvcc --version 2>/dev/null | grep -o "release [0-9.]*")"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
for f in "$STAGE/comfyui.tar.xz" "$STAGE/pydeps.tar.xz"; do
  [ -f "$f" ] || { echo "missing $f: stage ComfyUI and its Python packages first (see this script's header)"; exit 2; }
done

# 1. the staged tree and packages, then two builds side by side: the engine and its Python
#    package (CUDA sm_90, only the targets this run needs), and Comfy Kitchen's _C
rm -rf "$W" && mkdir -p "$W/ComfyUI" || exit 4
tar -xJf "$STAGE/comfyui.tar.xz" -C "$W/ComfyUI" && tar -xJf "$STAGE/pydeps.tar.xz" -C "$W" || exit 4
if [ "${ENGINE:-1}" = 1 ] && { [ ! -x build-gpu/layerstream ] || ! ls build-gpu/python/layerstream/_C*.so >/dev/null 2>&1; }; then
  stamp "configure + build (layerstream, layerstream_py)"
  ( cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLAYERSTREAM_EXTRA_INCLUDE="$ROOT/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$ROOT/.deps/googletest" \
      -DPython3_EXECUTABLE="$PY" -DLAYERSTREAM_BENCH=OFF -DLAYERSTREAM_TESTS=OFF > "$OUT/configure.log" 2>&1 &&
    cmake --build build-gpu -j16 --target layerstream layerstream_py > "$OUT/build.log" 2>&1 ) &
  LS_BUILD=$!
fi

CKDIR=$W/pydeps/comfy_kitchen/backends/cuda
kitchen_c() {  # Kitchen's _C from the staged objects; its own binding source, no LTO
  local b=$W/ck-build
  [ -f "$STAGE/kitchen_cuda_sm90a.tar.xz" ] || { echo "no $STAGE/kitchen_cuda_sm90a.tar.xz"; return 1; }
  mkdir -p "$b/obj" && tar -xJf "$STAGE/kitchen_cuda_sm90a.tar.xz" -C "$b/obj" || return 1
  cat > "$b/flash_decode_stub.cpp" <<'CPP'
// Comfy Kitchen's flash-decoding kernel (ops/flash_decode.cu) needs the flash-attention and
// CUTLASS submodules, which a repository snapshot lacks: this build refuses the call instead.
#include <cstdint>
#include <stdexcept>
#include <cuda_runtime_api.h>
extern "C" void launch_flash_decode(const void*, const void*, const void*, const int*, void*, float*, float*,
                                    float*, int, int, int, int, int, int64_t, int64_t, int64_t, int64_t,
                                    int64_t, int64_t, cudaStream_t) {
    throw std::runtime_error("flash decoding is not in this Comfy Kitchen build (LayerStream's device script)");
}
CPP
  cat > "$b/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.26)
project(ck_c LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(CUDAToolkit REQUIRED)
find_package(Python COMPONENTS Interpreter Development.Module Development.SABIModule REQUIRED)
execute_process(COMMAND "\${Python_EXECUTABLE}" -c "import nanobind; print(nanobind.cmake_dir())"
                OUTPUT_VARIABLE NB_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
list(APPEND CMAKE_PREFIX_PATH "\${NB_DIR}")
find_package(nanobind CONFIG REQUIRED)
file(GLOB OBJS \${CMAKE_SOURCE_DIR}/obj/*.o)
nanobind_add_module(_C NB_STATIC STABLE_ABI $CKDIR/dlpack_bindings.cpp flash_decode_stub.cpp \${OBJS})
set_target_properties(_C PROPERTIES SUFFIX ".abi3.so")
target_compile_definitions(_C PRIVATE Py_LIMITED_API=0x030C0000 NB_STATIC)
target_compile_options(_C PRIVATE -O3 -fvisibility=hidden)
target_include_directories(_C PRIVATE $CKDIR \${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(_C PRIVATE CUDA::cudart_static \${CMAKE_DL_LIBS})
CMAKE
  cmake -S "$b" -B "$b/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" > "$OUT/kitchen.log" 2>&1 &&
    timeout "${KITCHEN_SECONDS:-150}" cmake --build "$b/build" -j16 >> "$OUT/kitchen.log" 2>&1 &&
    cp "$b/build/_C.abi3.so" "$CKDIR/" || { grep -E "error|Error|rror:" "$OUT/kitchen.log" | head -12; return 1; }
}
if [ "${KITCHEN:-1}" = 1 ]; then kitchen_c > "$OUT/kitchen_step.log" 2>&1 & else (exit 1) & fi
CK_BUILD=$!
# comfy_aimdo's native part, staged (plain C, built where the sources are reachable)
AIMDO=0
if [ -f "$STAGE/aimdo.so" ]; then
  cp "$STAGE/aimdo.so" "$W/pydeps/comfy_aimdo/aimdo.so" &&
    python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1], mode=258)" "$W/pydeps/comfy_aimdo/aimdo.so" && AIMDO=1
fi
echo "comfy_aimdo native part: $([ $AIMDO = 1 ] && echo "loads" || echo "not staged or does not load")"
[ -n "${LS_BUILD:-}" ] && { wait "$LS_BUILD" || { grep -E "error|Error" "$OUT/build.log" | head -30; tail -20 "$OUT/configure.log"; exit 3; }; }
LSCLI=build-gpu/layerstream
if [ "${ENGINE:-1}" = 1 ]; then
  stamp "engine built"
  export PYTHONPATH=$ROOT/build-gpu/python${PYTHONPATH:+:$PYTHONPATH}
  python3 -c 'import layerstream; print(layerstream.version())' || exit 3
else  # ENGINE=0: no engine in ComfyUI (the node says so); make-model from a carried CPU build of the CLI
  LSCLI=$STAGE/layerstream-cpu
fi
$LSCLI --version
if wait "$CK_BUILD"; then CK=1; else CK=0; fi
[ -f "$OUT/kitchen_step.log" ] && cat "$OUT/kitchen_step.log"
stamp "Comfy Kitchen _C: $([ $CK = 1 ] && echo built || echo "NOT built (log: kitchen.log)")"
if [ $CK = 1 ]; then
  PYTHONPATH=$W/pydeps${PYTHONPATH:+:$PYTHONPATH} python3 -c 'import comfy_kitchen, comfy_kitchen.backends.cuda as c; print("comfy_kitchen cuda backend:", c._EXT_ERROR or "loaded", "; int8 attention available:", comfy_kitchen.int8_attention_is_available())' || CK=0
fi

# 2. the checkpoint
mkdir -p "$W/ComfyUI/custom_nodes" "$W/ComfyUI/models/diffusion_models"
ln -sfn "$ROOT/comfyui/layerstream_h3" "$W/ComfyUI/custom_nodes/layerstream_h3"
CKPT=$W/ComfyUI/models/diffusion_models/ls_h3_2blocks.safetensors
$LSCLI make-model --preset h3 --blocks 2 -q -o "$CKPT" || exit 5
TEXT_DIM=$(python3 - "$CKPT" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
print(h["condition_proj.weight"]["shape"][1] if "condition_proj.weight" in h else h["blocks.0.attn.qkv_proj.weight"]["shape"][1])
PY
)
stamp "checkpoint $(du -h "$CKPT" | cut -f1), text_dim $TEXT_DIM"

# 3. ComfyUI's executor, one process per plan (comfyui_node_bench.plan)
bench() {  # name (of the JSON), plan, sizes, time share (s), ComfyUI arguments...
  local name=$1 plan=$2 sizes=$3 share=$4; shift 4
  PYTHONPATH=$W/pydeps${PYTHONPATH:+:$PYTHONPATH} timeout $((share + 60)) python3 tools/device/comfyui_node_bench.py \
    --comfy "$W/ComfyUI" --unet ls_h3_2blocks.safetensors --text-dim "$TEXT_DIM" --plan "$plan" --sizes "$sizes" \
    --budget-seconds "$share" --json "$OUT/comfyui_node_$name.json" -- "$@"
  stamp "$name (plan $plan) done (rc $?)"
}
# PLANS: which processes run (run 3: the first three and kitchen_alone; run 4: repeat and repeat_det)
PLANS=" ${PLANS:-legacy ck_flag dynamic kitchen_alone} "
[[ $PLANS == *" legacy "* ]] && bench legacy legacy "${SIZES:-small,large}" "${LEGACY_SECONDS:-130}" --disable-dynamic-vram
[[ $PLANS == *" ck_flag "* ]] && [ $CK = 1 ] && bench ck_flag ck_flag small 25 --disable-dynamic-vram --use-ck-attention
[[ $PLANS == *" dynamic "* ]] && [ $AIMDO = 1 ] && bench dynamic dynamic small 30
[[ $PLANS == *" repeat "* ]] && bench repeat repeat small 30 --disable-dynamic-vram
[[ $PLANS == *" repeat_det "* ]] && bench repeat_det repeat small 30 --disable-dynamic-vram --deterministic

# 4. Comfy Kitchen's INT8 attention against PyTorch SDPA alone, S = 111,274, 56 x 128
if [ $CK = 1 ] && [[ $PLANS == *" kitchen_alone "* ]]; then
  PYTHONPATH=$W/pydeps${PYTHONPATH:+:$PYTHONPATH} timeout 60 python3 - <<'PY' | tee "$OUT/kitchen_attention.txt"
import torch, torch.nn.functional as F, comfy_kitchen
torch.manual_seed(0)
S, H, D, dev = 111_274, 56, 128, torch.device("cuda")
q, k, v = (torch.randn((1, H, S, D), device=dev, dtype=torch.bfloat16) for _ in range(3))
k[..., :4] += 8.0  # four outlier channels in K, as the issue 26 comparison had
def timed(fn, n=5):
    fn(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(n):
        e0.record(); out = fn(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1) / 1e3)
    return out, sorted(ts)[n // 2]
flops = 4.0 * S * S * D * H
sd, t_sd = timed(lambda: F.scaled_dot_product_attention(q, k, v))
ck, t_ck = timed(lambda: comfy_kitchen.int8_attention(q, k, v))
rows = torch.randint(0, S, (256,), device=dev)
ref = torch.softmax((q[:, :, rows].double() @ k.double().transpose(-1, -2)) / D ** 0.5, -1) @ v.double()
err = lambda o: float((o[:, :, rows].double() - ref).norm() / ref.norm())
print("attention alone, S = {}, {} x {}, bf16 in and out, on {} (torch {})".format(S, H, D, torch.cuda.get_device_name(), torch.__version__))
print("PyTorch SDPA (bf16)          {:.1f} ms  {:.0f} TFLOP/s  rel L2 vs float64 {:.2e}".format(1e3 * t_sd, flops / t_sd / 1e12, err(sd)))
print("Comfy Kitchen int8_attention {:.1f} ms  {:.0f} TOP/s-equivalent  rel L2 vs float64 {:.2e}  ({:.2f}x SDPA's time)".format(
    1e3 * t_ck, flops / t_ck / 1e12, err(ck), t_ck / t_sd))
PY
  stamp "Kitchen attention alone done"
fi

# 5. optional: the budget on every call (GPU test) and the fp32 head GEMM's row-invariance floor
if [ "${GPU_TEST:-0}" = 1 ]; then
  LS_TOOL=$ROOT/build-gpu/layerstream timeout 120 python3 -m pytest -q -p no:cacheprovider -s \
    tests/comfyui/test_engine_gpu.py -k "budget" 2>&1 | grep -vE "^$" | tail -15
fi
if [ "${HEAD_FLOOR:-0}" = 1 ]; then
  timeout 60 python3 - <<'PY' | tee "$OUT/head_floor.txt"
import torch, torch.nn.functional as F
torch.manual_seed(0)
dev, D = torch.device("cuda"), 5376
MS = (1, 2, 4, 8, 9, 16, 32, 64, 128, 192, 193, 256, 320, 321, 384, 512, 1024, 4096, 8192)
print("fp32 head F.linear [m, 5376] x [5376, n] + bias on", torch.cuda.get_device_name(), "torch", torch.__version__)
for S in (38_000, 111_274):
    x = torch.randn((S, D), device=dev)
    for n in (96, 32):  # the video head (4 x 24 channels per 2x2 patch of 24-channel latents) and the audio head
        w = torch.randn((n, D), device=dev) / D ** 0.5
        b = torch.randn((n,), device=dev)
        full = F.linear(x, w, b)
        worst = 0
        for m in MS:
            for a in (0, 1000, S - m):
                if not torch.equal(F.linear(x[a:a + m], w, b), full[a:a + m]):
                    worst = max(worst, m)
        print(f"S {S:7d} n {n:3d}: largest slice differing from the full product: {worst or 'none'} (slices tried: {MS[0]}..{MS[-1]} rows at offsets 0, 1000, S - m)")
PY
fi
stamp "total"
