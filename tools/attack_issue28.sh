#!/usr/bin/env bash
# Issue 28's attack classes, re-run in a bounded way against one `layerstream` binary,
# for the before/after table of docs/hardening.md:
#
#   tools/attack_issue28.sh LAYERSTREAM [KILLS]      (KILLS: random kills, default 100)
#
# Each class prints one line "class | attempts | what happened". Nothing here needs a
# GPU; it runs in a scratch folder (removed at the end), about a minute on 2 cores.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kills=${2:-100}
work=$(mktemp -d /tmp/ls_attack_XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin" && ln -s "$(readlink -f "$1")" "$work/bin/layerstream"  # ci_interrupts.sh wants BUILD/layerstream
ls_bin=$work/bin/layerstream
cd "$work"
row() { printf '%-34s | %s\n' "$1" "$2"; }
clip=(--frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.5 -q)

# A safetensors file: tensors "name:dtype:d0xd1x..." (values 0.25 for floats), metadata KEY=VALUE.
mkst() {
  python3 - "$@" <<'PY'
import json, struct, sys
out, specs = sys.argv[1], sys.argv[2:]
size = {"F32": 4, "BF16": 2}
header, blobs, off, meta = {}, [], 0, {}
for s in specs:
    if "=" in s:
        k, v = s.split("=", 1); meta[k] = v; continue
    name, dt, shape = s.rsplit(":", 2)
    dims = [int(x) for x in shape.split("x")] if shape else []
    n = 1
    for d in dims: n *= d
    b = (struct.pack("<f", 0.25) if dt == "F32" else b"\x80\x3e") * n
    header[name] = {"dtype": dt, "shape": dims, "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
if meta: header["__metadata__"] = meta
h = json.dumps(header).encode(); h += b" " * ((8 - len(h) % 8) % 8)
open(out, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
}
# Sets config.transformer in a checkpoint's metadata (the tensors unchanged).
set_override() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
src, dst, override = sys.argv[1:4]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
hdr.setdefault("__metadata__", {})["config.transformer"] = override
h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}
# Writes NaN (or +inf) into the first element of a tensor, in place.
poke() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
path, name, what = sys.argv[1:4]
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
e = json.loads(raw[8:8 + n])[name]
at = 8 + n + e["data_offsets"][0]
val = {"F32": {"nan": b"\x00\x00\xc0\x7f", "inf": b"\x00\x00\x80\x7f"},
       "BF16": {"nan": b"\xc0\x7f", "inf": b"\x80\x7f"}, "F16": {"nan": b"\x00\x7e", "inf": b"\x00\x7c"}}[e["dtype"]][what]
raw[at:at + len(val)] = val
open(path, "wb").write(raw)
PY
}
"$ls_bin" make-model --preset tiny -q -o tiny.safetensors > /dev/null 2>&1

# 1. an output replacing an input
replaced=0; tries=0
sum0=$(md5sum < tiny.safetensors)
ln -sf tiny.safetensors link.safetensors
for outflag in "-o tiny.safetensors" "--json tiny.safetensors" "--memory-plot tiny.safetensors" "-o link.safetensors" "--json link.safetensors"; do
  tries=$((tries + 1))
  "$ls_bin" forward --model tiny.safetensors "${clip[@]}" $outflag > /dev/null 2>&1
  [ "$(md5sum < tiny.safetensors)" = "$sum0" ] || { replaced=$((replaced + 1)); "$ls_bin" make-model --preset tiny -q -o tiny.safetensors > /dev/null 2>&1; }
done
mkst lora.safetensors "diffusion_model.blocks.0.attn.qkv_proj.lora_up.weight:F32:384x2" \
  "diffusion_model.blocks.0.attn.qkv_proj.lora_down.weight:F32:2x128"
cp tiny.safetensors keep.safetensors
for target in tiny.safetensors lora.safetensors; do
  tries=$((tries + 1))
  s0=$(md5sum < $target)
  "$ls_bin" merge-lora --model tiny.safetensors --lora lora.safetensors -o $target > /dev/null 2>&1
  [ "$(md5sum < $target)" = "$s0" ] || replaced=$((replaced + 1))
  cp keep.safetensors tiny.safetensors
done
row "1 output replaces an input" "$tries attempts: $replaced inputs replaced"

# 2. > 4-D tensors in the CLI's input files
mkst five.safetensors video:F32:1x1x1x1x1 audio:F32:1x1x1x1x1 text:F32:1x1x1x1x1 negative:F32:1x1x1x1x1 \
  video_mask:F32:1x1x1x1x1 audio_mask:F32:1x1x1x1x1
mkst neg5.safetensors text:F32:4x96 negative:F32:1x1x4x96x1
aborts=0; tries=0
for a in "forward --preset tiny ${clip[*]} --inputs five.safetensors" "forward --preset tiny ${clip[*]} --mask five.safetensors" \
         "forward --preset tiny ${clip[*]} --keyframe five.safetensors" \
         "generate --preset tiny --steps 1 --frames 5 --width 64 --height 64 -q -o g.safetensors --text five.safetensors" \
         "generate --preset tiny --steps 1 --frames 5 --width 64 --height 64 -q -o g.safetensors --cfg 2 --text neg5.safetensors"; do
  tries=$((tries + 1))
  "$ls_bin" $a > /dev/null 2>&1; rc=$?
  [ $rc -ge 128 ] && aborts=$((aborts + 1))
done
row "2 5-D tensors in input files" "$tries attempts: $aborts crashes (signal)"

# 3. the model truncated during a run
"$ls_bin" make-model --preset small -q -o small.safetensors > /dev/null 2>&1
crashes=0; named=0; tries=0
for delay in 0.3 0.6 1.0; do
  tries=$((tries + 1))
  cp small.safetensors victim.safetensors
  "$ls_bin" forward --model victim.safetensors --frames 39 --width 256 --height 256 --text-tokens 16 --sigma 0.5 -q \
    > trunc.out 2> trunc.err &
  pid=$!
  sleep $delay
  truncate -s 4096 victim.safetensors
  wait $pid; rc=$?
  [ $rc -ge 128 ] && crashes=$((crashes + 1))
  [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q victim.safetensors trunc.err && named=$((named + 1))
done
row "3 model truncated during a run" "$tries runs: $crashes killed by a signal, $named errors naming the file"

# 4. non-finite values in quantised checkpoints and LoRAs
silent=0; tries=0
for fmt in int8-convrot fp8; do
  for t in blocks.0.attn.q_norm.weight rope.inv_freq blocks.0.attn.qkv_proj.weight_scale; do
    tries=$((tries + 1))
    "$ls_bin" make-model --preset tiny --format $fmt -q -o q.safetensors > /dev/null 2>&1
    poke q.safetensors $t nan
    "$ls_bin" forward --model q.safetensors "${clip[@]}" > /dev/null 2>&1 && silent=$((silent + 1))
  done
done
for bad in up alpha; do
  tries=$((tries + 1))
  mkst l2.safetensors "diffusion_model.blocks.0.attn.qkv_proj.lora_up.weight:F32:384x2" \
    "diffusion_model.blocks.0.attn.qkv_proj.lora_down.weight:F32:2x128" "diffusion_model.blocks.0.attn.qkv_proj.alpha:F32:"
  [ $bad = up ] && poke l2.safetensors diffusion_model.blocks.0.attn.qkv_proj.lora_up.weight nan
  [ $bad = alpha ] && poke l2.safetensors diffusion_model.blocks.0.attn.qkv_proj.alpha nan
  "$ls_bin" make-model --preset tiny --format int8-convrot -q -o q.safetensors > /dev/null 2>&1
  "$ls_bin" forward --model q.safetensors --lora l2.safetensors "${clip[@]}" > /dev/null 2>&1 && silent=$((silent + 1))
done
row "4 non-finite, quantised / LoRA" "$tries files: $silent accepted silently (exit 0)"

# 5. signals during forward's writes
out=$(LS_INTERRUPTS_KEEP_GOING=1 bash "$here/ci_interrupts.sh" "$work/bin" "$kills" 2>&1 | tail -1)
row "5 SIGTERM / SIGINT, random kills" "${out#ci_interrupts: }"

# 7. metadata overrides
accepted=0; crashes=0; tries=0
for ov in '{"latents_dim": 9223372036854775807}' '{"num_layers": 2147483647}' '{"num_layers": 1}'; do
  tries=$((tries + 1))
  set_override tiny.safetensors ov.safetensors "$ov"
  ( ulimit -v 8000000; "$ls_bin" forward --model ov.safetensors "${clip[@]}" > /dev/null 2> ov.err ); rc=$?
  [ $rc -eq 0 ] && accepted=$((accepted + 1))
  [ $rc -ge 128 ] && crashes=$((crashes + 1))
  grep -q "runtime error" ov.err && crashes=$((crashes + 1))
done
row "7 metadata config overrides" "$tries files: $accepted run (exit 0), $crashes crashes"

# 8. raw bytes at the terminal
mkst esc.safetensors $'diffusion_model.\e]0;pwned\a\e[2J.lora_up.weight:F32:2x2'
"$ls_bin" forward --preset tiny "${clip[@]}" --lora esc.safetensors > esc.out 2>&1
raw=$(grep -c $'\e' esc.out)
row "8 escape bytes in messages" "1 LoRA key: $raw lines with a raw ESC"

# 9. an absurd clip
t0=$(date +%s%N)
( ulimit -v 16000000; "$ls_bin" info --preset h3 --frames 20000 --width 8192 --height 8192 --text-tokens 500 \
    --vram-budget 80G > /dev/null 2>&1 ); rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
row "9 absurd clip (info --vram-budget)" "exit $rc after $ms ms"
