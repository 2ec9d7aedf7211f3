#!/usr/bin/env bash
# Predicts what recomputing autocast's weight copies by their cast alone (docs/formats.md, "Recompute":
# recompute_inputs) changes on the H200 runs' own profiles, recorded before the Session marked them:
# each trace as recorded and as bench/mark_autocast_copies.py marks it, planned (--search) with that
# run's planner budget and measured link, simulated 8 iterations; prints both steps in ms.
# Usage: bash bench/predict_autocast_copies.sh (repo root; build/bin/teraio built)
set -euo pipefail
T=${TERAIO:-build/bin/teraio}; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
for f in bench/results/h200-2026-12-04d/call4/real/trace-teraio-host-8b-amp.json.xz \
         bench/results/h200-2026-12-05/call3/real/trace-teraio-host-inbwd-8b-amp.json.xz \
         bench/results/h200-2026-12-04d/call4/recompute/trace-recompute-1of2-llama-1b-amp.json.xz \
         bench/results/h200-2026-12-05/call1/recompute/trace-step-in-backward-1of2-llama-1b-amp.json.xz \
         bench/results/h200-2026-12-04d/call3/recompute/trace-recompute-1of4-llama-1b-amp.json.xz \
         bench/results/h200-2026-12-05/call1/recompute/trace-step-in-backward-1of4-llama-1b-amp.json.xz; do
  b=$(basename $f .json.xz); p=$(dirname $f)/plan-${b#trace-}.json.xz
  xz -dc $f > $W/t.json; xz -dc $p > $W/p.json
  python3 bench/mark_autocast_copies.py $W/t.json $W/m.json >/dev/null
  read -r budget tier < <(python3 bench/recorded_plan_args.py $W/p.json)
  out=""
  for v in t m; do $T plan $W/$v.json --budget ${budget}B --tier $tier --search -o $W/q.json >/dev/null
    out="$out $($T simulate $W/$v.json $W/q.json --iterations 8 --json | python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["iteration_us"]/1e3))')"; done
  echo "$b $out"
done
