#!/usr/bin/env bash
# Session 50's device calls, one part per call (< 10 min):
#   first  on an H200 the 8B as a user runs it with today's planner (bench/call49.sh first); on any
#          other GPU the host cost of the CUDA calls a transfer makes (bench/cuda_api_cost.cpp, about
#          10 s) then the llama-3b autocast runs at 1/2 (bench/call47b.sh: the default twice and the
#          search inside the step once, MODES), whose trials now time steps on the GPU and whose
#          stats report measured_step_us (bench/run_summary.py prints it as "Session measured").
#   api    the CUDA calls' host cost alone.
# Usage (repo root on the GPU machine, build-gpudeps/ carried, .whl/ too for call49's peers):
#   bash bench/call50.sh first|api      Results under $OUT (the runs tarred one file each).
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
api() {
  nvcc -O2 -std=c++20 bench/cuda_api_cost.cpp -o /tmp/cuda_api_cost && /tmp/cuda_api_cost 2000 | tee "$OUT/cuda_api_cost.txt"
}
case ${1:?usage: bench/call50.sh first|api} in
api) api ;;
first)
  if [[ $gpu == *H200* ]]; then
    bash bench/call49.sh first
  else
    api
    MODES=${MODES:-"peak bgoff peak.2"} STOP_AFTER_S=${STOP_AFTER_S:-420} bash bench/call47b.sh 2
  fi ;;
*) echo "bench/call50.sh: unknown part $1"; exit 2 ;;
esac
true
