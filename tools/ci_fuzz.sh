#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang + ASan + UBSan) and runs each for a bounded
# time on its seed corpus (fuzz/corpus/<target>/), splitting the budget between them.
#
#   tools/ci_fuzz.sh [seconds]      (default 60, in total over every target)
#
# Environment: LS_FUZZ_BUILD (build folder, default build-fuzz), LS_FUZZ_JOBS (build
# jobs, default 2), CC / CXX (default clang-14 / clang++-14, else clang / clang++).
# Prints one summary line per target (runs, coverage, corpus size) and exits non-zero
# when a target crashes, leaks, times out or hits UB; the input that did it is kept
# under <build>/fuzz-artifacts/ and named in the output. New inputs found during the
# run go to a scratch folder, never into the committed corpus.
set -euo pipefail

total=${1:-60}
if ! [[ "$total" =~ ^[0-9]+$ ]] || [ "$total" -lt 1 ]; then
  echo "usage: $0 [seconds]   (a positive whole number of seconds; got '$total')" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LS_FUZZ_BUILD:-$root/build-fuzz}
jobs=${LS_FUZZ_JOBS:-2}
pick() { for c in "$@"; do if command -v "$c" > /dev/null 2>&1; then echo "$c"; return; fi; done; }
cc=${CC:-$(pick clang-14 clang)}
cxx=${CXX:-$(pick clang++-14 clang++)}
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "ci_fuzz: no clang found (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi

targets=(fuzz_safetensors fuzz_h3_detect fuzz_cli_inputs)
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLAYERSTREAM_FUZZ=ON -DLAYERSTREAM_TESTS=OFF -DLAYERSTREAM_BENCH=OFF \
  > "$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 2; }
cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$build/build.log" 2>&1 ||
  { tail -50 "$build/build.log" >&2; echo "ci_fuzz: build failed" >&2; exit 2; }

per=$(( total / ${#targets[@]} ))
[ "$per" -ge 1 ] || per=1
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  log="$build/$t.log"
  rc=0
  # First folder: where new inputs go (scratch); second: the committed seeds (read only).
  "$build/fuzz/$t" -max_total_time="$per" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/$t-" "$scratch/$t" "$root/fuzz/corpus/$t" > "$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [ -n "$runs" ] || runs=$(sed -n 's/^#\([0-9]*\).*\(DONE\|pulse\|NEW\|REDUCE\|INITED\).*/\1/p' "$log" | tail -1)
  last=$(grep -aE '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<< "$last")
  rate=$(sed -n 's/.* exec\/s: \([0-9]*\).*/\1/p' <<< "$last")
  if [ "$rc" -eq 0 ]; then
    echo "ci_fuzz: $t: ${runs:-?} runs in ${per} s (${rate:-?} exec/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}: no crash"
  else
    failed=1
    echo "ci_fuzz: $t: FAILED (exit $rc) after ${runs:-?} runs; log $log; last lines:"
    grep -aE 'ERROR|SUMMARY|runtime error|fuzz_[a-z0-9_]+:|Test unit written|artifact' "$log" | tail -15 | sed 's/^/  /' || true
    tail -5 "$log" | sed 's/^/  /'
  fi
done
exit "$failed"
