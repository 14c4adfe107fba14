#!/usr/bin/env bash
# Session 19, device call 4 (carry [".deps", ".stage"]; .stage = Comfy Kitchen staged by
# tools/device/comfyui_node_stage.sh, untracked): main's Hopper int8 kernel and Comfy Kitchen's
# own INT8 attention side by side at S = 111,274, 56 x 128 (ours, Kitchen, ours), then the SASS
# of main's kernel (cuobjdump) with every local-memory access (spill) of the consumer code
# listed with its neighbours. Writes at most 8 files to $OUT.
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
O=$(find build-m -name 'attention_hopper_int8.cu.o' | head -1)
cuobjdump -sass "$O" > /tmp/sass.txt 2>/tmp/cuobjdump.err; echo "cuobjdump rc $? ($(wc -l < /tmp/sass.txt) lines)"
python3 - <<'PY' > "$OUT/spills.txt"
import re
lines = open('/tmp/sass.txt').read().split('\n')
fn, cur = {}, None
for l in lines:
    m = re.match(r'\s*Function : (\S+)', l)
    if m: cur = m.group(1); fn[cur] = []; continue
    if cur: fn[cur].append(l)
for name, body in fn.items():
    if 'int8_attention_kernelILb0E' not in name: continue
    ins = [l for l in body if re.search(r'/\*[0-9a-f]{4}\*/', l)]
    print(name, len(ins), 'instructions;', sum('LDL' in l for l in ins), 'LDL,', sum('STL' in l for l in ins), 'STL')
    for i, l in enumerate(ins):
        if re.search(r'\b(LDL|STL)\b', l):
            print('----')
            for k in range(max(0, i - 3), min(len(ins), i + 3)): print(('>> ' if k == i else '   ') + ins[k].strip()[:110])
PY
head -3 "$OUT/spills.txt"; gzip -c /tmp/sass.txt > "$OUT/sass_main.txt.gz"
echo "total $(( $(date +%s) - t0 )) s"
