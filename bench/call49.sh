#!/usr/bin/env bash
# Session 49's device calls (issue 16 on an H200; issue 15 elsewhere), one part per call (< 10 min):
#   first    on an H200 the 8B as a user runs it with today's planner (bench/call43.sh first: HF
#            Llama-3-8B shape, bf16 autocast, 4 x 2048, 110 GiB, HostTier("96GiB"), steps in
#            backward, fused AdamW, 16 warm-up steps); on any other GPU the llama-3b autocast A/B
#            (bench/call47b.sh: with recompute, without across-the-peak settings, without
#            recompute, at 1/2 and 1/4).
#   fsdp2ac  H200: the 8B's peer a user would pick, FSDP2 + CPUOffloadPolicy with activation
#            checkpointing of every decoder layer, same workload (bench/h200_run.sh real fsdp2-ac-8b).
#   dsac     H200: DeepSpeed ZeRO-Offload with activation checkpointing, same workload.
#   fp32     H200: the 8B in fp32 at 1 x 4096 on host + disk (bench/h200_call36.sh fp32).
#   largest  H200: the largest model predicted to fit with steps in backward (REAL_LAYERS_INBWD).
# Usage (repo root on the GPU machine, build-gpudeps/ and .whl/ carried): bash bench/call49.sh PART
# Results under $OUT/PART/ (tar them in the calling command: few files come back).
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
part=${1:?usage: bench/call49.sh first|fsdp2ac|dsac|fp32|largest}
if [[ $gpu != *H200* ]]; then
  [[ $part == first ]] || { echo "call49.sh: part $part needs an H200"; exit 2; }
  OUT=$OUT/ab MODES=${MODES:-"peak nopeak norecompute"} STOP_AFTER_S=${STOP_AFTER_S:-400} bash bench/call47b.sh "2 4"
  exit 0
fi
summaries() {
  grep -h -E '^== |mean .* s/step|FAILED|rc=|Error|error' "$1"/log_*.txt | cut -c1-240
  for f in "$1"/res_real/*.json; do
    [[ $f == */trace-* || $f == */plan-* || $f == */timeline-* ]] || python3 bench/run_summary.py "$f"
  done
}
case $part in
first) OUT=$OUT/first bash bench/call43.sh first ;;
fsdp2ac) OUT=$OUT/fsdp2ac bash bench/h200_run.sh real fsdp2-ac-8b > /dev/null 2>&1; summaries "$OUT"/fsdp2ac ;;
dsac) OUT=$OUT/dsac bash bench/h200_run.sh real ds-offload-ac-8b > /dev/null 2>&1; summaries "$OUT"/dsac ;;
fp32) OUT=$OUT/fp32 bash bench/h200_call36.sh fp32 ;;
largest) OUT=$OUT/largest bash bench/h200_run.sh real largest-inbwd > /dev/null 2>&1; summaries "$OUT"/largest ;;
esac
xz -T0 -f "$OUT"/*/res_real/trace-*.json "$OUT"/*/res_real/plan-*.json 2>/dev/null
echo "part $part done"
true
