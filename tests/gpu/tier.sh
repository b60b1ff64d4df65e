#!/bin/bash
# The GPU tier and issue 37's measurements, as one prepared run, on a machine where
# pyspec is built against a CUDA llama-cpp-python (docs/gpu.md; ../shared/gpu/run.sh
# does it on a bare machine) and $T, $D name the target and draft GGUF files
# (random-weight files of the default shapes serve: ../shared/gpu/mkmodels.py).
# usage: T=target.gguf D=draft.gguf OUT=results bash tests/gpu/tier.sh [STAGE...]
# Each stage runs under a time cap; its output goes to $OUT/STAGE.log and its
# last lines to stdout. Stages: crash clocks pit probe memory bench (default: all).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
: "${T:?T must name the target GGUF}" "${D:?D must name the draft GGUF}"
stage() {
  local name=$1 cap=$2 rc s
  shift 2
  echo "== $name (cap ${cap}s)"
  s=$(date +%s)
  timeout -k 5 "$cap" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "rc=$rc $(( $(date +%s) - s ))s"
  tail -n 12 "$OUT/$name.log"
}
STAGES=("$@")
has() { [ ${#STAGES[@]} -eq 0 ] || [[ " ${STAGES[*]} " == *" $1 "* ]]; }

# Which process state makes a GPU model load crash (issue 37, item 2).
has crash && stage crash 150 python3 tests/gpu/load_crash_probe.py "$T"
# Goal 1: calibrated V(n) within 10 % of a synchronised direct measurement.
has clocks && stage clocks 120 python3 tests/gpu/clock_check.py "$T"
# Goal 3: the lossless proofs offloaded, with their controls (tests/test_pit_lossless.py).
has pit && stage pit 600 env PYSPEC_GPU_TARGET="$T" PYSPEC_GPU_DRAFT="$D" \
  python3 -m pytest -m gpu -p no:cacheprovider -q -s -rs tests/test_pit_lossless.py
# Acceptance against draft length: numerics or state (item 4).
has probe && stage probe 240 python3 tests/gpu/self_draft_probe.py "$T"
# Goal 2: a repeated request from memory >= 4x plain; the default decoder against plain.
has memory && stage memory 240 python3 tests/gpu/memory_speed.py "$T" "$D"
# Goal 2: the default decoder never below 0.97x plain on the bench set (paired).
has bench && stage bench 600 pyspec bench paired --model "$T" --draft "$D" --n-gpu-layers -1 --paired plain,default \
  --reps 4 --per-category 2 --max-tokens 128 --json "$OUT/bench.json"
