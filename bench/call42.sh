#!/usr/bin/env bash
# Session 42's device call, one start for what session 42 could not measure (every start after its
# first two calls was refused; each refused start costs 1-2 minutes of device time): on an H200,
# the Llama-3-8B shape as a user runs it (bench/h200_call36.sh 8b-teraio: reads back modelled,
# offloads and writebacks issued past them, the allocator's waits out of the host times), then the
# llama-1b autocast A/B's default runs at 1/2 and 1/4 (bench/call37.sh); on any other GPU the A/B
# alone. Both with 13 warm-up steps, so that the Session plans again once the host's numbers
# settle (Note [Plans for the host that runs them]: plan_variant ends in "planned again ..., kept: T
# a step against T0" where the plan made again ran faster; stats host_replan_searches). About 8
# minutes on an H200 (the 8B ~5.5, the A/B ~2.5), 3 elsewhere.
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call42.sh
# Results: $OUT/8b/ (the 8B: res_real/, logs) and $OUT/ab/ (r1/res_recompute/), a summary line each.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
if [[ $gpu == *H200* ]]; then
  OUT=$OUT/8b WARMUP=${WARMUP:-13} bash bench/h200_call36.sh 8b-teraio
  xz -T0 -f "$OUT"/8b/res_real/trace-*.json "$OUT"/8b/res_real/plan-*.json \
    "$OUT"/8b/res_real/timeline-*.json 2>/dev/null
fi
OUT=$OUT/ab WARMUP=${WARMUP:-13} REPEATS=1 MODES=step-in-backward bash bench/call37.sh "${FRACS:-2 4}"
true
