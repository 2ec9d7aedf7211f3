#!/usr/bin/env bash
# Session 36's device calls (issue 16; docs/benchmarks.md "The 8B, Ideal at batch 2 and fp32 at
# 1 x 4096"), on an H200 (the Llama-3-8B shape does not fit an H100's 80 GB):
#   8b:   Ideal of the 8B in autocast at batch 2 x 2048 (fused AdamW: does a larger batch fit
#         without offloading, and how much faster per token), then teraio on the 8B in autocast at
#         4 x 2048 with steps in backward as a user gets it (HostTier("96GiB"), budget 110 GiB, no
#         bandwidth given, the Session's defaults): the step, the Session's prediction, and one
#         profiled step after the measured ones (TIMELINE=1: where the GPU waits). 9 warm-up steps
#         (WARMUP): 2 profiled, 3 planned, 3 on trial for a plan made again for the host, 1 more.
#   8b-teraio: the teraio run alone.
#   fp32: the paper's regime, the 8B in fp32 at 1 x 4096 (math attention), host + disk tiers, steps
#         in backward; then the largest model predicted to fit (REAL_LAYERS_INBWD layers, steps in
#         backward, host tier) when LARGEST=1.
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/h200_call36.sh 8b|8b-teraio|fp32
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 ||
  { echo "h200_call36.sh: needs an H200 (this is $(nvidia-smi --query-gpu=name --format=csv,noheader))"; exit 2; }
case ${1:?usage: bench/h200_call36.sh 8b|8b-teraio|fp32} in
8b)
  bash bench/h200_run.sh real ideal-8b-amp-b2-fused > /dev/null 2>&1
  WARMUP=${WARMUP:-9} TIMELINE=1 bash bench/h200_run.sh real teraio-host-inbwd-8b-amp > /dev/null 2>&1
  ;;
8b-teraio)  # the teraio run alone (Ideal at batch 2 and 4: bench/ideal_8b_batches.sh)
  WARMUP=${WARMUP:-9} TIMELINE=1 bash bench/h200_run.sh real teraio-host-inbwd-8b-amp > /dev/null 2>&1
  ;;
fp32)
  bash bench/h200_run.sh real teraio-inbwd-hostdisk-8b-fp32-s4096 > /dev/null 2>&1
  [[ ${LARGEST:-0} == 1 ]] && bash bench/h200_run.sh real largest-inbwd > /dev/null 2>&1
  ;;
esac
grep -h -E '^== |mean .* s/step|FAILED|rc=|Error|error' "$OUT"/log_*.txt | cut -c1-240
for f in "$OUT"/res_real/*.json; do [[ -e $f ]] && python3 bench/run_summary.py "$f"; done
true
