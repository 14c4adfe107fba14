#!/usr/bin/env bash
# Stages what tools/device/comfyui_node.sh needs besides this repository, on a machine that
# can reach the sources (nothing of it is committed; the GPU machine has no network):
#
#   tools/device/comfyui_node_stage.sh DEST COMFY TORCHSDE KITCHEN AIMDO [FUNCHOOK DISTORM]
#
# each source argument a git directory (a clone, or the bare directory the search tool's
# fetch returns) of: kat3ri/ComfyUI (upstream 0f1fa67a, H3 support), google-research/torchsde,
# Comfy-Org/comfy-kitchen, Comfy-Org/comfy-aimdo, and for comfy_aimdo's native part
# kubo/funchook and gdabah/distorm. DEST (git-ignored: .dev/NAME/.stage/ in the lead's
# checkout) receives:
#   comfyui.tar.xz   ComfyUI's tree at HEAD minus comfy_api_nodes, tests, tests-unit, .github,
#                    .ci and two tokenizer blobs a partial clone may lack (none is used here)
#   pydeps.tar.xz    pydeps/{torchsde,comfy_kitchen,comfy_aimdo}: the packages as their
#                    repositories hold them (Kitchen's with its CUDA sources)
#   kitchen_cuda_sm90a.tar.xz  Comfy Kitchen's CUDA sources compiled for sm_90a with its own
#                    flags (backends/cuda/CMakeLists.txt, Release), all but ops/flash_decode.cu,
#                    which needs the flash-attention and CUTLASS submodules a snapshot lacks
#                    (without CUTLASS Kitchen compiles its CUTLASS GEMMs as stubs, as its
#                    CMakeLists says). comfyui_node.sh links them into Kitchen's _C on the GPU
#                    machine, where nanobind and Python 3.12 are.
#   aimdo.so         comfy_aimdo's native part (its scripts/build-linux-aimdo.sh, CUDA flavour:
#                    plain C with funchook + distorm; no CUDA headers), when FUNCHOOK and
#                    DISTORM are given
# nvcc (the CUDA toolkit's, 12.8 or newer), gcc, cmake, ninja and xz are needed. The CUDA
# compile is the long part (about 25 minutes for the 20 files on a busy 2-core machine, the
# largest sage_attn_launcher.cu 8 minutes; objects already in $OBJ, default
# /tmp/ls-kitchen-obj, are kept).
set -euo pipefail
[ $# -ge 5 ] || { sed -n 2,27p "$0"; exit 2; }
DEST=$1 COMFY=$2 TORCHSDE=$3 KITCHEN=$4 AIMDO=$5 FUNCHOOK=${6:-} DISTORM=${7:-}
OBJ=${OBJ:-/tmp/ls-kitchen-obj}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$DEST" "$OBJ"

git -C "$COMFY" archive --format=tar HEAD -- . ':(exclude)comfy_api_nodes' ':(exclude)tests' \
  ':(exclude)tests-unit' ':(exclude).github' ':(exclude).ci' \
  ':(exclude)comfy/text_encoders/llama_tokenizer/tokenizer.json' \
  ':(exclude)comfy/text_encoders/qwen35_tokenizer/vocab.json' | xz -T2 > "$DEST/comfyui.tar.xz"
echo "ComfyUI $(git -C "$COMFY" log -1 --format='%h %s' | cut -c1-80)"

mkdir -p "$TMP/pydeps"
for r in "$TORCHSDE:torchsde" "$KITCHEN:comfy_kitchen" "$AIMDO:comfy_aimdo"; do
  git -C "${r%%:*}" archive HEAD "${r##*:}" | tar -x -C "$TMP/pydeps"
  echo "${r##*:} $(git -C "${r%%:*}" log -1 --format='%h %cs')"
done
tar -C "$TMP" -cJf "$DEST/pydeps.tar.xz" pydeps

# Comfy Kitchen's CUDA objects (its flags; -DNDEBUG as CMake's Release adds it)
CK=$TMP/pydeps/comfy_kitchen/backends/cuda
FLAGS=(-std=c++20 -Xcompiler=-fPIC -Xcompiler=-fvisibility=hidden
  -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_BFLOAT16_OPERATORS__
  -U__CUDA_NO_BFLOAT16_CONVERSIONS__ -U__CUDA_NO_BFLOAT162_OPERATORS__ -U__CUDA_NO_BFLOAT162_CONVERSIONS__
  --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math -O3 -DNDEBUG
  -gencode arch=compute_90a,code=sm_90a -I"$CK" -I"$CK/sage_attention" -I"$CK/flash_compat")
sed -n '/^set(CUDA_SOURCES/,/^)/p' "$CK/CMakeLists.txt" | grep -o '[A-Za-z0-9_/]*\.cu' | grep -v flash_decode > "$TMP/sources"
while read -r f; do
  o=$OBJ/$(basename "$f" .cu).o
  [ -f "$o" ] && continue
  s=$SECONDS
  "$NVCC" "${FLAGS[@]}" -c "$CK/$f" -o "$o.tmp" && mv "$o.tmp" "$o"
  echo "kitchen $f: $((SECONDS - s)) s"
done < "$TMP/sources"
tar -C "$OBJ" -cJf "$DEST/kitchen_cuda_sm90a.tar.xz" $(sed 's|.*/||; s|\.cu$|.o|' "$TMP/sources")
echo "kitchen objects: $(wc -l < "$TMP/sources") files"

# comfy_aimdo's native part
if [ -n "$FUNCHOOK" ] && [ -n "$DISTORM" ]; then
  A=$TMP/aimdo; mkdir -p "$A/src" "$A/fh" "$A/distorm"
  git -C "$AIMDO" archive HEAD | tar -x -C "$A/src"
  git -C "$FUNCHOOK" archive HEAD | tar -x -C "$A/fh"
  git -C "$DISTORM" archive HEAD | tar -x -C "$A/distorm"
  cmake -S "$A/fh" -B "$A/fhb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DFUNCHOOK_BUILD_SHARED=OFF -DFUNCHOOK_BUILD_STATIC=ON \
    -DFUNCHOOK_BUILD_TESTS=OFF -DFUNCHOOK_DISASM=distorm -DFUNCHOOK_INSTALL=OFF \
    -DFETCHCONTENT_SOURCE_DIR_DISTORM="$A/distorm" -DFETCHCONTENT_FULLY_DISCONNECTED=ON > "$A/cmake.log"
  cmake --build "$A/fhb" > "$A/build.log"
  gcc -shared -o "$DEST/aimdo.so" -fPIC -O2 -g -pthread "$A"/src/src/*.c "$A/src/src-cuda/dispatch.c" \
    "$A"/src/src-posix/*.c -I"$A/src/src" -I"$A/fh/include" "$A/fhb/libfunchook.a" "$A/fhb/libdistorm.a" -ldl
  echo "aimdo.so (comfy_aimdo $(git -C "$AIMDO" log -1 --format=%h), funchook $(git -C "$FUNCHOOK" log -1 --format=%h))"
fi
ls -la "$DEST"
