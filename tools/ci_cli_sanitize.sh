#!/usr/bin/env bash
# CLI runs under AddressSanitizer + UndefinedBehaviorSanitizer (issue 11), for CI:
#
#   tools/ci_cli_sanitize.sh [BUILD]     (BUILD: a -DLAYERSTREAM_SANITIZE=ON build folder
#                                         holding ./layerstream; default build-asan)
#
#  1. the README's first command, `layerstream generate` (stock vs sliced: identical);
#  2. the README's command list (make-model, info, forward, generate --budget) on the
#     small preset, and `cmp` of two forward files made with different slices;
#  3. malformed model files (random bytes, a header longer than the file, a valid
#     checkpoint cut short by one byte): refused with exit 1 and a message naming the
#     file, no output file;
#  4. an interrupted run: `generate` on the small preset, SIGINT once it is sampling:
#     it stops (non-zero exit) and leaves no output file, JSON report or temporary file;
#  5. injected allocation failures (LAYERSTREAM_TEST_FAIL_ALLOC=k, k = 1, 2, ... until
#     the run succeeds): each exits 1 with a message and leaves no output file.
# Any sanitizer report fails the script (the sanitizers exit with 86 / 87, and their
# reports are looked for in stderr). Runs in a scratch folder, removed at the end.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-asan}
ls_bin=$(cd "$build" && pwd)/layerstream
[ -x "$ls_bin" ] || { echo "ci_cli_sanitize: no $ls_bin (build the sanitized CLI first)" >&2; exit 2; }
export ASAN_OPTIONS=detect_leaks=1:exitcode=86
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87
work=$(mktemp -d /tmp/ls_cli_sanitize_XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

fail() {
  echo "ci_cli_sanitize: FAILED: $*" >&2
  exit 1
}
sanitizer_report() { grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$1"; }
# run NAME EXPECTED_EXIT CMD...: stdout/stderr to NAME.out / NAME.err.
run() {
  local name=$1 want=$2 t0=$SECONDS rc=0
  shift 2
  "$@" > "$name.out" 2> "$name.err" || rc=$?
  if sanitizer_report "$name.err"; then
    cat "$name.err" >&2
    fail "$name: sanitizer report"
  fi
  if [ "$rc" != "$want" ]; then
    tail -20 "$name.err" >&2
    fail "$name: exit $rc, expected $want"
  fi
  echo "-- $name: exit $rc ($((SECONDS - t0)) s)"
}
absent() { for f in "$@"; do [ ! -e "$f" ] || fail "$f exists but should not"; done; }

echo "== 1. README: layerstream generate"
run readme_generate 0 "$ls_bin" generate
grep -q "byte-compare stock vs sliced: identical" readme_generate.out || fail "stock and sliced runs differ"

echo "== 2. README command list (small preset)"
run make_model 0 "$ls_bin" make-model --preset small -o small.safetensors
run info 0 "$ls_bin" info small.safetensors --frames 362 --width 1024 --height 1024 --text-tokens 500
run forward_sliced 0 "$ls_bin" forward --model small.safetensors --frames 39 --width 512 --height 384 \
  --text-tokens 64 --sigma 0.8 --attn-chunk 512 --mlp-chunk 512 -o v.safetensors
run forward_other_slices 0 "$ls_bin" forward --model small.safetensors --frames 39 --width 512 --height 384 \
  --text-tokens 64 --sigma 0.8 --attn-chunk 97 --mlp-chunk 301 --final-chunk 64 -o v2.safetensors
cmp v.safetensors v2.safetensors || fail "forward files of two slice plans differ (README: cmp the files)"
run generate_budget 0 "$ls_bin" generate --preset small --steps 8 --budget 3M -o clip.safetensors
[ -s clip.safetensors ] || fail "generate wrote no clip"

echo "== 3. malformed model files"
head -c 4096 /dev/urandom > random.safetensors
printf '\x00\x10\x00\x00\x00\x00\x00\x00{"a":' > short_header.safetensors
head -c "$(($(stat -c %s small.safetensors) - 1))" small.safetensors > cut.safetensors
for f in random short_header cut; do
  run "info_$f" 1 "$ls_bin" info "$f.safetensors"
  grep -q "$f.safetensors" "info_$f.err" || fail "the refusal of $f.safetensors does not name the file"
  run "forward_$f" 1 "$ls_bin" forward --model "$f.safetensors" --frames 5 --width 64 --height 64 \
    --text-tokens 4 --sigma 0.5 -o "out_$f.safetensors" --json "out_$f.json"
  absent "out_$f.safetensors" "out_$f.json"
done

echo "== 4. interrupted run (SIGINT while sampling)"
mkdir interrupted
# Job control on, so the background job does not start with SIGINT ignored (what a
# non-interactive shell does to '&' jobs).
set -m
"$ls_bin" generate --preset small --steps 8 -o interrupted/clip.safetensors --json interrupted/run.json \
  > interrupted.out 2> interrupted.err &
pid=$!
set +m
for _ in $(seq 1 600); do  # up to 60 s for the first progress line
  grep -q "block passes" interrupted.err 2> /dev/null && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
grep -q "block passes" interrupted.err || { cat interrupted.err >&2; fail "generate showed no progress"; }
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
sanitizer_report interrupted.err && { cat interrupted.err >&2; fail "interrupted run: sanitizer report"; }
[ "$rc" != 0 ] && [ "$rc" != 86 ] && [ "$rc" != 87 ] || fail "interrupted run exited $rc"
[ -z "$(ls -A interrupted)" ] || { ls -la interrupted >&2; fail "the interrupted run left files"; }
echo "-- interrupted: exit $rc, no file left"

echo "== 5. injected allocation failures (every k until the run succeeds)"
tiny=(generate --preset tiny --steps 2 --frames 5 --width 64 --height 64 --text-tokens 6 --attn-chunk 11 -q)
k=1
while :; do
  [ "$k" -le 200 ] || fail "still failing after 200 injected allocation failures"
  rc=0
  LAYERSTREAM_TEST_FAIL_ALLOC=$k "$ls_bin" "${tiny[@]}" -o "fault.safetensors" --json "fault.json" \
    > fault.out 2> fault.err || rc=$?
  sanitizer_report fault.err && { cat fault.err >&2; fail "fault $k: sanitizer report"; }
  [ "$rc" = 0 ] && break
  [ "$rc" = 1 ] || { cat fault.err >&2; fail "fault $k: exit $rc, expected 1"; }
  grep -qi "memory" fault.err || { cat fault.err >&2; fail "fault $k: no out-of-memory message"; }
  absent fault.safetensors fault.json
  k=$((k + 1))
done
[ "$k" -gt 1 ] || fail "LAYERSTREAM_TEST_FAIL_ALLOC=1 did not fail the run: the CLI ignores it (cli/main.cpp)"
[ -s fault.safetensors ] || fail "the run past the last allocation wrote no file"
echo "-- allocations 1..$((k - 1)) each failed cleanly (exit 1, no file); run $k succeeded"
echo "ci_cli_sanitize: all CLI runs clean"
