#!/usr/bin/env bash
# Session 44's last device call (issue 15): llama-1b in bf16 autocast at FRACS (default 2: half
# the H200's Ideal footprint), steps in backward, host tier with no bandwidth given, with the
# per-parameter AdamW loop the benchmarks used so far (`--adamw loop`: about ten operators per
# parameter update) and with the fused AdamW (`--adamw fused`: one `_fused_adamw_` per update), same
# machine, WARMUP warm-up steps (default 12), 3 measured; one run each (bench/call37.sh, REPEATS=1).
# Replays of the H100 traces show the 1/2 step bound by the host's launches, a third of which are
# the loop's optimizer operators.
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call44.sh
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
OUT=$OUT/fused WARMUP=${WARMUP:-12} REPEATS=1 MODES="step-in-backward+adamw=fused step-in-backward" \
  bash bench/call37.sh "${FRACS:-2}"
true
