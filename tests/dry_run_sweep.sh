#!/usr/bin/env bash
# The dry run's JSON for a sweep of budgets, clips, devices and attention algorithms,
# from two `layerstream` binaries, compared byte for byte: a change that must keep every
# plan (a refactor of the planner, the backend descriptions) shows it here.
#
#   tests/dry_run_sweep.sh OLD_BIN NEW_BIN [OUTDIR]     exit 0 when every case is identical
#
# Cases (785): 5 clips x 14 budgets (1G .. 80G) x {cuda --vram-budget with attention auto,
# native, hopper, cudnn at LAYERSTREAM_CUDNN_QCHUNK=1024, --no-prefetch, --keep-prefetch,
# --kv-tile 2048, --steps 8; cuda and cpu --budget (activation budget); cpu --vram-budget
# (the refusal)}, plus per clip the plain and sliced tables and the text dry run.
# Budgets below the minimum are cases too (their refusal and exit code are compared).
set -u
old=$1 new=$2 out=${3:-$(mktemp -d)}
clips=("--frames 121 --width 1280 --height 704 --text-tokens 256"
       "--frames 241 --width 1344 --height 768 --text-tokens 512"
       "--frames 33 --width 640 --height 480 --text-tokens 128"
       "--frames 361 --width 1024 --height 1024 --text-tokens 300"
       "--frames 9 --width 256 --height 256 --text-tokens 64")
sweep() {  # BIN DIR
  local bin=$1 dir=$2 ci clip b var extra f
  mkdir -p "$dir"
  for ci in "${!clips[@]}"; do
    clip=${clips[$ci]}
    for b in 1G 2G 3G 4G 6G 8G 12G 16G 24G 32G 40G 48G 64G 80G; do
      for var in auto native hopper cudnn-q1024 noprefetch keepprefetch kvtile2048 steps8; do
        case $var in
          auto) extra="" ;; native) extra="--attention native" ;; hopper) extra="--attention hopper" ;;
          cudnn-q1024) extra="--attention cudnn" ;; noprefetch) extra="--no-prefetch" ;;
          keepprefetch) extra="--keep-prefetch" ;; kvtile2048) extra="--kv-tile 2048" ;; steps8) extra="--steps 8" ;;
        esac
        f="$dir/c${ci}_cuda_${b}_${var}.json"
        if [ "$var" = cudnn-q1024 ]; then
          LAYERSTREAM_CUDNN_QCHUNK=1024 "$bin" info --preset h3 $clip --device cuda --vram-budget $b $extra --json >"$f" 2>&1
        else
          "$bin" info --preset h3 $clip --device cuda --vram-budget $b $extra --json >"$f" 2>&1
        fi
        echo "rc=$?" >>"$f"
      done
      f="$dir/c${ci}_cpu_${b}_budget.json"; "$bin" info --preset h3 $clip --device cpu --budget $b --json >"$f" 2>&1; echo "rc=$?" >>"$f"
      f="$dir/c${ci}_cpu_${b}_vram.json"; "$bin" info --preset h3 $clip --device cpu --vram-budget $b --json >"$f" 2>&1; echo "rc=$?" >>"$f"
      f="$dir/c${ci}_cuda_${b}_act.json"; "$bin" info --preset h3 $clip --device cuda --budget $b --json >"$f" 2>&1; echo "rc=$?" >>"$f"
    done
    f="$dir/c${ci}_plain.json"; "$bin" info --preset h3 $clip --json >"$f" 2>&1; echo "rc=$?" >>"$f"
    f="$dir/c${ci}_slices.json"; "$bin" info --preset h3 $clip --slice-tokens 4096 --json >"$f" 2>&1; echo "rc=$?" >>"$f"
    f="$dir/c${ci}_text.txt"; "$bin" info --preset h3 $clip --vram-budget 8G >"$f" 2>&1; echo "rc=$?" >>"$f"
  done
}
sweep "$old" "$out/old"
sweep "$new" "$out/new"
n=$(ls "$out/old" | wc -l)
if diff -r "$out/old" "$out/new" >"$out/diff.txt"; then
  echo "identical: $n cases ($out)"
else
  echo "DIFFERENT: $(grep -c '^diff' "$out/diff.txt") of $n cases differ ($out/diff.txt)"
  exit 1
fi
