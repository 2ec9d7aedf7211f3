#!/usr/bin/env bash
# Session 31's last device call (docs/benchmarks.md): on an H200, the Llama-3-8B shape in autocast at
# 110 GiB with steps in backward, deep recompute chains and writebacks (issue 16's first workload),
# the CUDA bitwise checks of bench/torch_gpu.py with deep chains and writebacks on, then llama-1b
# autocast at 1/4 with and without them (issue 15); on an H100 (where the 8B's budget does not fit)
# the bitwise checks, then llama-1b autocast at 1/4 and 1/2 with deep chains and writebacks.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
bitwise() {
  ( source bench/h200_env.sh && ensure_teraio > /dev/null &&
    TERAIO_DEEP_RECOMPUTE=1 TERAIO_WRITEBACKS=1 TORCH_GPU_BITWISE_ONLY=1 TORCH_GPU_CASES=llama,llama-amp,llama-amp-inbwd \
      timeout 150 $PY bench/torch_gpu.py "$OUT/torch_gpu_deep_wb.json" > "$OUT/log_torch_gpu.txt" 2>&1
    echo "torch_gpu rc=$?" >> "$OUT/log_torch_gpu.txt" )
}
if [[ ${SHORT:-0} == 1 ]]; then  # SHORT=1: the bitwise checks and llama-1b at 1/4 with both, alone
  bitwise
  fracs=4 modes="step-in-backward+deep-recompute+writebacks"
elif nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TERAIO_DEEP_RECOMPUTE=1 TERAIO_WRITEBACKS=1 bash bench/h200_run.sh real teraio-host-inbwd-8b-amp > /dev/null 2>&1
  bitwise
  fracs=4 modes="step-in-backward+deep-recompute+writebacks step-in-backward"
else
  bitwise
  fracs="4 2" modes="step-in-backward+deep-recompute+writebacks"
fi
FOOTPRINT_llama_1b_amp=25516927488 RC_DTYPES=amp RC_FRACS="$fracs" RC_MODES="$modes" \
  bash bench/h200_run.sh recompute > /dev/null 2>&1
grep -h -E '^== |mean .* s/step|FAILED|rc=' "$OUT"/log_*.txt | cut -c1-220
grep -h -o -E '^[a-z-]+ \{"equal": [a-z]+|"(error|writebacks|recomputes)": [^,]*' "$OUT/log_torch_gpu.txt" 2>/dev/null
