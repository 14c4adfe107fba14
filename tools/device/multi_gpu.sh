#!/usr/bin/env bash
# Issue 16 on a machine with 2, 4 or 8 GPUs (kinds nvidia-h200-x2 / -x4 / -x8), with
# binaries carried in build-bin (layerstream, bench_multi_gpu, test_ulysses_nccl, built
# with -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90: NCCL is found in the
# toolkit's or the system's folders) or built here when build-bin is absent (carry
# [".deps"]). Steps, logs under $OUT, a table last:
#   1. test_ulysses_nccl: N GPUs give one GPU's output bytes (memcmp), N = 2, 4, 8 as
#      far as the machine has GPUs, stock and sliced plans, weight streaming.
#   2. the CLI identity: `layerstream forward` of a 4-block model at S = 38,402 on 1 GPU
#      and on every GPU count, hashes compared (cuDNN attention, the CUDA default, and
#      --attention native).
#   3, 4. bench_multi_gpu: one denoiser call of the 50-block model at S = 111,274 (362
#      frames, 1024x1024, 500 text tokens, sigma 0.9) on 1, 2, 4 GPUs, unlimited and
#      under --vram-budget 8GiB per GPU (step 4): times, speed-ups, hashes ->
#      $OUT/multi_gpu_unlimited.json, $OUT/multi_gpu_8G.json.
#      Targets (issue 16): 2 GPUs >= 1.85x one GPU, 4 GPUs >= 3.5x, the same ratios
#      within 5 % under 8 GiB per GPU, every hash identical to one GPU's.
# The 50-block synthetic weights take ~66 GiB of host memory (made once per process);
# each step fits one 10-minute device call: STEP=1|2|3|4 runs one (default: all).
# Usage (device): [STEP=3] [GPUS=1,2,4] tools/device/multi_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/ls-multi-gpu-out}
mkdir -p "$OUT"
BIN=build-bin
STEP=${STEP:-all}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
if [ ! -x $BIN/layerstream ]; then
  tools/device/build.sh build-gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  mkdir -p $BIN && cp build-gpu/layerstream build-gpu/bench/bench_multi_gpu build-gpu/tests/test_ulysses_nccl $BIN/
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
ngpu=$(nvidia-smi -L | wc -l)
counts="1"
for n in 2 4 8; do [ "$n" -le "$ngpu" ] && counts="$counts,$n"; done
GPUS=${GPUS:-$(echo "$counts" | tr ',' '\n' | awk '$1<=4' | paste -sd,)}
devs() { local n=$1 s="cuda:0"; for ((i = 1; i < n; i++)); do s="$s,cuda:$i"; done; echo "$s"; }

if [ "$STEP" = all ] || [ "$STEP" = 1 ]; then
  timeout 500 $BIN/test_ulysses_nccl >"$OUT/test_ulysses_nccl.log" 2>&1
  echo "test_ulysses_nccl rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_ulysses_nccl.log" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  grep -E "Failure|differs|GPU\(s\)" "$OUT/test_ulysses_nccl.log" | cut -c1-300 | head -20
fi

if [ "$STEP" = all ] || [ "$STEP" = 2 ]; then
  mid="--random-weights --preset h3 --blocks 4 --frames 124 --width 1344 --height 768 --text-tokens 500 --sigma 0.9 -q"
  for att in auto native; do
    ref=""
    for n in $(echo "$counts" | tr ',' ' '); do
      d=$([ "$n" = 1 ] && echo "--device cuda:0" || echo "--devices $(devs "$n")")
      timeout 300 $BIN/layerstream forward $mid --attention $att $d >"$OUT/cli_${att}_$n.log" 2>&1
      rc=$?
      h=$(grep -o 'output hash [0-9a-f]*' "$OUT/cli_${att}_$n.log" | awk '{print $3}')
      [ "$n" = 1 ] && ref=$h
      same=$([ -n "$h" ] && [ "$h" = "$ref" ] && echo identical || echo DIFFERS)
      echo "cli S=38402 4 blocks attention $att, $n GPU(s): rc $rc hash $h $same; $(grep -o '[0-9.]* s on .*' "$OUT/cli_${att}_$n.log" | head -1)" | tee -a "$OUT/summary.txt"
    done
  done
fi

# Step 3: unlimited; step 4: 8 GiB per GPU (one device call each; every bench run has its
# own 1-GPU reference, so the ratios and hashes of a step stand alone).
for st in 3 4; do
  if [ "$STEP" = all ] || [ "$STEP" = $st ]; then
    b=$([ $st = 3 ] && echo unlimited || echo 8G)
    timeout 590 $BIN/bench_multi_gpu --gpus "$GPUS" --budgets $b --repeat 2 --json "$OUT/multi_gpu_$b.json" \
      >"$OUT/bench_multi_gpu_$b.log" 2>&1
    echo "bench_multi_gpu --gpus $GPUS --budgets $b rc $?" | tee -a "$OUT/summary.txt"
    grep -E "^\[|^GPUs|\|" "$OUT/bench_multi_gpu_$b.log" | cut -c1-300 | tail -30
  fi
done
