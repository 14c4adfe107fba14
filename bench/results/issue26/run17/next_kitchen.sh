#!/usr/bin/env bash
# For the next device session (not run in session 19: its device time ran out). Carry [".deps",
# ".stage"]; .stage = Comfy Kitchen staged by tools/device/comfyui_node_stage.sh (session 19's
# helper left one in the lead's checkout, untracked: ComfyUI 0f1fa67a, comfy-kitchen 7d86acf,
# torchsde eb3a00e, comfy-aimdo ce3c59e, and layerstream-cpu; ~10.5 MiB): main's Hopper int8
# kernel and Comfy Kitchen's own INT8 attention side by side at S = 111,274, 56 x 128 (ours,
# Kitchen, ours). ~250 s plus the start. Writes at most 8 files to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-m -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >/tmp/cfg.log 2>&1
cmake --build build-m -j16 --target bench_int8_kernels >/tmp/build.log 2>&1
rc=$?; echo "build rc $rc after $(( $(date +%s) - t0 )) s"; [ $rc -ne 0 ] && { grep -E "error" /tmp/build.log | head; exit 1; }
ours() {
  timeout 60 build-m/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out "/tmp/ours_$1.json" >"/tmp/ours_$1.log" 2>&1
  echo "ours $1 rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' "/tmp/ours_$1.log" | awk '{printf "%s %s TOP/s", $1, $8}')"
}
ours 1
if [ -f .stage/comfyui.tar.xz ]; then
  OUT=/tmp/comfyui PLANS="kitchen_alone" ENGINE=0 KITCHEN_SECONDS=200 timeout 420 bash tools/device/comfyui_node.sh >/tmp/comfyui_node_stdout.log 2>&1
  echo "comfyui_node.sh (kitchen_alone) rc $? ($(( $(date +%s) - t0 )) s)"
  if [ -f /tmp/comfyui/kitchen_attention.txt ]; then cat /tmp/comfyui/kitchen_attention.txt; cp /tmp/comfyui/kitchen_attention.txt "$OUT/"; else tail -20 /tmp/comfyui_node_stdout.log; fi
  ours 2
else echo "no .stage: Kitchen not run"; fi
cp /tmp/ours_1.json "$OUT/"
echo "total $(( $(date +%s) - t0 )) s"
