#!/usr/bin/env bash
# Session 17, device call 2 (warm after call 1: build-r15 kept; .stage = Comfy Kitchen staged by
# tools/device/comfyui_node_stage.sh, untracked): our Hopper int8 kernel and Comfy Kitchen's own
# INT8 attention (its _C linked on this machine, tools/device/comfyui_node.sh PLANS=kitchen_alone)
# side by side at S = 111,274, 56 x 128: ours, Kitchen, ours. XV = an expsrc variant to time too.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ours() {
  timeout 60 build-r15/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out "$OUT/ours_$1.json" >"$OUT/ours_$1.log" 2>&1
  echo "ours $1 rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' "$OUT/ours_$1.log" | awk '{printf "%s %s TOP/s; ", $1, $8}')"
  if [ -n "${XV:-}" ] && [ -x build-x/bench/bench_int8_kernels ]; then
    LS_H8_VARIANT=$XV timeout 60 build-x/bench/bench_int8_kernels --s 111274 --reps 3 --no-bf16 --no-portable --out "$OUT/x${XV}_$1.json" >"$OUT/x${XV}_$1.log" 2>&1
    echo "x$XV $1 rc $? ($(( $(date +%s) - t0 )) s): $(grep -E '^int8_hopper ' "$OUT/x${XV}_$1.log" | awk '{printf "%s %s TOP/s; ", $1, $8}')"
  fi
}
[ -x build-r15/bench/bench_int8_kernels ] || { echo "build-r15 is gone (machine not warm): run run1.sh first"; exit 1; }
ours 1
OUT="$OUT/comfyui" PLANS="kitchen_alone" ENGINE=0 KITCHEN_SECONDS=200 timeout 400 bash tools/device/comfyui_node.sh >"$OUT/comfyui_node_stdout.log" 2>&1
echo "comfyui_node.sh (kitchen_alone) rc $? ($(( $(date +%s) - t0 )) s)"; cat "$OUT/comfyui/kitchen_attention.txt" 2>/dev/null || tail -20 "$OUT/comfyui_node_stdout.log"
ours 2
echo "total $(( $(date +%s) - t0 )) s"
