#!/usr/bin/env bash
# Session 32's device call for the next session (docs/benchmarks.md, "Host time per operator in
# planned steps" and "Recompute chains, writebacks and the peers with checkpointing on the H200"):
# (1) llama-1b autocast at 1/2 and 1/4 with steps in backward, alone and with deep chains and
# writebacks: their host time per step (stats()["hook_us"]) after the engine stopped sweeping every
# tensor before each operator's reads (call 2 of 2026-12-05b: 69-202 ms), and the Session's
# prediction now that traces carry host times (the simulator's host lane; call 2: 22-31% fast);
# (2) teraio at the GPU memory FSDP2 + CPUOffloadPolicy with activation checkpointing took for
# llama-1b fp32 (4,410,952,192 B, below the parameters' 4.6 GiB), steps in backward, which failed
# before the watched parameters were tracked from the first step's start (Note [Adopted tensors]).
# Results: $OUT/h200_recompute.tgz (with a torch.profiler timeline of one step after each run),
# $OUT/h200_call32.tgz, logs; rows with bench/results_table.py.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
FOOTPRINT_llama_1b_amp=25516927488 RC_DTYPES=amp RC_FRACS="2 4" TIMELINE=1 \
  RC_MODES="step-in-backward step-in-backward+deep-recompute+writebacks" bash bench/h200_run.sh recompute > /dev/null 2>&1
R=$OUT/res_call32
mkdir -p "$R"
(
  source bench/h200_env.sh
  ensure_teraio > /dev/null || exit 1
  timeout --signal=INT --kill-after=10 150 $PY bench/llm_bench.py --steps 3 --system teraio --model llama-1b \
    --tiers host --budget 4410952192B --host-gbps 0 --adamw loop --step-in-backward \
    --out "$R/teraio-step-in-backward-at-fsdp2-offload-ac-llama-1b.json" \
    --trace-out "$R/trace-step-in-backward-at-fsdp2-offload-ac-llama-1b.json" \
    --plan-out "$R/plan-step-in-backward-at-fsdp2-offload-ac-llama-1b.json" > "$OUT/log_call32.txt" 2>&1
  tar czf "$OUT/h200_call32.tgz" -C "$R" .
)
grep -h -E '^== |mean .* s/step|FAILED|rc=' "$OUT"/log_*.txt | cut -c1-220
python3 bench/run_summary.py "$OUT"/res_*/teraio-*.json
