#!/usr/bin/env bash
# Compares two teraio builds' plan searches on recorded GPU runs, each planned as its Session planned
# it: the run's profile (trace-*.json.xz next to its llm_bench result) with host times scaled by the
# run's stats()["host_time_scale"], `teraio plan --search --deep-recompute --writebacks` at the run's
# planner budget and probed link (its plan-*.json.xz, bench/recorded_plan_args.py) with
# --runner-host-us the run's runner_host_us_per_operator, then replayed by the second build's
# simulator (--iterations 6, the same runner time and --recompute-host-us the run's
# recompute_host_us_per_step). bench/planner_regress.sh plans the profiles as recorded instead,
# whose host times (before the Session's scale) often make the replay host-bound and hide a change.
#
# Usage: bash bench/session_plan_ab.sh OLD_TERAIO NEW_TERAIO RESULT.json ...
#   e.g. bash bench/session_plan_ab.sh /tmp/old/bin/teraio build/bin/teraio \
#          bench/results/h100-2026-12-07-s48/ab/*/res_recompute/teraio-*.json
# One line per run: its folder, its name, the host scale, ms per step by each build, the change.
set -u
cd "$(dirname "$0")/.."
A=${1:?usage: bench/session_plan_ab.sh OLD_TERAIO NEW_TERAIO RESULT.json ...}
B=${2:?usage: bench/session_plan_ab.sh OLD_TERAIO NEW_TERAIO RESULT.json ...}
shift 2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for res in "$@"; do
  d=$(dirname "$res"); b=$(basename "$res" .json); key=${b#teraio-}
  tr=$(ls "$d"/trace-*"$key".json.xz 2>/dev/null | head -1); pl=$(ls "$d"/plan-*"$key".json.xz 2>/dev/null | head -1)
  [[ -n $tr && -n $pl ]] || { echo "$res: no trace or plan next to it, skipped" >&2; continue; }
  xz -dc "$tr" > "$W/t.json"; xz -dc "$pl" > "$W/p.json"
  read -r scale runner rch < <(python3 - "$res" "$W/t.json" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))["system_info"]["stats"]
s = st.get("host_time_scale") or 1.0
t = json.load(open(sys.argv[2]))
for k in t["kernels"]:
    if "host_us" in k:
        k["host_us"] *= s
json.dump(t, open(sys.argv[2], "w"))
print(s, st.get("runner_host_us_per_operator", 0), st.get("recompute_host_us_per_step", 0))
PY
)
  read -r budget tier < <(python3 bench/recorded_plan_args.py "$W/p.json")
  row=()
  for T in "$A" "$B"; do
    "$T" plan "$W/t.json" --budget "${budget}B" --tier "$tier" --search --deep-recompute --writebacks \
      --runner-host-us "$runner" -o "$W/q.json" > /dev/null
    row+=("$("$B" simulate "$W/t.json" "$W/q.json" --iterations 6 --runner-host-us "$runner" \
      --recompute-host-us "$rch" --json | python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["iteration_us"]/1e3))')")
  done
  python3 -c 'import sys; d,k,s,a,b = sys.argv[1:]; print(f"{d} {k} x{float(s):.2f} {a} {b} {100*(float(b)/float(a)-1):+.2f}%")' \
    "${d#bench/results/}" "$key" "$scale" "${row[0]}" "${row[1]}"
done
