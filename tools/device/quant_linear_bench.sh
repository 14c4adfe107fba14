#!/usr/bin/env bash
# Issue 14's benchmark in one device call (kind nvidia-h200, < 9 min of device time), with
# binaries built elsewhere (carry ["build-bin"]: layerstream and bench_linear_quant from a
# -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLAYERSTREAM_BENCH=ON build, stripped)
# or built here when build-bin is absent (carry [".deps"]; tools/device/build.sh).
#
# S = 111,274 (362 frames, 1024x1024, 500 text tokens, sigma 0.9), synthetic weights
# (--random-weights: generated on the host CPU per run, about 20-40 s for 50 blocks on 16
# cores; a file per format would not fit the disk for bf16, 66 GB):
#   1. bench_linear_quant: the four linears at M = 8192 (S walked in slices), bf16 / int8 /
#      fp8, whole op, GEMM alone and the stages around it (quantise, epilogue)
#   2. one block side by side: bf16, int8-convrot, fp8 checkpoint, --precision fp8
#   3. the 50-block forward at S = 111,274 inside --vram-budget 24GiB: int8-convrot (the
#      target: all resident, no streaming), fp8 checkpoint, bf16 (streamed), --precision
#      fp8: forward time, device peak, residency, PCIe weight bytes
#   4. drift of --precision fp8 (and of the int8 / fp8 checkpoints) against bf16: relative
#      L2 of the velocities at sigmas 0.9, 0.5, 0.1 (4 blocks at H3 width, 39 frames
#      512x384, 64 text tokens: as .dev/s5run3.sh, which used 2 blocks)
# Each step runs only while the time left (LIMIT seconds, default 530) covers its estimate;
# a skipped step says so in the JSON. Everything lands in $OUT/quant_bench.json (+ logs).
# Usage (device): tools/device/quant_linear_bench.sh
set -uo pipefail
OUT=${OUT:-/tmp/ls-quant-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
LIMIT=${LIMIT:-530}
BIN=build-bin
T0=$SECONDS
if [ ! -x $BIN/layerstream ] || [ ! -x $BIN/bench_linear_quant ]; then
  tools/device/build.sh build-gpu -DLAYERSTREAM_BENCH=ON >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  mkdir -p $BIN && cp build-gpu/layerstream build-gpu/bench/bench_linear_quant $BIN/
fi
L=$BIN/layerstream
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/summary.txt"
left() { echo $((LIMIT - (SECONDS - T0))); }
# run_step NAME ESTIMATE_S TIMEOUT_S CMD...: runs CMD when `left` >= ESTIMATE_S, else records a skip.
run_step() {
  local name=$1 est=$2 to=$3
  shift 3
  if [ "$(left)" -lt "$est" ]; then
    echo "$name skipped ($(left) s left, needs ~$est s)" | tee -a "$OUT/summary.txt"
    echo "{\"skipped\": true, \"seconds_left\": $(left)}" >"$OUT/$name.skipped.json"
    return
  fi
  local s=$SECONDS
  timeout "$to" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc $rc ($((SECONDS - s)) s, $(left) s left)" | tee -a "$OUT/summary.txt"
  grep -E "error|status|s on cuda|hash" "$OUT/$name.log" | tail -3
}

BIG="--random-weights --preset h3 --frames 362 --width 1024 --height 1024 --text-tokens 500 --sigma 0.9 --device cuda -q"
run_step linear_quant 60 120 $BIN/bench_linear_quant --M 8192 --S 111274 --iters 3 --warmup 1 --json "$OUT/linear_quant.json"
for f in bf16 int8 fp8 precfp8; do
  case $f in
    bf16) a="" ;; int8) a="--format int8-convrot" ;; fp8) a="--format fp8" ;; precfp8) a="--precision fp8" ;;
  esac
  run_step block1_$f 25 90 $L forward $BIG --blocks 1 $a --json "$OUT/block1_$f.json"
done
# 50 blocks, most important first.
for f in int8 fp8 bf16 precfp8; do
  case $f in
    bf16) a="" ;; int8) a="--format int8-convrot" ;; fp8) a="--format fp8" ;; precfp8) a="--precision fp8" ;;
  esac
  run_step blocks50_$f 100 200 $L forward $BIG --vram-budget 24G $a --json "$OUT/blocks50_$f.json"
done
# Drift last (cheap): bf16 and --precision fp8 at the three sigmas, then the checkpoints.
SM="--random-weights --preset h3 --blocks 4 --frames 39 --width 512 --height 384 --text-tokens 64 --device cuda -q"
s=$SECONDS
for f in bf16 precfp8 int8 fp8; do
  case $f in
    bf16) a="" ;; int8) a="--format int8-convrot" ;; fp8) a="--format fp8" ;; precfp8) a="--precision fp8" ;;
  esac
  for sg in 0.9 0.5 0.1; do
    if [ "$(left)" -lt 15 ]; then echo "drift $f sigma $sg skipped" | tee -a "$OUT/summary.txt"; continue; fi
    timeout 40 $L forward $SM --sigma $sg $a -o "$OUT/d_${f}_$sg.st" >>"$OUT/drift.log" 2>&1
  done
done
echo "drift runs ($((SECONDS - s)) s, $(left) s left)" | tee -a "$OUT/summary.txt"

python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, os, sys
o = sys.argv[1]
def load(n):
    p = os.path.join(o, n)
    if os.path.exists(p):
        try:
            return json.load(open(p))
        except Exception as e:
            return {"error": str(e)}
    if os.path.exists(os.path.join(o, n.replace(".json", ".skipped.json"))):
        return {"skipped": True}
    return None
def run(j):
    if not j or "wall_seconds" not in j:
        return j
    return {k: j.get(k) for k in ("wall_seconds", "device_peak_bytes", "predicted_peak_bytes", "measured_peak_bytes",
                                  "resident_blocks", "streamed_blocks", "slots", "pcie_weight_bytes", "device_weight_bytes",
                                  "attn_slice", "mlp_slice", "output_hash", "weights")}
res = {"command": "tools/device/quant_linear_bench.sh (kind nvidia-h200)", "S": 111274}
lq = load("linear_quant.json")
res["linear_quant"] = lq
def add_x_bf16(runs):  # each format's wall time over bf16's, where both ran
    b = runs.get("bf16") or {}
    for f in ("int8", "fp8", "precfp8"):
        r = runs.get(f) or {}
        if "wall_seconds" in r and "wall_seconds" in b:
            r["x_bf16"] = r["wall_seconds"] / b["wall_seconds"]
res["block1"] = {f: run(load(f"block1_{f}.json")) for f in ("bf16", "int8", "fp8", "precfp8")}
add_x_bf16(res["block1"])
res["blocks50_vram_budget_24GiB"] = {f: run(load(f"blocks50_{f}.json")) for f in ("int8", "fp8", "bf16", "precfp8")}
add_x_bf16(res["blocks50_vram_budget_24GiB"])
def load_st(path):  # safetensors, f32 tensors only (the velocities), no packages needed
    import array, struct
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        head = json.loads(fh.read(n))
        data = fh.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        a, b = v["data_offsets"]
        t = array.array("f")
        t.frombytes(data[a:b])
        out[k] = t
    return out
def rel_l2(x, y):
    num = sum((float(a) - float(b)) ** 2 for a, b in zip(x, y))
    den = sum(float(a) ** 2 for a in x)
    return (num / den) ** 0.5 if den > 0 else float("nan")
drift = {}
try:
    for s in ("0.9", "0.5", "0.1"):
        p = f"{o}/d_bf16_{s}.st"
        if not os.path.exists(p):
            continue
        ref = load_st(p)
        row = {}
        for k in ("precfp8", "int8", "fp8"):
            q = f"{o}/d_{k}_{s}.st"
            if not os.path.exists(q):
                continue
            t = load_st(q)
            for name in ("video", "audio"):
                if name in ref and name in t:
                    row[f"{k}.{name}"] = rel_l2(ref[name], t[name])
        drift[f"sigma {s}"] = row
except Exception as e:
    drift["error"] = repr(e)
res["drift_rel_l2_vs_bf16 (4 blocks, 39 frames 512x384, 64 text tokens)"] = drift
json.dump(res, open(f"{o}/quant_bench.json", "w"), indent=2)
def gib(v):
    return f"{v / 2**30:.2f} GiB" if isinstance(v, (int, float)) else "?"
for part in ("block1", "blocks50_vram_budget_24GiB"):
    for f, r in res[part].items():
        if r and "wall_seconds" in r:
            print(f"{part:28s} {f:8s} {r['wall_seconds']:8.3f} s  x_bf16 {r.get('x_bf16', 1.0):.3f}  peak {gib(r['device_peak_bytes'])}"
                  f"  resident {r['resident_blocks']} streamed {r['streamed_blocks']}  pcie weights {gib(r['pcie_weight_bytes'])}")
        else:
            print(f"{part:28s} {f:8s} {r}")
for s, row in drift.items():
    print(s, "  ".join(f"{k} {v:.3e}" for k, v in row.items()) if isinstance(row, dict) else row)
PY
rm -f "$OUT"/d_*.st
echo "total $((SECONDS - T0)) s" | tee -a "$OUT/summary.txt"
