#!/usr/bin/env bash
# Issue 5's benchmark in one call on a 2-GPU machine (kind nvidia-h200-x2), with
# binaries carried in build-bin (see tools/device/weight_streaming.sh), or on one GPU
# running the two halves one after the other:
#   GPU 0: S = 111,274 (362 frames, 1024x1024, 500 text tokens): unlimited, 24G, 12G, 8G
#   GPU 1: S = 111,274: 6G, 4G, 3G; then S = 38,402 (124 frames, 1344x768, 500 text
#          tokens): unlimited, 8G, 4G, 3G
# Every run is one denoiser call of the full 50-block H3 model with synthetic weights
# (bench/bench_budget.cpp). The halves are merged into $OUT/budget_bench.json, with
# every S = 111k output compared to GPU 0's unlimited run.
set -uo pipefail
OUT=${OUT:-/tmp/ls-budget-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
BIN=build-bin
LIMIT=${LIMIT:-560}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
big="--frames 362 --width 1024 --height 1024 --text-tokens 500"
mid="--frames 124 --width 1344 --height 768 --text-tokens 500"
ngpu=$(nvidia-smi -L | wc -l)
run0() { CUDA_VISIBLE_DEVICES=0 timeout $LIMIT $BIN/bench_budget $big --budgets unlimited,24G,12G,8G --json "$OUT/s111k_a.json" >"$OUT/s111k_a.log" 2>&1; }
run1() {
  local dev=$1
  CUDA_VISIBLE_DEVICES=$dev timeout 340 $BIN/bench_budget $big --budgets 6G,4G,3G --json "$OUT/s111k_b.json" >"$OUT/s111k_b.log" 2>&1
  CUDA_VISIBLE_DEVICES=$dev timeout $((LIMIT - 345)) $BIN/bench_budget $mid --budgets unlimited,8G,4G,3G --json "$OUT/s38k.json" >"$OUT/s38k.log" 2>&1
}
if [ "$ngpu" -ge 2 ]; then
  run0 & p0=$!
  run1 1 & p1=$!
  wait $p0 $p1
else
  run0; run1 0
fi
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n)
    return json.load(open(p)) if os.path.exists(p) else None
a, b, m = load("s111k_a.json"), load("s111k_b.json"), load("s38k.json")
ref = a["reference_hash"] if a else None
runs = []
for part in (a, b):
    if not part: continue
    for r in part["runs"]:
        r = dict(r, S=part["S"])
        if "output_hash" in r: r["identical_to_reference"] = r["output_hash"] == ref
        runs.append(r)
unl = a["unlimited_forward_seconds"] if a else None
for r in runs:
    if "forward_seconds" in r and unl: r["x_unlimited"] = r["forward_seconds"] / unl
m_runs = []
if m:
    for r in m["runs"]:
        r = dict(r, S=m["S"])
        if "forward_seconds" in r and m["unlimited_forward_seconds"]: r["x_unlimited"] = r["forward_seconds"] / m["unlimited_forward_seconds"]
        m_runs.append(r)
res = {"command": "tools/device/budget_sweep.sh (kind nvidia-h200-x2)", "reference_hash_s111k": ref,
       "min_total_budget_bytes_s111k": a["min_total_budget_bytes"] if a else None,
       "min_total_budget_bytes_s38k": m["min_total_budget_bytes"] if m else None,
       "s111k": runs, "s38k": m_runs}
json.dump(res, open(os.path.join(out, "budget_bench.json"), "w"), indent=1)
print("S | budget | step | attn slice | forward s | x unlimited | exposed predicted s | extra measured s | LayerStream peak GiB | driver GiB | PCIe GB (K/V, residual) | hash identical")
for r in runs + m_runs:
    if "forward_seconds" not in r:
        print(r["S"], "|", r["budget"], "|", "refused" if "refused" in r else "FAILED: " + r.get("failed", "?")[:120]); continue
    unl_s = a["unlimited_forward_seconds"] if (a and r["S"] == a["S"]) else (m["unlimited_forward_seconds"] if m else 0)
    extra = r["forward_seconds"] - unl_s if unl_s else float("nan")
    print(f'{r["S"]} | {r["budget"]} | {r["step"]} | {r.get("attn_slice", "?")} | {r["forward_seconds"]:.2f} | '
          f'{r.get("x_unlimited", 0):.3f} | {r.get("predicted_exposed_transfer_seconds", float("nan")):.2f} | {extra:.2f} | '
          f'{r["device_peak_bytes"]/2**30:.3f} | {r["driver_used_bytes"]/2**30:.3f} | {r["pcie_bytes"]/1e9:.1f} '
          f'({r.get("pcie_kv_bytes", 0)/1e9:.1f}, {r.get("pcie_residual_bytes", 0)/1e9:.1f}) | {r["output_hash"]} {r["identical_to_reference"]}')
PY
