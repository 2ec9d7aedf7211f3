#!/usr/bin/env bash
# bench/largest_model.sh finds the boundary: the largest layer count it reports plans under the
# budget and tiers given, and one more layer does not (checked with teraio synth + plan directly).
# Usage: largest_model_check.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1/teraio
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cfg=(MODEL=tiny DTYPE=fp32 BATCH=1 SEQ=32 BUDGET=1MiB "TIERS=host:4MiB:1:1" MIN=1 MAX=64 "TERAIO=$bin")
out=$(env "${cfg[@]}" bash "$src/bench/largest_model.sh" 2>/dev/null) || { echo "FAIL: largest_model.sh exited $?"; echo "$out"; exit 1; }
n=$(printf '%s\n' "$out" | sed -n 's/^largest: layers \([0-9]*\):.*/\1/p')
[[ -n $n ]] || { echo "FAIL: no 'largest: layers N' line in:"; echo "$out"; exit 1; }
plans() {  # plans $1 layers: 0 when the planner fits it
  "$bin" synth --model tiny --layers "$1" --batch 1 --seq 32 --micro-batches 1 --grad-set-to-none \
    -o "$work/t.json" >/dev/null &&
    "$bin" plan "$work/t.json" --budget 1MiB --session-budget --tier host:4MiB:1:1 --search -o "$work/p.json" >/dev/null 2>&1
}
plans "$n" || { echo "FAIL: $n layers reported as the largest but does not plan"; exit 1; }
if plans $((n + 1)); then echo "FAIL: $((n + 1)) layers plans too; $n is not the largest"; exit 1; fi
((n > 1 && n < 64)) || { echo "FAIL: the boundary ($n) should lie inside [1, 64] for this check to mean anything"; exit 1; }
echo "largest_model.sh: $n layers is the largest that plans (tiny width, 1 MiB budget, 4 MiB host tier)"
