#!/usr/bin/env bash
# Predicted step time with and without optimizer steps in backward (docs/pytorch.md, "Optimizer
# steps in backward"; docs/benchmarks.md, "Optimizer steps in backward, predicted"): `teraio synth`
# (with and without --step-in-backward) + `teraio plan --search --session-budget` + `teraio
# simulate --iterations 8`, no GPU. Each case is the shape a bench/h200_run.sh run trains, the
# budget what its Session is given, the host link as the Session's probe measured it on the H200.
# Usage: bash bench/predict_step_in_backward.sh [TERAIO_BIN] (default build/bin/teraio)
# Env: LINK (host tier spec, default host:96GiB:54.5:54.5:49), WORK (scratch dir, default a temp dir)
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
printf '| %-20s | %-12s | %-12s | %-8s |\n' case "after (ms)" "in bwd (ms)" change
for c in "${cases[@]}"; do
  IFS='|' read -r name opts budget <<<"$c"
  declare -A ms=()
  for mode in after inbwd; do
    flag=""; [[ $mode == inbwd ]] && flag=--step-in-backward
    base=$(tr " /" "__" <<<"$name"); trace="$WORK/$base-$mode.json"; plan="$WORK/$base-$mode.plan.json"
    # shellcheck disable=SC2086
    "$T" synth $opts --micro-batches 1 --grad-set-to-none $flag -o "$trace" >/dev/null
    "$T" plan "$trace" --budget "$budget" --session-budget --tier "$LINK" --search -o "$plan" >/dev/null
    ms[$mode]=$("$T" simulate "$trace" "$plan" --iterations 8 --json | python3 -c \
      'import json,sys; print("%.1f" % (json.load(sys.stdin)["iteration_us"] / 1e3))')
  done
  printf '| %-20s | %12s | %12s | %+7.1f%% |\n' "$name" "${ms[after]}" "${ms[inbwd]}" \
    "$(python3 -c "print(100 * (${ms[inbwd]} / ${ms[after]} - 1))")"
done
