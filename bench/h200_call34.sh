#!/usr/bin/env bash
# Session 34's device calls (docs/benchmarks.md, "Inputs kept for a recompute"):
#   fp32: llama-1b fp32, 4 x 1024, steps in backward, at the GPU memory FSDP2 + CPUOffloadPolicy
#         with activation checkpointing took (4,410,952,192 B), alone and with deep chains and
#         writebacks: the plans now recompute math attention's probabilities from their kept q, k
#         and v (Note [Inputs kept for a recompute]); FSDP2 with checkpointing again on the same
#         machine; then the CUDA bitwise checks
#         (TORCH_GPU_BITWISE_ONLY=1 bench/torch_gpu.py) with the new plans.
#   amp:  llama-1b in bf16 autocast at 1/2 and 1/4 with steps in backward, alone and with deep
#         chains and writebacks, one profiled step each (TIMELINE=1): host time per step and the
#         Session's predictions with its own host time (session 33); 6 warm-up steps (WARMUP), so
#         that the plan is made again for the planned steps' host times before the measured ones.
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/h200_call34.sh fp32|amp
#   (fp32 with DEEP=0 and BITWISE=0: the plain plan and FSDP2 alone, a short call; REPEATS=3: each
#   teraio run three times, for the spread between runs; PEER=0: without FSDP2)
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
part=${1:?usage: bench/h200_call34.sh fp32|amp}
source bench/h200_env.sh
ensure_teraio_logged "$OUT/log_install.txt"
tail -1 "$OUT/log_install.txt"
case $part in
fp32)
  R=$OUT/res_fp32
  mkdir -p "$R"
  # DEEP=0: the plain plan alone; BITWISE=0: no bitwise checks (a short call)
  modes=("")
  [[ ${DEEP:-1} == 1 ]] && modes+=("--deep-recompute --writebacks")
  # REPEATS=N: each mode N times (each run profiles, plans and measures anew; names end in -rI)
  for run in $(seq 1 "${REPEATS:-1}"); do
  for mode in "${modes[@]}"; do
    n=step-in-backward${mode:+-deep-wb}$( ((${REPEATS:-1} > 1)) && echo "-r$run")
    echo "== $(date -u +%T) $n at FSDP2's memory" | tee -a "$OUT/log_fp32.txt"
    # shellcheck disable=SC2086
    timeout --signal=INT --kill-after=10 150 $PY bench/llm_bench.py --steps 3 --system teraio --model llama-1b \
      --tiers host --budget 4410952192B --host-gbps 0 --adamw loop --step-in-backward $mode \
      --out "$R/teraio-$n-at-fsdp2-offload-ac-llama-1b.json" \
      --trace-out "$R/trace-$n-at-fsdp2-offload-ac-llama-1b.json" \
      --plan-out "$R/plan-$n-at-fsdp2-offload-ac-llama-1b.json" >> "$OUT/log_fp32.txt" 2>&1
    echo "rc=$?" >> "$OUT/log_fp32.txt"
  done
  done
  # the peer on the same machine (the card may not be call 3's H200); PEER=0 leaves it out
  if [[ ${PEER:-1} == 1 ]]; then
    echo "== $(date -u +%T) fsdp2-offload-ac" | tee -a "$OUT/log_fp32.txt"
    timeout --signal=INT --kill-after=10 120 $PY bench/llm_bench.py --steps 3 --system fsdp2-offload --model llama-1b \
      --grad-ckpt --out "$R/fsdp2-offload-ac-llama-1b.json" >> "$OUT/log_fp32.txt" 2>&1
    echo "rc=$?" >> "$OUT/log_fp32.txt"
  fi
  if [[ ${BITWISE:-1} == 1 ]]; then
    echo "== $(date -u +%T) bitwise" | tee -a "$OUT/log_fp32.txt"
    TORCH_GPU_BITWISE_ONLY=1 timeout 200 $PY bench/torch_gpu.py "$OUT/torch_gpu_bitwise.json" > "$OUT/log_torch_gpu.txt" 2>&1
    echo "rc=$?" >> "$OUT/log_torch_gpu.txt"
    tail -15 "$OUT/log_torch_gpu.txt"
  fi
  ;;
amp)
  WARMUP=${WARMUP:-6} FOOTPRINT_llama_1b_amp=25516927488 RC_DTYPES=amp RC_FRACS="2 4" TIMELINE=1 \
    RC_MODES="step-in-backward step-in-backward+deep-recompute+writebacks" bash bench/h200_run.sh recompute > /dev/null 2>&1
  ;;
esac
xz -T0 -f "$OUT"/res_*/trace-*.json "$OUT"/res_*/plan-*.json 2>/dev/null
grep -h -E '^== |mean .* s/step|FAILED|rc=|Error' "$OUT"/log_*.txt | cut -c1-220
python3 bench/run_summary.py "$OUT"/res_*/fsdp2-*.json "$OUT"/res_*/teraio-*.json
