#!/usr/bin/env bash
# Predicted step time with and without optimizer steps in backward (docs/pytorch.md, "Optimizer
# steps in backward"; docs/benchmarks.md, "Optimizer steps in backward, predicted"), no GPU:
# 1. synthetic: `teraio synth` (with and without --step-in-backward) + `teraio plan --search
#    --session-budget` + `teraio simulate --iterations 8`. Each case is the shape a bench/h200_run.sh
#    run trains, the budget what its Session is given, the host link as the Session's probe measured
#    it on the H200 (LINK).
# 2. profiled: each H200 run's own trace and plan in PROFILES (bench/results), the trace as recorded
#    and as `teraio transform --step-in-backward` rewrites it, both planned (`--search`) with that
#    run's planner budget and measured link (read from its plan) and simulated (8 iterations).
# Usage: bash bench/predict_step_in_backward.sh [TERAIO_BIN] (default build/bin/teraio)
# Env: LINK (host tier spec, default host:96GiB:54.5:54.5:49), WORK (scratch dir, default a temp
# dir), PROFILES (space-separated trace files, .json or .json.xz, each with its plan beside it as
# plan-*; default the H200 runs of bench/results/h200-2026-12-04d)
set -euo pipefail
T=${1:-build/bin/teraio}
LINK=${LINK:-host:96GiB:54.5:54.5:49}
WORK=${WORK:-$(mktemp -d)}
# name | synth options | budget (bytes or size): 1/2 and 1/4 of the measured Ideal footprints
# (bench/h200_run.sh FOOTPRINT_llama_1b_fp32=37540932096, FOOTPRINT_llama_1b_amp=25516927488)
cases=(
  "llama-1b fp32 1/2|--model llama-1b-v32k --batch 4 --seq 1024 --attention math|18770466048B"
  "llama-1b fp32 1/4|--model llama-1b-v32k --batch 4 --seq 1024 --attention math|9385233024B"
  "llama-1b amp 1/2|--model llama-1b-v32k --batch 4 --seq 1024 --dtype amp|12758463744B"
  "llama-1b amp 1/4|--model llama-1b-v32k --batch 4 --seq 1024 --dtype amp|6379231872B"
  "llama-8b amp 110GiB|--model llama3-8b --batch 4 --seq 2048 --dtype amp|110GiB"
)
# predict TRACE PLAN_ARGS...: plans TRACE (--search and the given options) and prints the simulated
# step (mean of 8 iterations) in ms.
predict() {
  local trace=$1; shift
  "$T" plan "$trace" "$@" --search -o "$trace.plan" >/dev/null
  "$T" simulate "$trace" "$trace.plan" --iterations 8 --json | python3 -c \
    'import json,sys; print("%.1f" % (json.load(sys.stdin)["iteration_us"] / 1e3))'
}
# row NAME AFTER_MS INBWD_MS
row() {
  printf '| %-40s | %12s | %12s | %+7.1f%% |\n' "$1" "$2" "$3" "$(python3 -c "print(100 * ($3 / $2 - 1))")"
}
header() { printf '| %-40s | %-12s | %-12s | %-8s |\n' "$1" "after (ms)" "in bwd (ms)" change; }

header case
for c in "${cases[@]}"; do
  IFS='|' read -r name opts budget <<<"$c"
  base=$(tr " /" "__" <<<"$name")
  # shellcheck disable=SC2086
  "$T" synth $opts --micro-batches 1 --grad-set-to-none -o "$WORK/$base.json" >/dev/null
  # shellcheck disable=SC2086
  "$T" synth $opts --micro-batches 1 --grad-set-to-none --step-in-backward -o "$WORK/$base-inbwd.json" >/dev/null
  row "$name" "$(predict "$WORK/$base.json" --budget "$budget" --session-budget --tier "$LINK")" \
    "$(predict "$WORK/$base-inbwd.json" --budget "$budget" --session-budget --tier "$LINK")"
done

echo
echo "profiled (the H200 runs' own traces; planner budget and link as each run's plan records them)"
R=bench/results/h200-2026-12-04d
PROFILES=${PROFILES:-"$R/call3/recompute/trace-recompute-1of4-llama-1b-fp32.json.xz
  $R/call4/recompute/trace-recompute-1of2-llama-1b-amp.json.xz
  $R/call3/recompute/trace-recompute-1of4-llama-1b-amp.json.xz
  $R/call2/recompute/trace-recompute-1of2-llama-3b-fp32.json.xz
  $R/call2/recompute/trace-recompute-1of4-llama-3b-fp32.json.xz
  $R/call4/real/trace-teraio-host-8b-amp.json.xz"}
header trace
for f in $PROFILES; do
  base=$(basename "$f"); base=${base%.xz}; base=${base%.json}
  plan_file="$(dirname "$f")/plan-${base#trace-}.json"; [[ -f $plan_file ]] || plan_file+=.xz
  unpack() { if [[ $1 == *.xz ]]; then xz -dc "$1" > "$2"; else cp "$1" "$2"; fi; }
  unpack "$f" "$WORK/$base.json"
  unpack "$plan_file" "$WORK/$base.recorded-plan.json"
  read -r budget tier < <(python3 bench/recorded_plan_args.py "$WORK/$base.recorded-plan.json" --duplex-default min)
  "$T" transform "$WORK/$base.json" --step-in-backward -o "$WORK/$base-inbwd.json" >/dev/null
  row "${base#trace-}" "$(predict "$WORK/$base.json" --budget "${budget}B" --tier "$tier")" \
    "$(predict "$WORK/$base-inbwd.json" --budget "${budget}B" --tier "$tier")"
done
