#!/usr/bin/env bash
# Session 20, device call 3 (carry [".deps", ".stage"]; .stage as in run17/next_kitchen.sh): the
# node inside a real ComfyUI at S = 111,274 (2-block real-width model, 3 steps, CFG 1) with the
# Hopper INT8 kernel, which issue 25's run 3 (6.54 s per step with Kitchen INT8 chosen, then the
# portable contract-v1 kernel) predates: stock bf16, comfy-sliced, engine, and the same three with
# "comfy kitchen attention" chosen (stock = ComfyUI with Comfy Kitchen's INT8 attention; engine =
# the engine's own int8). At most 8 files in $OUT (comfyui_node.sh writes 4).
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
OUT=$OUT PLANS="legacy" SIZES=large LEGACY_SECONDS=${LEGACY_SECONDS:-280} timeout 560 bash tools/device/comfyui_node.sh >/tmp/node_stdout.log 2>&1
echo "comfyui_node.sh rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[|large_|status|attention" "$OUT/comfyui_node.log" | grep -vE "^\s*$" | tail -40
