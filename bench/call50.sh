#!/usr/bin/env bash
# Session 50's device calls, one part per call (< 10 min):
#   first  on an H200 the 8B as a user runs it with today's planner; on any other GPU the host cost
#          of the CUDA calls a transfer makes (bench/cuda_api_cost.cpp, about 10 s), then the
#          llama-3b autocast runs at 1/2, the default twice and the search inside the step once
#          (MODES; bench/call49.sh first does the rest, as it did for session 49). Their trials now
#          time steps on the GPU and their stats report measured_step_us, controller_us and
#          submit_us (bench/run_summary.py prints them).
#   api    the CUDA calls' host cost alone.
# Usage (repo root on the GPU machine, build-gpudeps/ carried, .whl/ too for call49's peers):
#   bash bench/call50.sh first|api      Results under $OUT (the runs tarred one file each).
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
api() {
  nvcc -O2 -std=c++20 bench/cuda_api_cost.cpp -o /tmp/cuda_api_cost && /tmp/cuda_api_cost 2000 | tee "$OUT/cuda_api_cost.txt"
}
case ${1:?usage: bench/call50.sh first|api} in
api) api ;;
first)
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || api
  MODES=${MODES:-"peak bgoff peak.2"} STOP_AFTER_S=${STOP_AFTER_S:-420} bash bench/call49.sh first ;;
*) echo "bench/call50.sh: unknown part $1"; exit 2 ;;
esac
true
