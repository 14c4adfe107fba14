#!/usr/bin/env bash
# Random kills of `forward` (issue 28, item 5): N runs, each sent SIGTERM or SIGINT at a
# random moment (most near the end of the run, where the outputs are written), then:
#   - no temporary file (".tmp-") is left in the output folder;
#   - `-o` and `--json` are from one run: the report's output_hash is the FNV-1a 64 of
#     the -o file's velocities (video bytes, then audio bytes), whichever run wrote them;
#   - the exit code is 0 (the run finished first) or 128 + the signal.
#
#   tools/ci_interrupts.sh [BUILD] [N]     (BUILD holds ./layerstream, default build; N 100)
#
# Prints one summary line (runs ended by the signal before / while writing, runs that
# finished first) and exits non-zero on the first violation, naming it.
# LS_INTERRUPTS_KEEP_GOING=1: count the violations instead (temporary files left, runs
# whose -o and --json differ), clean up after each and go on (tools/attack_issue28.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
n=${2:-100}
ls_bin=$(cd "$build" && pwd)/layerstream
[ -x "$ls_bin" ] || { echo "ci_interrupts: no $ls_bin" >&2; exit 2; }
command -v python3 > /dev/null || { echo "ci_interrupts: needs python3 (the consistency check)" >&2; exit 2; }
work=$(mktemp -d /tmp/ls_interrupts_XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir out
args=(forward --preset tiny --frames 22 --width 128 --height 128 --text-tokens 16 -q --sigma 0.5
      -o out/v.safetensors --json out/r.json --memory-plot out/m.svg)

check() {  # the files in out/ are one run's
  python3 - "$@" <<'PY'
import json, struct, sys
def fnv(b, h=0xcbf29ce484222325):
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
raw = open("out/v.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = raw[8 + n:]
def t(name):
    b, e = hdr[name]["data_offsets"]
    return data[b:e]
h = fnv(t("audio"), fnv(t("video")))
rep = json.load(open("out/r.json"))
if "%016x" % h != rep["output_hash"]:
    sys.exit("-o (hash %016x) and --json (output_hash %s) are from different runs" % (h, rep["output_hash"]))
PY
}

t0=$(date +%s%N)
"$ls_bin" "${args[@]}" --seed 0 > first.out 2>&1 || { cat first.out >&2; exit 1; }
dur_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check
before=0 during=0 finished=0 orphans=0 mixed=0 keep_going=${LS_INTERRUPTS_KEEP_GOING:-0}
for i in $(seq 1 "$n"); do
  sig=TERM
  [ $((i % 2)) = 0 ] && sig=INT
  # 3 runs in 4 near the end (the writes), 1 in 4 anywhere.
  if [ $((RANDOM % 4)) = 0 ]; then delay=$((RANDOM % (dur_ms + 1))); else
    delay=$(( dur_ms * 80 / 100 + RANDOM % (dur_ms * 40 / 100 + 1) )); fi
  set -m
  "$ls_bin" "${args[@]}" --seed "$i" > run.out 2>&1 &
  pid=$!
  set +m
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  kill -"$sig" "$pid" 2> /dev/null || true
  rc=0
  wait "$pid" || rc=$?
  left=$(ls -A out | grep -c '\.tmp-' || true)
  if [ "$left" != 0 ]; then
    if [ "$keep_going" = 1 ]; then orphans=$((orphans + left)); rm -f out/*.tmp-*; else
      ls -la out >&2; echo "ci_interrupts: run $i (SIG$sig after $delay ms, exit $rc) left temporary files" >&2; exit 1; fi
  fi
  if ! check 2> check.err; then
    if [ "$keep_going" = 1 ]; then mixed=$((mixed + 1)); "$ls_bin" "${args[@]}" --seed 0 > /dev/null 2>&1 || true; else
      cat check.err >&2; echo "ci_interrupts: run $i (SIG$sig after $delay ms, exit $rc)" >&2; exit 1; fi
  fi
  case $rc in
    0) finished=$((finished + 1)) ;;
    130|143)
      if grep -q "while writing\|while publishing" run.out; then during=$((during + 1)); else before=$((before + 1)); fi ;;
    *)
      # Killed by the signal itself (the default action: 128 + N seen as a signal death).
      if [ "$keep_going" = 1 ]; then before=$((before + 1)); else
        cat run.out >&2; echo "ci_interrupts: run $i exited $rc after SIG$sig" >&2; exit 1; fi ;;
  esac
done
if [ "$keep_going" = 1 ]; then
  echo "ci_interrupts: $n kills: $orphans temporary files left, $mixed times -o and --json from different runs"
  exit 0
fi
echo "ci_interrupts: $n kills (one run ${dur_ms} ms): $before ended before writing, $during while writing, $finished finished first; no temporary file, -o and --json always one run's"
