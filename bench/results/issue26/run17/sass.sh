#!/usr/bin/env bash
# Session 19, device call: the SASS of main's Hopper int8 kernel (the build's flags, nvcc on the
# device) with every local-memory access listed with its neighbours; the device has cuobjdump.
set -uo pipefail
OUT=${OUT:-/tmp/out}; export PATH=/usr/local/cuda/bin:$PATH
nvcc -cubin -I src -DLAYERSTREAM_HOPPER_ATTENTION=1 -O3 -DNDEBUG --expt-relaxed-constexpr -fmad=false \
  -gencode=arch=compute_90a,code=sm_90a -std=c++20 ${SRC:-src/backend/cuda/attention_hopper_int8.cu} -o /tmp/h8.cubin || exit 1
cuobjdump -sass /tmp/h8.cubin > /tmp/sass.txt; echo "cuobjdump rc $? ($(wc -l < /tmp/sass.txt) lines)"
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
        if re.search(r'\b(LDL|STL)', l):
            print('----')
            for k in range(max(0, i - 4), min(len(ins), i + 4)): print(('>> ' if k == i else '   ') + ins[k].strip()[:120])
PY
head -2 "$OUT/spills.txt"; gzip -c /tmp/sass.txt > "$OUT/sass_main.txt.gz"
