#!/usr/bin/env bash
# Compares teraio builds' planners on the GPU runs' own profiles. Each trace is planned with
# --search at that run's planner budget and probed link (its plan-*.json.xz, read by
# bench/recorded_plan_args.py) by every build given, and the plan is simulated; one row per trace:
# ms per iteration for each build, and the change of the last against the first.
#
# Usage: bash bench/planner_regress.sh [TERAIO ...]   (repo root; default build/bin/teraio)
# Knobs (environment):
#   TRACES=h200 (default): the H200 profiles of 2026-12-04d and -05 (recompute/ and real/), their
#           autocast copies marked recomputable as the recorder marks them now
#           (bench/mark_autocast_copies.py), as bench/predict_autocast_copies.sh does;
#   TRACES=all: every recorded GPU profile that has its plan (the H200 calls of 2026-12-04 to -05,
#           the H100 calls of 2026-12-06), as recorded;
#   TRACES=recent: the profiles of the H200's session 40 and the H100's sessions 42-46 (autocast,
#           steps in backward, llama-1b and llama-3b), as recorded.
#   FILTER=REGEX  the traces whose path matches it.
#   ITERATIONS=N  simulated iterations (default 8).
#   PLAN_ARGS     `teraio plan` options added to the last build's plans only (e.g. "--deep-recompute").
#   ALL_PLAN_ARGS options added to every build's plans (a Session's: "--deep-recompute --writebacks").
#   REPLAY=own (default): each build simulates its own plan; REPLAY=last: every plan is replayed by
#           the last build's simulator, so that a change to the simulator's model applies to all.
#   CACHE=DIR     keeps the prepared traces between runs (default /tmp/planner-regress-cache-$TRACES).
# An A/B of a Session's plan search across builds: TRACES=all ALL_PLAN_ARGS="--deep-recompute
# --writebacks" REPLAY=last ITERATIONS=20 bash bench/planner_regress.sh A/bin/teraio B/bin/teraio
set -euo pipefail
[ $# -gt 0 ] || set -- build/bin/teraio
TRACES=${TRACES:-h200}
case "$TRACES" in h200|all|recent) ;; *) echo "TRACES must be h200, all or recent, got '$TRACES'" >&2; exit 2 ;; esac
case "${REPLAY:-own}" in own|last) ;; *) echo "REPLAY must be own or last, got '$REPLAY'" >&2; exit 2 ;; esac
CACHE=${CACHE:-/tmp/planner-regress-cache-$TRACES}; mkdir -p "$CACHE"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
shopt -s nullglob globstar
if [ "$TRACES" = h200 ]; then
  files=(bench/results/h200-2026-12-04d/call*/{recompute,real}/trace-*.json.xz
         bench/results/h200-2026-12-05/call*/{recompute,real}/trace-*.json.xz)
elif [ "$TRACES" = recent ]; then
  files=(bench/results/h200-2026-12-06-s40/*/r*/res_*/trace-*.json.xz
         bench/results/h100-2026-12-07-s4*/**/trace-*.json.xz)
else
  files=(bench/results/h200-2026-12-0[45]*/call*/{recompute,real}/trace-*.json.xz
         bench/results/h100-2026-12-06*/r*/res_*/trace-*.json.xz
         bench/results/h100-2026-12-06*/call*/res_*/trace-*.json.xz)
fi
last_build=${*: -1}
printf '%-64s' trace; for t in "$@"; do printf ' %12s' "$(basename "$(dirname "$(dirname "$t")")")"; done
[ $# -gt 1 ] && printf ' %8s' change; echo
for f in "${files[@]}"; do
  [[ -z "${FILTER:-}" || "$f" =~ $FILTER ]] || continue
  b=$(basename "$f" .json.xz); p=$(dirname "$f")/plan-${b#trace-}.json.xz
  [ -e "$p" ] || continue
  key=$(echo "$f" | sed 's|bench/results/||; s|/|_|g; s|\.json\.xz||')
  if [ ! -e "$CACHE/$key.args" ]; then
    xz -dc "$f" > "$W/t.json"; xz -dc "$p" > "$W/p.json"
    if [ "$TRACES" = h200 ]; then
      python3 bench/mark_autocast_copies.py "$W/t.json" "$CACHE/$key.json" >/dev/null
    else
      mv "$W/t.json" "$CACHE/$key.json"
    fi
    python3 bench/recorded_plan_args.py "$W/p.json" > "$CACHE/$key.args"
  fi
  read -r budget tier < "$CACHE/$key.args"
  printf "%-64s" "${key:0:64}"
  first=""; last=""
  for T in "$@"; do
    extra="${ALL_PLAN_ARGS:-}"; [ "$T" = "$last_build" ] && extra="$extra ${PLAN_ARGS:-}"
    sim=$T; [ "${REPLAY:-own}" = last ] && sim=$last_build
    # shellcheck disable=SC2086
    "$T" plan "$CACHE/$key.json" --budget "${budget}B" --tier "$tier" --search $extra -o "$W/q.json" >/dev/null
    ms=$("$sim" simulate "$CACHE/$key.json" "$W/q.json" --iterations "${ITERATIONS:-8}" --json |
         python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["iteration_us"]/1e3))')
    printf ' %12s' "$ms"; first=${first:-$ms}; last=$ms
  done
  [ $# -gt 1 ] && python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(' %+7.2f%%' % (100*(b/a-1)), end='')" "$first" "$last"
  echo
done
