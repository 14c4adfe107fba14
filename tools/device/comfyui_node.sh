#!/usr/bin/env bash
# The LayerStream node inside a real ComfyUI on the GPU machine (issue 25): ComfyUI's own node
# loader and prompt executor run API prompts UNETLoader -> "LayerStream: H3 Engine" -> KSampler
# against stock ComfyUI (the same prompt without the node) on a real-width synthetic checkpoint
# (make-model --preset h3 --blocks 2): both paths (engine, comfy-sliced, and auto), CFG 1 and 3,
# a budget (8G) and explicit slices, at S = 7,730 (448x448x124, L 64) and S = 111,274
# (1024x1024x362, L 500). It prints per-step times, the comparisons (comfy-sliced torch.equal
# to stock, the engine's relative L2 to stock, the engine under a budget / slices torch.equal to
# its auto run), time outside the engine, engine opens, device peaks against the budget and the
# AdaLN table computations, then runs the GPU budget test and measures the fp32 head GEMM's
# row-invariance floor at full width (S = 38,000 and 111,274) for comfy-sliced's table.
# tools/device/comfyui_node_bench.py does the ComfyUI part (read its docstring).
#
# Nothing third-party is in this repository. Stage it, on a machine that can reach the sources,
# into a git-ignored folder that travels with the tree (default .stage/; add it to
# .git/info/exclude, or put the tree copy under an ignored .dev/NAME/ as the lead's recipe does):
#   ComfyUI: kat3ri/ComfyUI at upstream 0f1fa67a (a git clone or the search tool's fetch),
#     git archive HEAD minus comfy_api_nodes, tests, tests-unit, .github, .ci and the two
#     tokenizer blobs a partial clone may lack:
#       git -C COMFY archive --format=tar HEAD -- . ':(exclude)comfy_api_nodes' ':(exclude)tests' \
#         ':(exclude)tests-unit' ':(exclude).github' ':(exclude).ci' \
#         ':(exclude)comfy/text_encoders/llama_tokenizer/tokenizer.json' \
#         ':(exclude)comfy/text_encoders/qwen35_tokenizer/vocab.json' | xz -T2 > .stage/comfyui.tar.xz
#   The pure-Python packages ComfyUI imports that the GPU image lacks, from their upstream
#     snapshots (google-research/torchsde, Comfy-Org/comfy-kitchen, Comfy-Org/comfy-aimdo):
#       mkdir -p /tmp/pydeps && for r in TORCHSDE:torchsde KITCHEN:comfy_kitchen AIMDO:comfy_aimdo; do
#         git -C ${r%%:*} archive HEAD ${r##*:} | tar -x -C /tmp/pydeps; done
#       tar -C /tmp -cJf .stage/pydeps.tar.xz pydeps
#   trampoline (torchsde's import for Brownian intervals) and PyAV (a C extension comfy_api imports
#   for video types) are replaced at import time by placeholders (comfyui_node_bench.py prints them);
#   euler never builds a Brownian interval and no video is decoded. Comfy Kitchen's and comfy_aimdo's
#   native parts are not built: Kitchen INT8 attention is then unavailable in this ComfyUI and it runs
#   with --disable-dynamic-vram (the legacy ModelPatcher); docs/comfyui.md says what that leaves out.
#   The .deps/ folder (Debian headers: CLI, nlohmann, pybind11, dlpack, googletest) is carried too
#   (tools/device/build.sh).
#
# Usage (device, repository root; the run tool's $OUT collects the results):
#   [STAGE=.stage] [SIZES=small,large] [OUT=...] tools/device/comfyui_node.sh
# Writes $OUT/comfyui_node.json (every case, every comparison), $OUT/comfyui_node.log (this
# output), $OUT/head_floor.txt; prints a summary last. About 9 minutes on an H200 with the
# build; a case that would start after BENCH_SECONDS (default 230) of the ComfyUI part is skipped
# and listed.
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
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
for f in "$STAGE/comfyui.tar.xz" "$STAGE/pydeps.tar.xz"; do
  [ -f "$f" ] || { echo "missing $f: stage ComfyUI and its Python packages first (see this script's header)"; exit 2; }
done

# 1. the engine and its Python package (CUDA, sm_90), only the targets this run needs
PY=$(command -v python3)
if [ ! -x build-gpu/layerstream ] || ! ls build-gpu/python/layerstream/_C*.so >/dev/null 2>&1; then
  stamp "configure + build (layerstream, layerstream_py)"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLAYERSTREAM_EXTRA_INCLUDE="$ROOT/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$ROOT/.deps/googletest" \
    -DPython3_EXECUTABLE="$PY" -DLAYERSTREAM_BENCH=OFF -DLAYERSTREAM_TESTS=OFF > "$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; exit 3; }
  cmake --build build-gpu -j16 --target layerstream layerstream_py > "$OUT/build.log" 2>&1 \
    || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 3; }
fi
stamp "built"
build-gpu/layerstream --version
export PYTHONPATH=$ROOT/build-gpu/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import layerstream; print(layerstream.version())' || exit 3

# 2. the staged ComfyUI tree, its Python packages, the node, the checkpoint
rm -rf "$W" && mkdir -p "$W/ComfyUI" || exit 4
tar -xJf "$STAGE/comfyui.tar.xz" -C "$W/ComfyUI" && tar -xJf "$STAGE/pydeps.tar.xz" -C "$W" || exit 4
mkdir -p "$W/ComfyUI/custom_nodes" "$W/ComfyUI/models/diffusion_models"
ln -sfn "$ROOT/comfyui/layerstream_h3" "$W/ComfyUI/custom_nodes/layerstream_h3"
CKPT=$W/ComfyUI/models/diffusion_models/ls_h3_2blocks.safetensors
stamp "make-model --preset h3 --blocks 2"
build-gpu/layerstream make-model --preset h3 --blocks 2 -q -o "$CKPT" || exit 5
TEXT_DIM=$(python3 - "$CKPT" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
print(h["condition_proj.weight"]["shape"][1] if "condition_proj.weight" in h else h["blocks.0.attn.qkv_proj.weight"]["shape"][1])
PY
)
stamp "checkpoint $(du -h "$CKPT" | cut -f1), text_dim $TEXT_DIM"

# 3. ComfyUI's executor: stock, engine, comfy-sliced, auto; CFG 1 and 3; budget and slices
PYTHONPATH=$W/pydeps:$PYTHONPATH timeout 330 python3 tools/device/comfyui_node_bench.py --comfy "$W/ComfyUI" \
  --unet ls_h3_2blocks.safetensors --text-dim "$TEXT_DIM" --sizes "${SIZES:-small,large}" \
  --budget-seconds "${BENCH_SECONDS:-230}" --json "$OUT/comfyui_node.json" -- --disable-dynamic-vram
stamp "ComfyUI part done (rc $?)"

# 4. the budget on every call (GPU test), if time is left
if [ $((SECONDS - T0)) -lt 440 ]; then
  LS_TOOL=$ROOT/build-gpu/layerstream timeout $((500 - (SECONDS - T0))) python3 -m pytest -q -p no:cacheprovider -s \
    tests/comfyui/test_engine_gpu.py -k "budget" 2>&1 | grep -vE "^$" | tail -15
  stamp "GPU budget test done"
fi

# 5. the fp32 head GEMM's row-invariance floor at full width (comfy-sliced's table entry gemm.f32.head)
if [ $((SECONDS - T0)) -lt 505 ]; then
  timeout $((530 - (SECONDS - T0))) python3 - <<'PY' | tee "$OUT/head_floor.txt"
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
