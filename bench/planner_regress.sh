#!/usr/bin/env bash
# Compares teraio builds' planners on the H200 runs' own profiles: each trace under
# bench/results/h200-2026-12-04d/call*/ and h200-2026-12-05/call*/ (recompute/ and real/), its
# autocast copies marked recomputable as the recorder marks them now (bench/mark_autocast_copies.py),
# planned with --search at that run's planner budget and measured link (its plan-*.json.xz) and
# simulated 8 iterations, as bench/predict_autocast_copies.sh does. Prints one row per trace: the
# iteration in ms for each build, and the change of the last against the first.
# Usage: bash bench/planner_regress.sh [TERAIO ...]   (repo root; default build/bin/teraio)
#        FILTER=REGEX limits the traces; CACHE=DIR keeps the prepared traces between runs;
#        PLAN_ARGS adds `teraio plan` options to the last build's plans (e.g. "--deep-recompute").
set -euo pipefail
[ $# -gt 0 ] || set -- build/bin/teraio
CACHE=${CACHE:-/tmp/planner-regress-cache}; mkdir -p "$CACHE"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
printf '%-58s' trace; for t in "$@"; do printf ' %12s' "$(basename "$(dirname "$(dirname "$t")")")"; done
[ $# -gt 1 ] && printf ' %8s' change; echo
for f in bench/results/h200-2026-12-04d/call*/{recompute,real}/trace-*.json.xz \
         bench/results/h200-2026-12-05/call*/{recompute,real}/trace-*.json.xz; do
  [ -e "$f" ] || continue
  [[ -z "${FILTER:-}" || "$f" =~ $FILTER ]] || continue
  b=$(basename "$f" .json.xz); p=$(dirname "$f")/plan-${b#trace-}.json.xz
  key=$(echo "$f" | sed 's|bench/results/h200-||; s|/|_|g; s|\.json\.xz||')
  if [ ! -e "$CACHE/$key.args" ]; then
    xz -dc "$f" > "$W/t.json"; xz -dc "$p" > "$W/p.json"
    python3 bench/mark_autocast_copies.py "$W/t.json" "$CACHE/$key.json" >/dev/null
    python3 bench/recorded_plan_args.py "$W/p.json" > "$CACHE/$key.args"
  fi
  read -r budget tier < "$CACHE/$key.args"
  printf "%-58s" "${key#2026-12-}"
  first=""; last=""
  for T in "$@"; do
    extra=""; [ "$T" = "${@: -1}" ] && extra=${PLAN_ARGS:-}
    # shellcheck disable=SC2086
    "$T" plan "$CACHE/$key.json" --budget "${budget}B" --tier "$tier" --search $extra -o "$W/q.json" >/dev/null
    ms=$("$T" simulate "$CACHE/$key.json" "$W/q.json" --iterations 8 --json |
         python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["iteration_us"]/1e3))')
    printf ' %12s' "$ms"; first=${first:-$ms}; last=$ms
  done
  [ $# -gt 1 ] && python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(' %+7.2f%%' % (100*(b/a-1)), end='')" "$first" "$last"
  echo
done
