#!/usr/bin/env bash
# Session 12, helper opt2's variants of the Hopper INT8 kernel (one device call, kind
# nvidia-h200, carry [".deps"], from the repository root with branch s12-opt2 merged):
#   OUT=... bash bench/results/issue26/run10/variants.sh        (V=0,1,... to pick variants)
# 1. builds test_attention_int8_cuda and bench_int8_kernels in build-gpu
#    (tools/device/int8_attention.sh's configure line; a build of main there is reused);
# 2. the XU probe: a 30-line kernel timing I2FP.F32.S32 alone, MUFU.EX2 alone and both
#    interleaved (shared pipe: "both" runs at about half the elements per clock of the slower
#    alone; separate pipes: about the slower alone's rate): tests the hypothesis that float(d),
#    float(ot) and ex2 share the 16-per-clock XU pipe;
# 3. per variant (LAYERSTREAM_HOPPER8_VARIANT, the bits of kVar in attention_hopper_int8.cu:
#    1 float(d) by the 1.5 2^23 trick, 2 float(ot) by it, 4 the trick on odd accumulators only,
#    8 key scales by LDS.128 from a repack by producer warp 1, 16 one exp2e per row and block)
#    the CUDA = CPU byte tests (test_attention_int8_cuda, must pass);
# 4. bench_int8_kernels at S = 111,274, --reps 3, every variant timed side by side and each
#    compared with the portable kernel at full size ("0 of N differ" required); only the
#    variants that passed their test;
# 5. a table last and the best variant that passed its test and differed nowhere.
# ~200-300 s of device time (the build of attention_hopper_int8.cu, 10 kernels, ~60-90 s).
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=build-gpu; t0=$(date +%s); V=${V:-0,1,3,7,8,16,17,24,25}; S=${S:-111274}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAYERSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLAYERSTREAM_EXTRA_INCLUDE="$PWD/.deps/include" -DLAYERSTREAM_GTEST_SOURCE="$PWD/.deps/googletest" >"$OUT/cfg.log" 2>&1
cmake --build "$B" -j16 --target test_attention_int8_cuda bench_int8_kernels >"$OUT/build.log" 2>&1; rc=$?
echo "build rc $rc after $(el) s"
if [ $rc -ne 0 ]; then grep -E "error" "$OUT/build.log" | head -30; exit 1; fi

# ---- the XU probe ----
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cat >"$OUT/xu_probe.cu" <<'EOF'
// I2FP.F32.S32 (+ LOP3) alone, MUFU.EX2 (+ FMUL) alone, both interleaved: elements per SM per clock.
#include <cstdio>
__global__ void k(int mode, int iters, float* out) {
  int a[8]; float y[8];
  for (int i = 0; i < 8; ++i) { a[i] = threadIdx.x + i; y[i] = 0.001f * (threadIdx.x + i); }
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (mode != 1) a[i] = __float_as_int(__int2float_rn(a[i] & 0xFFFFF)) ^ it;
      if (mode != 0) { float e; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(y[i])); y[i] = e * 0.5f; }
    }
  }
  float s = 0; for (int i = 0; i < 8; ++i) s += y[i] + a[i];
  if (s == 12345.f) out[0] = s;
}
int main() {
  int sms, khz; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  float* o; cudaMalloc(&o, 4); cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int iters = 4096, blocks = sms * 4, threads = 512;
  const char* name[3] = {"I2FP alone", "MUFU.EX2 alone", "both interleaved"};
  for (int mode = 0; mode < 3; ++mode) {
    k<<<blocks, threads>>>(mode, 16, o);
    cudaEventRecord(e0); k<<<blocks, threads>>>(mode, iters, o); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    const double n = double(blocks) * threads * iters * 8;
    printf("xu probe: %-17s %8.3f ms  %6.2f elements per SM per clock (%d MHz, %d SMs)\n", name[mode], ms,
           n / (ms * 1e-3) / sms / (khz * 1e3), khz / 1000, sms);
  }
  return 0;
}
EOF
if "$NVCC" -O3 -arch=sm_90a -o /tmp/xu_probe "$OUT/xu_probe.cu" >"$OUT/xu_probe_build.log" 2>&1; then
  timeout 30 /tmp/xu_probe | tee "$OUT/xu_probe.log"
else
  echo "xu probe: build failed"; head -5 "$OUT/xu_probe_build.log"
fi

# ---- the byte tests per variant ----
TI=$(find "$B" -name test_attention_int8_cuda -type f | head -1)
pass=" "
for v in ${V//,/ }; do
  LAYERSTREAM_HOPPER8_VARIANT=$v timeout 60 "$TI" >"$OUT/test_int8_v$v.log" 2>&1; r=$?
  echo "variant $v: test_attention_int8_cuda rc $r $(grep -E '^\[  PASSED|FAILED  \]' "$OUT/test_int8_v$v.log" | head -3 | tr '\n' ' ') ($(el) s)"
  [ $r -eq 0 ] && pass="$pass$v "
done
grep -h "\[ info \]" "$OUT/test_int8_v0.log" 2>/dev/null | head -3

# ---- the rates, side by side (only the variants that passed: a hang would lose them all) ----
VB=$(echo $pass | tr ' ' ',')
[ -z "$VB" ] && { echo "no variant passed"; exit 1; }
timeout 240 "$B"/bench/bench_int8_kernels --s "$S" --reps 3 --hopper-variants "$VB" --out "$OUT/bench_int8_kernels.json" \
  >"$OUT/bench_int8_kernels.log" 2>&1
echo "bench rc $? ($(el) s)"; cat "$OUT/bench_int8_kernels.log"

# ---- the table (rate = the number before "TOP/s" on the variant's row; differ = the number
# after "portable:" on its comparison line) ----
echo
echo "| variant | test | TOP/s median | TOP/s best | outputs differing from portable |"
echo "|---|---|---|---|---|"
best=""; bestr=0
for v in ${V//,/ }; do
  L="$OUT/bench_int8_kernels.log"
  r=$(awk -v n="int8_hopper_v$v" '$1 == n {for (i = 2; i <= NF; i++) if ($i == "TOP/s") {print $(i - 1); exit}}' "$L")
  rb=$(awk -v n="int8_hopper_v$v" '$1 == n {for (i = 2; i <= NF; i++) if ($i == "(best)") {print $(i - 1); exit}}' "$L")
  d=$(awk -v v="$v" '$1 == "int8" && $2 == "hopper" && $3 == "variant" && $4 == v {for (i = 5; i <= NF; i++) if ($i == "portable:") {print $(i + 1); exit}}' "$L")
  t=fail; case "$pass" in *" $v "*) t=pass ;; esac
  echo "| $v | $t | ${r:--} | ${rb:--} | ${d:--} |"
  if [ "$t" = pass ] && [ "$d" = 0 ] && [ -n "$r" ] && awk -v a="$r" -v b="$bestr" 'BEGIN { exit !(a > b) }'; then
    best=$v; bestr=$r
  fi
done
echo "BEST variant: ${best:-none} (${bestr} TOP/s median; test passed, 0 outputs differ)"
echo "total $(el) s"
