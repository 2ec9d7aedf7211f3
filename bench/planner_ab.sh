#!/usr/bin/env bash
# A/B of two teraio builds' plan search on every recorded GPU profile that has its plan (the H200
# calls of 2026-12-04 to -05 and the H100 calls of 2026-12-06 under bench/results/): each trace is
# planned as a Session plans it (`--search --deep-recompute --writebacks`, at that run's planner
# budget and probed link, bench/recorded_plan_args.py) by both builds, and both plans are replayed
# by the second build's simulator over 20 iterations (so that a change to the simulator's model is
# applied to both). Prints one row per trace: ms per iteration for A and B, and B's change.
# Usage: bash bench/planner_ab.sh A/bin/teraio B/bin/teraio [REGEX]   (repo root; REGEX filters traces)
#        CACHE=DIR keeps the unpacked traces between runs.
set -euo pipefail
A=${1:?usage: bench/planner_ab.sh A B [REGEX]} B=${2:?usage: bench/planner_ab.sh A B [REGEX]}
CACHE=${CACHE:-/tmp/planner-ab-cache}; mkdir -p "$CACHE"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
shopt -s nullglob
for f in bench/results/h200-2026-12-0[45]*/call*/{recompute,real}/trace-*.json.xz \
         bench/results/h100-2026-12-06*/r*/res_*/trace-*.json.xz bench/results/h100-2026-12-06*/call*/res_*/trace-*.json.xz; do
  b=$(basename "$f" .json.xz); p=$(dirname "$f")/plan-${b#trace-}.json.xz
  [ -e "$p" ] || continue
  key=$(echo "$f" | sed 's|bench/results/||; s|/|_|g; s|\.json\.xz||')
  [[ -z "${3:-}" || "$key" =~ $3 ]] || continue
  if [ ! -e "$CACHE/$key.args" ]; then
    xz -dc "$f" > "$CACHE/$key.json"; xz -dc "$p" > "$W/p.json"
    python3 bench/recorded_plan_args.py "$W/p.json" > "$CACHE/$key.args"
  fi
  read -r budget tier < "$CACHE/$key.args"
  row=()
  for T in "$A" "$B"; do
    "$T" plan "$CACHE/$key.json" --budget "${budget}B" --tier "$tier" --search --deep-recompute --writebacks \
      -o "$W/q.json" > /dev/null
    row+=("$("$B" simulate "$CACHE/$key.json" "$W/q.json" --iterations 20 --json |
             python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["iteration_us"]/1e3))')")
  done
  python3 -c "import sys; k,a,b=sys.argv[1:]; print('%-72s %9s %9s %+7.2f%%' % (k[:72], a, b, 100*(float(b)/float(a)-1)))" \
    "$key" "${row[0]}" "${row[1]}"
done
